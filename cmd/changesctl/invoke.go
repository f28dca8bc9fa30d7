package main

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/claimcheck"
	"github.com/changes-worker/changes-worker/shared/dlq"
	"github.com/changes-worker/changes-worker/shared/pipeline"
)

const invokeUsage = `usage: changesctl invoke poller|writer --event FILE --config FILE [--job J] [--output O] [--function-timeout D] [-o json|table]

Runs one function once on one event, against the services the configuration
and the AWS settings name, as Lambda would (sam local invoke): the handler's
response is printed on standard output (as JSON, unless -o table), its logs
go to standard error, and a handler error exits with status 1. FILE is a
Lambda event (see events/), or - for standard input.

poller: the event is {"job": "<id>"}; --job replaces the job it names.
writer: the event is an SQS batch; each record belongs to the output whose
work queue its eventSourceARN names. --job and --output point every record at
that output instead: the queue ARN and the envelopes' job and output are
rewritten (--output may be left out when the job has only one).
`

// cmdInvoke runs the poller or the writer handler once on an event.
func cmdInvoke(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 || (args[0] != "poller" && args[0] != "writer") {
		if len(args) > 0 && isHelp(args[0]) {
			fmt.Fprint(env.stdout, invokeUsage)
			return flag.ErrHelp
		}
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			return usagef("invoke: unknown function %q (want poller or writer)%s", args[0], didYouMean(args[0], []string{"poller", "writer"}, ""))
		}
		fmt.Fprint(env.stderr, invokeUsage)
		return usagef("invoke: name the function: poller or writer")
	}
	fn := args[0]
	fs := newFlags(env, "invoke "+fn)
	sc := scopeFlags(fs, "job `id` (poller: replaces the event's job; writer: point the records at this job's output)", "writer: point the records at this output `id`")
	eventPath := fs.String("event", "", "Lambda event `file` (- for standard input)")
	timeout := fs.Duration("function-timeout", 0, "the invocation's deadline, as the function's timeout on Lambda (default: the job's poller timeout, or stack.writer_timeout)")
	renamedFlag(env, fs, "timeout", "function-timeout")
	verbose := fs.Bool("v", false, "debug logging")
	asJSON := formatFlag(fs, true)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("invoke %s: unexpected argument %q", fn, fs.Arg(0))
	}
	if *eventPath == "" {
		return usagef("invoke %s: --event is required", fn)
	}
	if fn == "poller" && *sc.output != "" {
		return usagef("invoke poller: --output applies to the writer only")
	}
	raw, err := readEvent(env, *eventPath)
	if err != nil {
		return fmt.Errorf("invoke %s: %w", fn, err)
	}
	deps, err := sc.load(ctx, env, *verbose)
	if err != nil {
		return err
	}
	defer deps.Close()

	// Without a deadline the poller's handler takes its job's poller timeout.
	budget := *timeout
	if budget == 0 && fn == "writer" {
		budget = deps.Config.Stack.WriterTimeout.D()
	}
	ictx, cancel := ctx, context.CancelFunc(func() {})
	if budget > 0 {
		ictx, cancel = context.WithTimeout(ctx, budget)
	}
	defer cancel()
	ictx = lambdacontext.NewContext(ictx, &lambdacontext.LambdaContext{AwsRequestID: requestID()})

	var resp any
	switch fn {
	case "poller":
		var ev pipeline.ScheduleEvent
		if err := decodeEvent(raw, &ev); err != nil {
			return fmt.Errorf("invoke poller: %s: %w", *eventPath, err)
		}
		if *sc.job != "" {
			ev.Job = *sc.job
		}
		resp, err = deps.HandleSchedule(ictx, ev)
	case "writer":
		var ev events.SQSEvent
		if err := decodeEvent(raw, &ev); err != nil {
			return fmt.Errorf("invoke writer: %s: %w", *eventPath, err)
		}
		if *sc.job != "" || *sc.output != "" {
			if err := retarget(ctx, deps, &ev, *sc.job, *sc.output); err != nil {
				return fmt.Errorf("invoke writer: %w", err)
			}
		}
		if err := checkRoutes(deps, ev); err != nil {
			return fmt.Errorf("invoke writer: %w", err)
		}
		resp, err = deps.Writer().Handle(ictx, ev)
	}
	if err != nil {
		return fmt.Errorf("invoke %s: %w", fn, err)
	}
	out, merr := json.Marshal(resp)
	if merr != nil {
		return fmt.Errorf("invoke %s: encode response: %w", fn, merr)
	}
	if !*asJSON {
		return printResponse(env.stdout, out)
	}
	fmt.Fprintf(env.stdout, "%s\n", out)
	return nil
}

// printResponse prints a handler's response, a JSON object, as a table:
// one line per field, its value as JSON unless it is a string.
func printResponse(w io.Writer, resp []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(resp, &fields); err != nil {
		_, err := fmt.Fprintf(w, "%s\n", resp)
		return err
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range keys {
		v := string(fields[k])
		var s string
		if json.Unmarshal(fields[k], &s) == nil {
			v = s
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, v)
	}
	return tw.Flush()
}

func readEvent(env *cliEnv, path string) ([]byte, error) {
	if path == "-" {
		b, err := io.ReadAll(env.stdin)
		if err != nil {
			return nil, fmt.Errorf("read event from standard input: %w", err)
		}
		return b, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read event: %w", err)
	}
	return b, nil
}

// decodeEvent decodes an event strictly: a misspelt key is an error rather
// than a field silently left empty.
func decodeEvent(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode event as %T: %w", v, err)
	}
	if dec.More() {
		return errors.New("decode event: more than one JSON value")
	}
	return nil
}

// retarget points every record of ev at one output's work queue: its ARN,
// the job and output of each envelope, and a claim check's bucket and stack
// and job prefix (the body is re-encoded and its digest recomputed). A body that is not an envelope is left as it is, for
// the handler to refuse.
func retarget(ctx context.Context, deps *pipeline.Deps, ev *events.SQSEvent, jobID, outputID string) error {
	j, o, err := route(deps.Config, jobID, outputID)
	if err != nil {
		return err
	}
	q, err := dlq.Resolve(ctx, deps.SQS, deps.Config, j, o)
	if err != nil {
		return fmt.Errorf("resolve queues of %s/%s: %w", j.ID, o.ID, err)
	}
	region := deps.AWS.Region
	if parts := strings.Split(q.WorkARN, ":"); len(parts) == 6 {
		region = parts[3]
	}
	for i := range ev.Records {
		r := &ev.Records[i]
		r.EventSourceARN, r.AWSRegion = q.WorkARN, region
		env, err := change.Decode([]byte(r.Body))
		if err != nil {
			continue
		}
		if ref := env.DocRef; ref != nil {
			// The writer reads claim checks only from the stack bucket, under
			// the stack's and the job's prefix: point the reference where
			// this configuration's poller would have put it.
			ref.Bucket = deps.Config.Stack.Bucket
			if key, ok := claimcheck.Rebase(ref.Key, deps.Config.Stack.Prefix, j.ID); ok {
				ref.Key = key
			}
		}
		env.Job, env.Output = j.ID, o.ID
		b, err := json.Marshal(env)
		if err != nil {
			return fmt.Errorf("encode envelope of %s: %w", env.DocID, err)
		}
		sum := md5.Sum(b)
		r.Body, r.Md5OfBody = string(b), hex.EncodeToString(sum[:])
	}
	return nil
}

// checkRoutes refuses records whose queue is no work queue of the
// configuration, before anything is delivered.
func checkRoutes(deps *pipeline.Deps, ev events.SQSEvent) error {
	if len(ev.Records) == 0 {
		return errors.New("the event has no records")
	}
	for i, r := range ev.Records {
		name := r.EventSourceARN[strings.LastIndexByte(r.EventSourceARN, ':')+1:]
		if _, ok := deps.Config.RouteByQueueName(name); !ok {
			return fmt.Errorf("record %d comes from queue %q, which is no work queue of this configuration (pass --job and --output to point the records at one)", i, name)
		}
	}
	return nil
}

// requestID makes a Lambda-style request id for the invocation; the poller
// records it as the lease owner.
func requestID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return fmt.Sprintf("invoke-%d", time.Now().UnixNano())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
