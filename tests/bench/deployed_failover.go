package main

// deployed-failover: failovers of the poller where it ships. For each idle
// setting (-idle-settings), the full stack is deployed to LocalStack
// (localstack/deploy.sh) with the job's defaults (schedule 1m, the default
// poller timeout, lease TTL 10s, feed limit 500), its schedule rule starts
// the poller, and a background writer keeps changing the source (10
// documents a second: new ones, updates, deletes). At random moments of the
// schedule's cycle, the bootstrap process of the execution environment that
// holds the lease (the job item's host names its log stream) is killed with
// SIGKILL, and only that one: -deployed-failover-kills times, each in the
// deployment's steady state (a holder that has checkpointed and another
// invocation marked as standing by since the holder took over), a random
// part of a schedule period after that state is reached, and every other
// kill as soon as that state is reached again after the failover before it:
// a second crash within the schedule period, whose standby the new holder
// started itself (the schedule adds one invocation a period). Each kill is
// timed to the lease taken by another
// invocation and to that holder's first checkpoint, from the job item
// sampled every 100 ms. The idle settings run side by side, each on its
// own stack.
//
// The job has two outputs: PostgreSQL, delivered by the deployed writer
// through its event source mapping, and "tap", whose mapping is deleted
// after the deploy so that the benchmark reads its queue itself and sees
// every change queued, with its generation: what a failover queued again
// (the replay) and whether every change reached a queue. At the end the
// PostgreSQL output must hold exactly the source's live documents. The
// ticks are read back from the poller's log group: the first record of
// each invocation.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudformation"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/clock"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deployed"
	"github.com/changes-worker/changes-worker/shared/pipeline"
	"github.com/changes-worker/changes-worker/shared/statetable/lease"
	"github.com/changes-worker/changes-worker/shared/testenv"
	"github.com/changes-worker/changes-worker/shared/testenv/stack"
	"github.com/changes-worker/changes-worker/tests/faults"
)

func init() {
	register("deployed-failover", deployedFailover)
}

var deployedFailoverKillsFlag = flag.Int("deployed-failover-kills", 12,
	"kills of the active poller per idle setting in the deployed-failover benchmark")

const (
	// deployedFailoverRate is the background writer's documents a second.
	deployedFailoverRate = 10
	// deployedFailoverTap is the output whose queue the benchmark reads.
	deployedFailoverTap = "tap"
)

func deployedFailover(ctx context.Context, r *results) error {
	settings := strings.Split(*idleSettingsFlag, ",")
	errs := make([]error, len(settings))
	var wg sync.WaitGroup
	for i, idle := range settings {
		wg.Go(func() {
			if err := deployedFailoverRun(ctx, r, idle); err != nil {
				errs[i] = fmt.Errorf("idle %s: %w", idle, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// dfoKill is one kill of the active poller and what followed.
type dfoKill struct {
	at         time.Time // the SIGKILL
	pid        int       // of the bootstrap killed
	victim     lease.State
	taken      time.Time // the next generation's acquisition (its clock)
	checkpoint time.Time // that generation's first checkpoint (its clock)
	next       lease.State
	standby    string // the invocation marked as standing by at the kill, or ""
	// again is set for a kill made as soon as the deployment was steady
	// after the failover before it; since is then the time from that
	// failover's takeover to this kill.
	again bool
	since time.Duration
}

func deployedFailoverRun(ctx context.Context, r *results, idle string) error {
	cfg := &config.File{
		Stack: config.Stack{LogRetentionDays: 1},
		Jobs: []*config.Job{{
			ID:   faults.Job,
			Idle: idle,
			Outputs: []*config.Output{
				{ID: "pg", Type: config.OutputPostgres, Postgres: &config.PostgresOutput{CreateTables: true}},
				{ID: deployedFailoverTap, Type: config.OutputS3, S3: &config.S3Output{Prefix: deployedFailoverTap + "/"}},
			},
		}},
	}
	st, err := stack.New(ctx, stack.Options{Name: "bench-dfo-" + idle, Config: cfg})
	if err != nil {
		return err
	}
	defer coreClose(ctx, st)
	j := st.Config.Jobs[0]
	prefix := st.Config.Stack.Prefix
	awsCfg := st.Deps.AWS
	cfn := cloudformation.NewFromConfig(awsCfg)
	defer func() {
		if _, err := cfn.DeleteStack(context.WithoutCancel(ctx), &cloudformation.DeleteStackInput{StackName: &prefix}); err != nil {
			fmt.Printf("  cleanup: delete stack %s: %v\n", prefix, err)
		}
	}()
	took, err := deployedDeploy(ctx, st)
	if err != nil {
		return err
	}
	fmt.Printf("  deployed %s in %s (poller timeout %s, schedule %s, lease TTL %s, idle %s)\n",
		prefix, took.Round(time.Second), st.Config.PollerTimeout(j), j.Schedule.D(), j.Lease.TTL.D(), j.Idle)
	bucket, err := deployed.Bucket(ctx, cfn, prefix)
	if err != nil {
		return err
	}
	if _, err := st.Deps.S3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &st.Config.Stack.Bucket}); err != nil {
		return err
	}
	pipeline.OverrideBucket(st.Config, bucket)

	tapQ, err := st.Queues(ctx, faults.Job, deployedFailoverTap)
	if err != nil {
		return err
	}
	lc := lambda.NewFromConfig(awsCfg)
	if err := deleteMapping(ctx, lc, prefix+"-"+faults.Job+"-writer", tapQ.WorkARN); err != nil {
		return err
	}
	tap := startTap(ctx, st.Deps.SQS, tapQ.WorkURL)
	defer tap.stop()

	fs := faults.Adopt(st)
	w := fs.Watch(ctx, 100*time.Millisecond)
	defer w.Stop()
	load := fs.StartLoad(ctx, faults.LoadOptions{Rate: deployedFailoverRate, Max: 1 << 30, For: 3 * time.Hour, Seed: 21})
	defer load.Stop()
	stopSchedule, err := faults.StartSchedule(ctx, eventbridge.NewFromConfig(awsCfg), st.Config.ScheduleName(j))
	if err != nil {
		return err
	}
	scheduled := time.Now()
	stopped := false
	defer func() {
		if stopped {
			return
		}
		if err := stopSchedule(context.WithoutCancel(ctx)); err != nil {
			fmt.Printf("  cleanup: stop schedule: %v\n", err)
		}
	}()

	// Three ticks: from the third on, invocations overlap as they do for
	// good.
	period := j.Schedule.D()
	if _, err := w.WaitFor(ctx, 0, 2*period+st.Config.PollerTimeout(j), func(s faults.Sample) bool {
		return s.CheckpointedByHolder() && s.At.Sub(scheduled) > 2*period+15*time.Second
	}); err != nil {
		return fmt.Errorf("no holder checkpointing after the schedule started: %w", err)
	}

	function := prefix + "-" + faults.Job + "-poller"
	ttl := j.Lease.TTL.D()
	var kills []dfoKill
	for attempt := 0; len(kills) < *deployedFailoverKillsFlag; attempt++ {
		if attempt >= *deployedFailoverKillsFlag+10 {
			return fmt.Errorf("only %d of %d kills hit a poller holding the lease", len(kills), *deployedFailoverKillsFlag)
		}
		if _, err := w.WaitFor(ctx, w.Len(), 3*period, func(s faults.Sample) bool {
			return steady(s, ttl)
		}); err != nil {
			return fmt.Errorf("kill %d: no standby beside the holder: %w", attempt+1, err)
		}
		again := len(kills)%2 == 1
		if !again {
			if err := clock.Sleep(ctx, rand.N(period)); err != nil {
				return err
			}
		}
		k, ok, err := killActive(ctx, w, function, ttl)
		if err != nil {
			return fmt.Errorf("kill %d: %w", attempt+1, err)
		}
		if !ok {
			continue
		}
		by := "an invocation that stood by"
		if k.standby == "" {
			by = "with no standby marked at the kill"
		}
		when := "at a random moment"
		if again {
			k.again, k.since = true, k.at.Sub(kills[len(kills)-1].taken)
			when = fmt.Sprintf("%.1f s after the last takeover", k.since.Seconds())
		}
		fmt.Printf("  idle %s kill %d (%s): bootstrap %d of generation %d (%s) killed; generation %d (%s) took the lease after %.2f s (%s), first checkpoint after %.2f s\n",
			idle, len(kills)+1, when, k.pid, k.victim.Generation, k.victim.Owner, k.next.Generation, by, k.taken.Sub(k.at).Seconds(), k.next.TakeoverKind, k.checkpoint.Sub(k.at).Seconds())
		kills = append(kills, k)
	}

	written, err := load.Stop()
	if err != nil {
		return fmt.Errorf("background writer: %w", err)
	}
	// The outputs: PostgreSQL exact, and every live document's winning
	// revision queued to the tap.
	var want, pg map[string]string
	err = testenv.Poll(ctx, 5*time.Minute, 2*time.Second, func(ctx context.Context) (bool, error) {
		if want, err = st.SourceWinners(ctx); err != nil {
			return false, err
		}
		pg, _ = st.Revs(ctx, faults.Job, "pg")
		return len(missingFromTap(tap.messages(), want)) == 0 && len(faults.Drift(want, pg)) == 0, nil
	})
	if errors.Is(err, testenv.ErrTimeout) {
		return fmt.Errorf("outputs not exact 5m after the last write: %d documents differ in PostgreSQL, %d winners never queued to the tap",
			len(faults.Drift(want, pg)), len(missingFromTap(tap.messages(), want)))
	}
	if err != nil {
		return err
	}
	if regs := w.Regressions(); len(regs) > 0 {
		return fmt.Errorf("the checkpoint moved back %d times: %v", len(regs), regs)
	}
	// An invocation's records reach its log group when it ends: stop the
	// schedule and wait for the last ones.
	stopped = true
	if err := stopSchedule(ctx); err != nil {
		return err
	}
	if err := clock.Sleep(ctx, st.Config.PollerTimeout(j)+20*time.Second); err != nil {
		return err
	}
	firsts, err := pollerRecords(ctx, cloudwatchlogs.NewFromConfig(awsCfg), "/aws/lambda/"+function, scheduled)
	if err != nil {
		return err
	}
	ticks := invocationStarts(firsts, w.Samples())

	msgs := tap.messages()
	var toTaken, toCheckpoint, replayed, phases, since, againToCheckpoint []float64
	standbys := 0
	for _, k := range kills {
		if k.again {
			since = append(since, k.since.Seconds())
			againToCheckpoint = append(againToCheckpoint, k.checkpoint.Sub(k.at).Seconds())
		}
		toTaken = append(toTaken, k.taken.Sub(k.at).Seconds())
		toCheckpoint = append(toCheckpoint, k.checkpoint.Sub(k.at).Seconds())
		replayed = append(replayed, float64(faults.Replayed(msgs, k.victim.Generation, k.next.Generation)))
		if p, ok := cyclePhase(ticks, k.at, period); ok {
			phases = append(phases, p)
		}
		if k.standby != "" {
			standbys++
		}
	}
	sort.Float64s(phases)
	intervals := tickIntervals(ticks, period)
	p := "idle " + idle + " "
	r.add(p+"kills", len(kills), fmt.Sprintf("SIGKILL of the lease holder's bootstrap, each with a standby beside the holder; at %d of them the standby's mark on the job item was fresh at the kill", standbys))
	r.add(p+"kill moments s after the tick", coreJoin(phases, "%.0f"), "seconds into the schedule period (after the latest invocation's start) of each kill")
	r.add(p+"kill_to_takeover_p50_s", median(toTaken), "kill to the lease taken by another invocation")
	r.add(p+"kill_to_takeover_p99_s", percentile(toTaken, 99), "")
	r.add(p+"kill_to_takeover_max_s", percentile(toTaken, 100), "")
	r.add(p+"kill_to_first_checkpoint_p50_s", median(toCheckpoint), "kill to the new holder's first checkpoint")
	r.add(p+"kill_to_first_checkpoint_p99_s", percentile(toCheckpoint, 99), "")
	r.add(p+"kill_to_first_checkpoint_max_s", percentile(toCheckpoint, 100), fmt.Sprintf("goal <= TTL + 1 s = %.0f s", (ttl+time.Second).Seconds()))
	if len(since) > 0 {
		r.add(p+"second_crashes", len(since), "of the kills, those made as soon as a standby marked the job item after the failover before: a second crash within the schedule period")
		r.add(p+"second_crash_after_takeover_p50_max_s", fmt.Sprintf("%.1f %.1f", median(since), slices.Max(since)), "from the failover before to the second crash")
		r.add(p+"second_crash_to_first_checkpoint_p50_max_s", fmt.Sprintf("%.2f %.2f", median(againToCheckpoint), slices.Max(againToCheckpoint)), fmt.Sprintf("goal <= TTL + 1 s = %.0f s", (ttl+time.Second).Seconds()))
	}
	r.add(p+"replayed_per_failover_median", median(replayed), "changes (doc, seq) both the killed and the new generation queued")
	r.add(p+"replayed_per_failover_max", percentile(replayed, 100), fmt.Sprintf("feed limit %d", j.Feed.Limit))
	r.add(p+"documents_written", written, fmt.Sprintf("by the background writer, %d a second", deployedFailoverRate))
	r.add(p+"pg_docs_differing_from_source", len(faults.Drift(want, pg)), fmt.Sprintf("after the run, of %d live documents; goal 0", len(want)))
	r.add(p+"winners_never_queued", len(missingFromTap(msgs, want)), fmt.Sprintf("live documents whose winning revision no poller queued, of %d changes queued; goal 0", len(msgs)))
	r.add(p+"ticks", len(ticks), "poller invocations started, from the first record of each in the poller's log group")
	if len(intervals) > 0 {
		r.add(p+"tick_interval_median_s", median(intervals), "between consecutive invocations' first records (LocalStack's scheduler: rate(1 minute))")
		r.add(p+"tick_interval_min_max_s", fmt.Sprintf("%.1f %.1f", slices.Min(intervals), slices.Max(intervals)), "")
	}
	return nil
}

// killActive waits for a holder of the lease, kills its bootstrap and waits
// for the next generation's first checkpoint. ok is false when the kill did
// not hit a holder (its lease was released or had changed hands meanwhile):
// no failover to time.
func killActive(ctx context.Context, w *faults.Watcher, function string, ttl time.Duration) (dfoKill, bool, error) {
	var k dfoKill
	from := w.Len()
	cur, err := w.WaitFor(ctx, from, 3*time.Minute, func(s faults.Sample) bool {
		return s.State.Held(time.Now()) && s.CheckpointedByHolder()
	})
	if err != nil {
		return k, false, err
	}
	// Who stands by at the kill: the last sample's mark, when fresh.
	if last, ok := w.Last(); ok && steady(last, ttl) {
		k.standby = last.State.Standby
	}
	pid, err := faults.KillBootstrap(function, cur.State.Host)
	k.at = time.Now()
	if errors.Is(err, faults.ErrNoBootstrap) {
		return k, false, nil
	}
	if err != nil {
		return k, false, err
	}
	k.pid, k.victim = pid, cur.State
	after := w.Len()
	next, err := w.WaitFor(ctx, after, 5*time.Minute, func(s faults.Sample) bool {
		return s.State.Generation > k.victim.Generation && s.CheckpointedByHolder() ||
			s.State.Generation == k.victim.Generation && s.State.Released
	})
	if err != nil {
		return k, false, fmt.Errorf("after killing generation %d: %w", k.victim.Generation, err)
	}
	if next.State.Generation == k.victim.Generation || next.State.Generation != k.victim.Generation+1 {
		// Released before the kill took effect, or another took over in
		// between: not one failover.
		_, err := w.WaitFor(ctx, after, 5*time.Minute, func(s faults.Sample) bool {
			return s.State.Generation > k.victim.Generation && s.CheckpointedByHolder()
		})
		return k, false, err
	}
	k.next = next.State
	k.taken, k.checkpoint = next.State.AcquiredAt, next.State.CheckpointAt
	if first, ok := w.FirstCheckpoint(next.State.Generation); ok {
		k.checkpoint = first.State.CheckpointAt
	}
	// Let the new holder settle before the next kill.
	return k, true, clock.Sleep(ctx, 2*time.Second)
}

// steady reports whether s shows the deployment's steady state: a holder
// that has checkpointed, and another invocation that marked itself as
// standing by since the holder took over, within the last third of a TTL
// (a standby marks every third of a TTL) and a second.
func steady(s faults.Sample, ttl time.Duration) bool {
	st := s.State
	return st.Held(s.At) && s.CheckpointedByHolder() && st.Standby != "" && st.Standby != st.Owner &&
		st.StandbySeenAt.After(st.AcquiredAt) && s.At.Sub(st.StandbySeenAt) < ttl/3+time.Second
}

// deleteMapping deletes the event source mapping of function on queueARN.
func deleteMapping(ctx context.Context, lc *lambda.Client, function, queueARN string) error {
	out, err := lc.ListEventSourceMappings(ctx, &lambda.ListEventSourceMappingsInput{FunctionName: &function})
	if err != nil {
		return fmt.Errorf("list event source mappings of %s: %w", function, err)
	}
	for _, m := range out.EventSourceMappings {
		if aws.ToString(m.EventSourceArn) == queueARN {
			if _, err := lc.DeleteEventSourceMapping(ctx, &lambda.DeleteEventSourceMappingInput{UUID: m.UUID}); err != nil {
				return fmt.Errorf("delete event source mapping %s: %w", aws.ToString(m.UUID), err)
			}
			return nil
		}
	}
	return fmt.Errorf("%s has no event source mapping on %s", function, queueARN)
}

// tapReader receives every message of a work queue, records it and deletes
// it.
type tapReader struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	msgs   map[string]faults.Message
}

func startTap(ctx context.Context, q *sqs.Client, url string) *tapReader {
	ctx, cancel := context.WithCancel(ctx)
	t := &tapReader{cancel: cancel, msgs: map[string]faults.Message{}}
	for range 2 {
		t.wg.Go(func() {
			for ctx.Err() == nil {
				out, err := q.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 30})
				if err != nil {
					_ = clock.Sleep(ctx, time.Second)
					continue
				}
				var del []sqstypes.DeleteMessageBatchRequestEntry
				for i, m := range out.Messages {
					if t.record(m) {
						del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
					}
				}
				if len(del) > 0 {
					_, _ = q.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: &url, Entries: del})
				}
			}
		})
	}
	return t
}

// record keeps a message's envelope; false when it cannot be decoded (it
// stays in the queue and counts as never queued).
func (t *tapReader) record(m sqstypes.Message) bool {
	env, err := change.Decode([]byte(aws.ToString(m.Body)))
	if err != nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	id := aws.ToString(m.MessageId)
	t.msgs[id] = faults.Message{ID: id, DocID: env.DocID, Rev: env.Rev, Seq: string(env.Seq), Deleted: env.Tombstone(), Version: env.Version, EnqueuedAt: env.EnqueuedAt}
	return true
}

func (t *tapReader) messages() []faults.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]faults.Message, 0, len(t.msgs))
	for _, m := range t.msgs {
		out = append(out, m)
	}
	return out
}

func (t *tapReader) stop() {
	t.cancel()
	t.wg.Wait()
}

// missingFromTap returns the live documents of want whose winning revision
// no message carries.
func missingFromTap(msgs []faults.Message, want map[string]string) []string {
	queued := map[string]bool{}
	for _, m := range msgs {
		queued[m.DocID+"\x00"+m.Rev] = true
	}
	var missing []string
	for id, rev := range want {
		if !queued[id+"\x00"+rev] {
			missing = append(missing, id)
		}
	}
	return missing
}

// pollerRecords returns the time of the first record of each poller
// invocation in the function's log group since a moment (records of the
// pipeline's JSON logger carry the request id and a timestamp). An
// invocation's records arrive when it ends, and a killed one's may not.
func pollerRecords(ctx context.Context, logs *cloudwatchlogs.Client, group string, since time.Time) (map[string]time.Time, error) {
	first := map[string]time.Time{}
	p := cloudwatchlogs.NewFilterLogEventsPaginator(logs, &cloudwatchlogs.FilterLogEventsInput{
		LogGroupName: &group, StartTime: aws.Int64(since.Add(-time.Minute).UnixMilli()),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", group, err)
		}
		for _, ev := range page.Events {
			var rec struct {
				Time      time.Time `json:"timestamp"`
				RequestID string    `json:"requestId"`
			}
			if json.Unmarshal([]byte(aws.ToString(ev.Message)), &rec) != nil || rec.RequestID == "" || rec.Time.Before(since) {
				continue
			}
			if t, ok := first[rec.RequestID]; !ok || rec.Time.Before(t) {
				first[rec.RequestID] = rec.Time
			}
		}
	}
	return first, nil
}

// invocationStarts returns when each poller invocation began, in order: the
// earlier of its first log record and the first sample of the job item
// naming it, as the holder or as the standby (an invocation marks the item
// as it starts standing by). A retried invocation keeps its request id and
// so counts once.
func invocationStarts(records map[string]time.Time, samples []faults.Sample) []time.Time {
	first := maps.Clone(records)
	seen := func(id string, at time.Time) {
		if id == "" {
			return
		}
		if t, ok := first[id]; !ok || at.Before(t) {
			first[id] = at
		}
	}
	for _, s := range samples {
		if !s.State.AcquiredAt.IsZero() {
			seen(s.State.Owner, s.State.AcquiredAt)
		}
		if !s.State.StandbySeenAt.IsZero() {
			seen(s.State.Standby, s.State.StandbySeenAt)
		}
	}
	starts := slices.Collect(maps.Values(first))
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	return starts
}

// tickIntervals returns the seconds between consecutive starts that are at
// least half a period apart: a retried invocation (Lambda retries one that
// failed, as a killed one did) starts between ticks.
func tickIntervals(starts []time.Time, period time.Duration) []float64 {
	var out []float64
	var last time.Time
	for _, s := range starts {
		if !last.IsZero() && s.Sub(last) < period/2 {
			continue
		}
		if !last.IsZero() {
			out = append(out, s.Sub(last).Seconds())
		}
		last = s
	}
	return out
}

// cyclePhase returns how many seconds into the schedule period at was: the
// time since the latest start before it that is a tick.
func cyclePhase(starts []time.Time, at time.Time, period time.Duration) (float64, bool) {
	var tick time.Time
	for _, s := range starts {
		if s.After(at) {
			break
		}
		if tick.IsZero() || s.Sub(tick) >= period/2 {
			tick = s
		}
	}
	if tick.IsZero() {
		return 0, false
	}
	return at.Sub(tick).Seconds(), true
}
