package main

// cloud-poller: the poller's rate, queueing to real SQS queues with every AWS
// call delayed by the cloud latency, relative to a raw read of the same feed.
//
// The source holds cloudPollerDocs small documents; the job has three
// outputs (PostgreSQL and S3 on standard queues, HTTP on a FIFO queue).
// Each round runs, in an order rotating from round to round:
//
//   - raw: the plain paging read of core_poller.go (no AWS at all);
//   - sqs 1 output / sqs 3 outputs: the real poller (lease and checkpoints
//     in DynamoDB, real fanout.Sender) to the emulator's queues through
//     the proxy, with only the first output, then all three;
//   - null 1 output / null 3 outputs: the same poller sending to the
//     stand-in SQS (cloud_sqs.go) behind the same latency: what the poller
//     does when SQS keeps up, as it does on AWS (the lease and checkpoints
//     still go to the local DynamoDB through the proxy);
//   - emulator send: the same number of messages per output, sent by one
//     fanout.Sender.Send with no feed at all: the most the emulator queues
//     through the proxy, the ceiling of the sqs variants.
//
// The requests of the sqs variants are counted by the proxy in the first
// round and reported per document.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/fanout"
	"github.com/changes-worker/changes-worker/shared/poll"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
)

const (
	cloudPollerDocs   = 10000
	cloudPollerLimit  = 500
	cloudPollerRounds = 3
)

func cloudPoller(ctx context.Context, r *results) error {
	cw, err := newCloudAWS(*cloudLatencyFlag)
	if err != nil {
		return err
	}
	defer cw.close()
	st, loaded, err := coreLoaded(ctx, func() (*stack.Stack, error) {
		return newCloudStack(ctx, "cp", cloudPollerLimit,
			cloudOutput{id: "pg", kind: config.OutputPostgres},
			cloudOutput{id: "archive", kind: config.OutputS3},
			cloudOutput{id: "rest", kind: config.OutputHTTP, fifo: true})
	}, coreLoad, cloudPollerDocs, 0)
	if err != nil {
		return err
	}
	defer coreClose(ctx, st)
	r.add("docs", cloudPollerDocs, fmt.Sprintf("small orders (~250 B), limit %d, loaded in %s; %s added to every AWS request",
		cloudPollerLimit, loaded.Round(time.Millisecond), cw.latency))

	base, err := st.Deps.Poller(ctx, "bench")
	if err != nil {
		return err
	}
	awsCfg, err := cw.config(ctx)
	if err != nil {
		return err
	}
	null := &fanout.Sender{SQS: cw.standInSQS(awsCfg), MaxBytes: st.Config.Stack.MaxMessageBytes, Concurrency: base.Job.SendConcurrency}
	nullTargets := make([]fanout.Target, len(base.Targets))
	for i, t := range base.Targets {
		nullTargets[i] = fanout.Target{Output: t.Output, QueueURL: "http://null/000000000000/" + t.Output, FIFO: t.FIFO}
	}
	rawClient := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

	type counted struct {
		counts map[string]int64
		docs   int
	}
	requests := map[string]counted{}
	spans := map[string][]corePollerSpans{}
	purgeStandIn := func(ctx context.Context) {
		c := cw.standInSQS(awsCfg)
		for _, t := range nullTargets {
			_, _ = c.PurgeQueue(ctx, &sqs.PurgeQueueInput{QueueUrl: &t.QueueURL})
		}
	}
	poller := func(variant string, sender poll.Sender, targets []fanout.Target) func(ctx context.Context, round int) (time.Duration, error) {
		return func(ctx context.Context, round int) (time.Duration, error) {
			p := &poll.Poller{Job: base.Job, Feed: base.Feed, Leases: base.Leases, Sender: sender, Targets: targets,
				Log: base.Log, Metrics: base.Metrics, Clock: base.Clock, SendDepth: base.SendDepth}
			cw.resetRequests()
			sp, err := coreRunPoller(ctx, p, fmt.Sprintf("%s-%d", variant, round), sender, cloudPollerDocs)
			if err != nil {
				return 0, err
			}
			if round == 0 {
				requests[variant] = counted{cw.requests(), cloudPollerDocs}
			}
			spans[variant] = append(spans[variant], sp)
			cloudPurge(ctx, st)
			purgeStandIn(ctx)
			return sp.total, nil
		}
	}
	variants := []coreVariant{
		{"raw", cloudPollerDocs, func(ctx context.Context, _ int) (time.Duration, error) {
			return coreRawChanges(ctx, rawClient, st.SourceURL, cloudPollerLimit, cloudPollerDocs)
		}},
		{"sqs1", cloudPollerDocs, poller("sqs1", base.Sender, base.Targets[:1])},
		{"sqs3", cloudPollerDocs, poller("sqs3", base.Sender, base.Targets)},
		{"null1", cloudPollerDocs, poller("null1", null, nullTargets[:1])},
		{"null3", cloudPollerDocs, poller("null3", null, nullTargets)},
		{"emulator", cloudPollerDocs, func(ctx context.Context, round int) (time.Duration, error) {
			cw.resetRequests()
			d, err := cloudSendRate(ctx, base.Sender, base.Targets[:1], cloudPollerDocs)
			if round == 0 {
				requests["emulator"] = counted{cw.requests(), cloudPollerDocs}
			}
			cloudPurge(ctx, st)
			return d, err
		}},
	}
	rates, err := coreRounds(ctx, cloudPollerRounds, variants, func(round int, got map[string]float64) {
		fmt.Printf("  round %d: raw %.0f; poller to the emulator: 1 output %.0f, 3 outputs %.0f; to the stand-in: 1 output %.0f, 3 outputs %.0f; emulator's own send rate %.0f docs/s\n",
			round+1, got["raw"], got["sqs1"], got["sqs3"], got["null1"], got["null3"], got["emulator"])
	})
	if err != nil {
		return err
	}
	ratio := func(a string) []float64 {
		xs := make([]float64, len(rates[a]))
		for i := range xs {
			xs[i] = rates[a][i] / rates["raw"][i]
		}
		return xs
	}
	med := func(xs []float64) float64 { return median(slices.Clone(xs)) }
	r.add("raw _changes docs/s", med(rates["raw"]), "median of "+coreJoin(rates["raw"], "%.0f"))
	r.add("poller -> emulator SQS, 1 output docs/s", med(rates["sqs1"]), "median of "+coreJoin(rates["sqs1"], "%.0f"))
	r.add("poller -> emulator SQS, 3 outputs docs/s", med(rates["sqs3"]), "median of "+coreJoin(rates["sqs3"], "%.0f"))
	r.add("emulator's own send rate msgs/s", med(rates["emulator"]),
		"one fanout.Sender.Send, no feed: the ceiling of the two figures above; median of "+coreJoin(rates["emulator"], "%.0f"))
	r.add("poller -> stand-in SQS, 1 output docs/s", med(rates["null1"]), "median of "+coreJoin(rates["null1"], "%.0f"))
	r.add("poller -> stand-in SQS, 3 outputs docs/s", med(rates["null3"]), "median of "+coreJoin(rates["null3"], "%.0f"))
	r.add("poller/raw, emulator SQS, 1 output", med(ratio("sqs1")), "goal >= 0.8; per round "+coreJoin(ratio("sqs1"), "%.3f"))
	r.add("poller/raw, emulator SQS, 3 outputs", med(ratio("sqs3")), "goal >= 0.5; per round "+coreJoin(ratio("sqs3"), "%.3f"))
	r.add("poller/raw, stand-in SQS, 1 output", med(ratio("null1")), "goal >= 0.8; per round "+coreJoin(ratio("null1"), "%.3f"))
	r.add("poller/raw, stand-in SQS, 3 outputs", med(ratio("null3")), "goal >= 0.5; per round "+coreJoin(ratio("null3"), "%.3f"))
	for _, v := range []string{"sqs1", "sqs3", "null1", "null3"} {
		var share, feed, cps []float64
		for _, sp := range spans[v] {
			share = append(share, sp.checkpointSum().Seconds()/sp.total.Seconds())
			feed = append(feed, sp.changes.Seconds()/sp.total.Seconds())
			cps = append(cps, float64(len(sp.checkpoints)))
		}
		r.add("checkpoint share, "+v, med(share), fmt.Sprintf("time in checkpoint writes / poller time; in _changes %.3f; %.0f checkpoints per run", med(feed), med(cps)))
	}
	for _, v := range []string{"sqs1", "sqs3", "emulator"} {
		c := requests[v]
		r.add("requests per doc, "+v, float64(cloudSum(c.counts, "SQS.SendMessageBatch"))/float64(c.docs), cloudPerDoc(c.counts, c.docs))
	}
	return nil
}

// cloudSendRate sends n small changes to targets in one Send and returns the
// time it took.
func cloudSendRate(ctx context.Context, sender poll.Sender, targets []fanout.Target, n int) (time.Duration, error) {
	now := time.Now().UTC()
	doc := json.RawMessage(`{"type":"order","status":"paid","total":"123.45","items":[{"sku":"SKU-1","qty":2}],"pad":"` + fmt.Sprintf("%0150d", 0) + `"}`)
	changes := make([]*change.Envelope, n)
	for i := range changes {
		changes[i] = &change.Envelope{V: change.EnvelopeVersion, Job: "bench", DocID: fmt.Sprintf("order-%06d", i), Rev: "1-a",
			Seq: json.RawMessage(strconv.Itoa(i + 1)), Version: change.Version{Generation: 1, Counter: int64(i + 1)}, EnqueuedAt: now, Doc: doc}
	}
	start := time.Now()
	if _, err := sender.Send(ctx, targets, changes, func() error { return nil }); err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	return time.Since(start), nil
}
