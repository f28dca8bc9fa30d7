package main

// The benchmarks page: `go run ./tests/bench -report docs/bench-results.json`
// prints docs/benchmarks.md, one table of the figures a results file holds,
// each with its goal and the command that measures it again. `make bench`
// regenerates the page after a run; TestBenchmarksPage checks that the
// committed page is what the committed results give.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// figureRow is one row of the page: what is measured, how its value reads
// from the figures of one benchmark, the goal it has, and the flags beside
// `-only bench` that measure it again.
type figureRow struct {
	bench string
	what  string
	value func(f *figureReader) string
	goal  string
	flags string
}

// figureReader formats the figures of one benchmark, remembering whether
// any it was asked for is missing from the results.
type figureReader struct {
	figures map[string]any
	missing bool
}

// num formats a numeric figure with decimals places and thousands
// separators.
func (f *figureReader) num(key string, decimals int) string {
	v, ok := f.figures[key].(float64)
	if !ok {
		f.missing = true
		return ""
	}
	return groupThousands(strconv.FormatFloat(v, 'f', decimals, 64))
}

// text formats a figure as it was recorded.
func (f *figureReader) text(key string) string {
	v, ok := f.figures[key]
	if !ok {
		f.missing = true
		return ""
	}
	return fmt.Sprint(v)
}

// groupThousands puts a comma between each group of three digits of the
// integer part of a formatted number.
func groupThousands(s string) string {
	sign, digits, frac := "", s, ""
	if strings.HasPrefix(digits, "-") {
		sign, digits = "-", digits[1:]
	}
	if i := strings.IndexByte(digits, '.'); i >= 0 {
		digits, frac = digits[:i], digits[i:]
	}
	var b strings.Builder
	for i, r := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return sign + b.String() + frac
}

// failoverTTLs are the lease TTLs whose failover figures the page shows:
// those the failover benchmark measures by default.
var failoverTTLs = []string{"1s", "3s", "10s"}

// figureRows are the page's rows, in the order of the table.
var figureRows = slices.Concat(mainRows, failoverRows(failoverTTLs), deployedFailoverRows(config.IdleWatch, config.IdleSleep), manyJobsRows)

// mainRows are the rows of every benchmark but failover.
var mainRows = []figureRow{
	{bench: "poller-throughput", what: "poller / raw `_changes` read, discarding sink (40,000 documents, limit 500)", goal: "≥ 0.9",
		value: func(f *figureReader) string {
			return f.num("poller/raw", 2) + " (raw " + f.num("raw docs/s", 0) + " docs/s)"
		}},
	{bench: "poller-throughput", what: "the same with envelope encoding", value: func(f *figureReader) string { return f.num("poller+encode/raw", 2) }},
	{bench: "poller-throughput", what: "poller CPU per change and output, sending through the SDK to the stand-in SQS (another process): one output; three (two standard queues, one FIFO)", goal: "≤ 25 µs",
		value: func(f *figureReader) string {
			return f.num("poller CPU µs per change and output, 1 output", 1) + "; " + f.num("poller CPU µs per change and output, 3 outputs", 1) + " µs"
		}},
	{bench: "writer-postgres", what: "writer to PostgreSQL (document mode) / raw pgx batched upsert (batches of 10, 4 workers)", goal: "≥ 0.7",
		value: func(f *figureReader) string {
			return f.num("sink/raw", 2) + " (" + f.num("sink rows/s", 0) + " vs " + f.num("raw rows/s", 0) + " rows/s)"
		}},
	{bench: "writer-postgres", what: "writer through the SQS handler / raw; / its own sink, side by side",
		value: func(f *figureReader) string {
			return f.num("handler/raw", 2) + "; " + f.num("handler/sink", 2) + " (the handler's own cost: " + f.num("handler overhead µs per message", 0) + " µs a message)"
		}},
	{bench: "pg-mapping", what: "writer, three-table mapping / raw pgx batch of the same statements", goal: "≥ 0.8",
		value: func(f *figureReader) string { return f.num("mapping / raw", 2) }},
	{bench: "pg-mapping", what: "the same, CPU per document, this process + PostgreSQL: mapping; raw; raw / mapping",
		value: func(f *figureReader) string {
			return f.num("mapping client CPU µs per doc", 0) + " + " + f.num("mapping server CPU µs per doc", 0) + " µs; " +
				f.num("raw client CPU µs per doc", 0) + " + " + f.num("raw server CPU µs per doc", 0) + " µs; " + f.num("raw CPU / mapping CPU", 2)
		}},
	{bench: "e2e-latency", what: "end-to-end latency, source write → PostgreSQL row, 5 documents/s for 60 s: p50, p99, max", goal: "p99 ≤ 1 s",
		value: func(f *figureReader) string {
			return f.num("p50 ms", 0) + ", " + f.num("p99 ms", 0) + ", " + f.num("max ms", 0) + " ms"
		}},
	{bench: "e2e-latency", what: "the same with `poller_timeout` = schedule (no standby overlap): p99",
		value: func(f *figureReader) string { return f.num("p99 ms (poller_timeout 60s, no overlap)", 0) + " ms" }},
	{bench: "poller-memory", what: "poller peak memory, limit 1000, 10 KB documents (VmHWM of the process)", goal: "≤ 128 MiB",
		value: func(f *figureReader) string {
			return f.num("peak RSS MiB", 1) + " MiB (Go live heap ≤ " + f.num("Go live heap max MiB", 0) + " MiB)"
		}},
	{bench: "poller-large-docs", what: "poller peak memory, one page of 500 documents of 400 KB, every document read back from the queue", goal: "≤ 256 MiB, all queued",
		value: func(f *figureReader) string {
			return f.num("peak RSS MiB", 1) + " MiB, " + f.num("queued distinct docs", 0) + " of 500 queued"
		}},
	{bench: "cloud-poller", what: "raw `_changes` read, at cloud latency", value: func(f *figureReader) string { return f.num("raw _changes docs/s", 0) + " docs/s" }},
	{bench: "cloud-poller", what: "poller / raw read, the emulator's SQS, one output", goal: "≥ 0.8",
		value: cloudPollerValue("emulator SQS, 1 output", 3)},
	{bench: "cloud-poller", what: "the same, three outputs", goal: "≥ 0.5",
		value: cloudPollerValue("emulator SQS, 3 outputs", 3)},
	{bench: "cloud-poller", what: "the emulator's own send rate", value: func(f *figureReader) string { return f.num("emulator's own send rate msgs/s", 0) + " msgs/s" }},
	{bench: "cloud-poller", what: "poller / raw read, the stand-in SQS, one output", goal: "≥ 0.8",
		value: cloudPollerValue("stand-in SQS, 1 output", 2)},
	{bench: "cloud-poller", what: "the same, three outputs", goal: "≥ 0.5",
		value: cloudPollerValue("stand-in SQS, 3 outputs", 2)},
	{bench: "cloud-poller", what: "`SendMessageBatch` requests per document, one output",
		value: func(f *figureReader) string { return f.num("requests per doc, sqs1", 3) }},
	{bench: "cloud-backlog", what: "20,000-document backlog into PostgreSQL, in process: the emulator's SQS; the stand-in",
		value: func(f *figureReader) string {
			return f.num("in-process backlog docs/s, emulator SQS at 15ms", 0) + "; " + f.num("in-process backlog docs/s, stand-in SQS at 15ms", 0) + " docs/s"
		}},
	{bench: "cloud-backlog", what: "10,000-document backlog through `changesctl run --until-idle`: the emulator's SQS; the stand-in", goal: "≥ 2,000 docs/s",
		value: func(f *figureReader) string {
			return f.num("changesctl run --until-idle docs/s, emulator SQS at 15ms", 0) + "; " + f.num("changesctl run --until-idle docs/s, stand-in SQS at 15ms", 0) + " docs/s"
		}},
	{bench: "cloud-backlog", what: "the emulator's receives and deletes, no writer", value: func(f *figureReader) string {
		return f.num("emulator's receive+delete rate msgs/s at 15ms", 0) + " msgs/s"
	}},
	{bench: "cloud-backlog", what: "SQS requests per document in the in-process backlog: sends, receives and deletes", value: func(f *figureReader) string { return f.num("requests per doc, in-process backlog", 4) }},
	{bench: "cloud-backlog", what: "writer invocations per document (PostgreSQL, batches of 100)", value: func(f *figureReader) string { return f.num("writer invocations per doc", 4) }},
	{bench: "cloud-idle", what: "an idle job with `idle: watch`, per minute: DynamoDB writes, reads; seconds per poller invocation",
		value: cloudIdleValue("watch")},
	{bench: "cloud-idle", what: "the same with `idle: sleep`",
		value: cloudIdleValue("sleep")},
	{bench: "idle-latency", what: "`idle: watch`, longpoll: a trickle of one change a second (≥ 300, across ≥ 3 handoffs of the lease), p50 / p99 (max), handoffs; a change made once idle, median / max", goal: "p99 ≤ 50 ms on an unloaded machine",
		value: idleLatencyValue("watch longpoll")},
	{bench: "idle-latency", what: "`idle: watch`, continuous: the same", goal: "p99 ≤ 50 ms on an unloaded machine", value: idleLatencyValue("watch continuous")},
	{bench: "idle-latency", what: "`idle: sleep`, longpoll: the same", goal: "after idle ≤ `latency_objective` (60 s)", value: idleLatencyValue("sleep longpoll")},
	{bench: "idle-latency", what: "`idle: sleep`, continuous: the same", goal: "after idle ≤ `latency_objective` (60 s)", value: idleLatencyValue("sleep continuous")},
	{bench: "feed-modes", what: "pouchdb-server 4.2.0, longpoll, 200 changes 10 a second: `_changes` requests per 1,000 changes; write → PostgreSQL row p50 / p95", value: feedModeValue("pouchdb-server longpoll")},
	{bench: "feed-modes", what: "pouchdb-server 4.2.0, continuous: the same", value: feedModeValue("pouchdb-server continuous")},
	{bench: "feed-modes", what: "Sync Gateway 3.1.0, longpoll: the same", value: feedModeValue("sync_gateway longpoll")},
	{bench: "feed-modes", what: "Sync Gateway 3.1.0, continuous: the same", value: feedModeValue("sync_gateway continuous")},
	{bench: "feed-modes", what: "Sync Gateway 3.1.0, websocket: the same", value: feedModeValue("sync_gateway websocket")},
	{bench: "deployed-stack", what: "the demo's 1,000 documents to PostgreSQL, HTTP and S3 through `changesctl run --until-idle`",
		value: func(f *figureReader) string { return f.num("run_seconds", 1) + " s" }},
	{bench: "deployed-stack", what: "the same through the stack deployed to LocalStack, from the poller's Invoke",
		value: func(f *figureReader) string { return f.num("deployed_seconds", 1) + " s" }},
	{bench: "deployed-stack", what: "deployed writer: invocations; median `Duration`; cold starts (each environment's first `Duration`)",
		value: func(f *figureReader) string {
			return f.num("writer_invocations", 0) + "; " + f.num("writer_median_ms", 0) + " ms; " + strings.Join(strings.Fields(f.text("writer_cold_starts")), ", ") + " ms"
		}},
	{bench: "deployed-stack", what: "`localstack/deploy.sh`: build, deploy, secrets, functions `Active`",
		value: func(f *figureReader) string { return f.num("deploy_seconds", 0) + " s" }},
}

// cloudPollerValue formats the cloud-poller ratio to the raw read and the
// rate of one (SQS, outputs) variant.
func cloudPollerValue(variant string, decimals int) func(f *figureReader) string {
	return func(f *figureReader) string {
		return f.num("poller/raw, "+variant, decimals) + " (" + f.num("poller -> "+variant+" docs/s", 0) + " docs/s)"
	}
}

// cloudIdleValue formats an idle job's DynamoDB writes and reads per minute
// and seconds per poller invocation, for one idle setting.
func cloudIdleValue(idle string) func(f *figureReader) string {
	p := "idle " + idle + ": "
	return func(f *figureReader) string {
		return f.num(p+"DynamoDB writes per minute", 1) + ", " + f.num(p+"DynamoDB reads per minute", 1) + "; " + f.num(p+"poller seconds per invocation", 1) + " s"
	}
}

// idleLatencyValue formats the idle-latency figures of one (idle, mode) label.
func idleLatencyValue(label string) func(f *figureReader) string {
	return func(f *figureReader) string {
		return f.num(label+" trickle p50 ms", 0) + " / " + f.num(label+" trickle p99 ms", 0) + " (" + f.num(label+" trickle max ms", 0) + ") ms, " +
			f.num(label+" trickle handoffs", 0) + " handoffs; " +
			f.num(label+" after idle median s", 2) + " / " + f.num(label+" after idle max s", 2) + " s"
	}
}

// feedModeValue formats the feed-modes figures of one (source, mode) label.
func feedModeValue(label string) func(f *figureReader) string {
	return func(f *figureReader) string {
		return f.num(label+" _changes requests per 1k changes", 0) + "; " + f.num(label+" p50 ms", 0) + " / " + f.num(label+" p95 ms", 0) + " ms"
	}
}

// readResults reads a results file written by a run.
func readResults(path string) (*results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode results %s: %w", path, err)
	}
	return &r, nil
}

// writeReport writes the benchmarks page for r, generated from the results
// file named source. A row whose figures r does not hold is left out.
func writeReport(w io.Writer, r *results, source string) error {
	var b strings.Builder
	b.WriteString(`# Benchmarks

For whoever sizes a deployment or checks a change for speed: the latest figures of
` + "`make bench`" + `, each with its goal and the command that measures it again.

<!-- Generated from ` + source + ` by ` + "`go run ./tests/bench -report " + source + "`" + `; ` + "`make bench`" + ` writes both. Do not edit. -->

`)
	fmt.Fprintf(&b, "Measured on %s:\n\n", machineText(r.Machine))
	for _, g := range runGroups(r) {
		fmt.Fprintf(&b, "- %s: on %s at commit `%s`%s.", strings.Join(g.benches, ", "), g.run.Started.UTC().Format("2006-01-02"), commitText(g.run.Commit), dirtyText(g.run.Dirty))
		if g.run.Note != "" {
			b.WriteString(" " + g.run.Note)
		}
		b.WriteString("\n")
	}
	b.WriteString(`
Every command runs from the repository root with the local services up (` + "`make up`" + `) and
` + "`source localstack/env.sh`" + `. ` + "`make bench`" + ` runs them all (` + "`make bench BENCH_ONLY=a,b`" + ` those named), writes
` + "`bench-results.json`" + `, merges its figures into ` + "`docs/bench-results.json`" + ` (replacing those of the
benchmarks it ran) and writes this page from it. Ratios are measured side by side in
one run, in alternating rounds, and reported as medians: on a shared machine single rounds vary
by ±30 %. The cloud figures (` + "`cloud-*`" + `, ` + "`idle-latency`" + `) add 15 ms to every AWS request
through a proxy (` + "`-aws-latency`" + `); the stand-in SQS is an in-memory SQS that answers after
the same latency, as SQS does at these rates, measured beside the local emulator's.

| figure | value | goal | command |
| --- | --- | --- | --- |
`)
	for _, row := range figureRows {
		f := &figureReader{figures: r.Figures[row.bench]}
		value := row.value(f)
		if f.missing {
			continue
		}
		goal := row.goal
		if goal == "" {
			goal = "—"
		}
		command := "go run ./tests/bench -only " + row.bench
		if row.flags != "" {
			command += " " + row.flags
		}
		fmt.Fprintf(&b, "| %s | %s | %s | `%s` |\n", row.what, value, goal, command)
	}
	b.WriteString(`
What sets these figures on a small machine:

- The local emulator's SQS sets the pace of every figure that goes through it (the poller's
  real sends, the backlogs). With the stand-in, what remains is CPU on cores shared by the
  poller, the SDK, the stand-in, pouchdb-server and DynamoDB Local.
- The poller reads up to two pages ahead while it queues, keeps ` + "`send_concurrency`" + ` (` + strconv.Itoa(config.DefaultSendConcurrency) + `)
  requests in flight, and writes a batch's checkpoint while the next is queued.
- The writer's limit is the versions table that monotonic, exactly-once-in-effect writes need,
  and the advisory locks that order concurrent writers of one document.
- The deployed stack: LocalStack's event source mappings hand out one batch at a time, and its
  FIFO mapping one message group per invocation, so the HTTP output's documents go one
  invocation after another
  ([localstack/README.md](../localstack/README.md#what-localstack-does-not-emulate)).
- A trickle's tails grow with the machine's load; ` + "`idle`" + ` does not change how a busy feed is
  read.

[scale.md](scale.md) turns these figures into costs and limits, and compares the lease TTLs'
failover figures.
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// machineText describes the machine of a run.
func machineText(m map[string]any) string {
	var parts []string
	if n, ok := m["cpus"].(float64); ok {
		cpu := fmt.Sprintf("%.0f CPUs", n)
		if model, ok := m["cpu"].(string); ok && model != "" {
			cpu += " (" + model + ")"
		}
		parts = append(parts, cpu)
	}
	for _, k := range []string{"memory", "os", "go"} {
		if s, ok := m[k].(string); ok && s != "" {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "an unnamed machine"
	}
	return strings.Join(parts, ", ")
}

func commitText(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	if c == "" {
		return "unknown"
	}
	return c
}

func dirtyText(dirty bool) string {
	if dirty {
		return " with uncommitted changes"
	}
	return ""
}

// runGroup is the benchmarks one run measured, each with the machine's
// one-minute load average as it began.
type runGroup struct {
	run     run
	benches []string
}

// runGroups groups r's benchmarks by the run that measured them, in the
// order the benchmarks run.
func runGroups(r *results) []runGroup {
	var groups []runGroup
	for _, name := range benchmarkNames(r) {
		x := r.runOf(name)
		i := slices.IndexFunc(groups, func(g runGroup) bool {
			return g.run.Commit == x.Commit && g.run.Started.Format(time.DateOnly) == x.Started.Format(time.DateOnly) &&
				g.run.Dirty == x.Dirty && g.run.Note == x.Note
		})
		if i < 0 {
			groups = append(groups, runGroup{run: x})
			i = len(groups) - 1
		}
		label := "`" + name + "`"
		if x.Load != "" && x.Load != "?" {
			label += " (load " + x.Load + ")"
		}
		groups[i].benches = append(groups[i].benches, label)
	}
	return groups
}

// benchmarkNames lists the benchmarks r holds figures of, registered ones
// in the order they run, then any others by name.
func benchmarkNames(r *results) []string {
	var names []string
	for _, b := range benchmarks {
		if _, ok := r.Figures[b.name]; ok {
			names = append(names, b.name)
		}
	}
	var rest []string
	for name := range r.Figures {
		if !slices.Contains(names, name) {
			rest = append(rest, name)
		}
	}
	slices.Sort(rest)
	return append(names, rest...)
}

// failoverRows are the failover benchmark's rows, for each lease TTL.
func failoverRows(ttls []string) []figureRow {
	var rows []figureRow
	for _, ttl := range ttls {
		p, flags := "ttl "+ttl+" ", "-failover-ttls "+ttl
		pair := func(a, b string, decimals int, unit string) func(f *figureReader) string {
			return func(f *figureReader) string {
				return f.num(p+a, decimals) + " / " + f.num(p+b, decimals) + unit
			}
		}
		rows = append(rows,
			figureRow{bench: "failover", flags: flags, what: "lease TTL " + ttl + ": kill -9 of the active poller → the lease taken; → first checkpoint of the new holder, p50 / p99 each", goal: "first checkpoint p99 ≤ TTL + 0.5 s",
				value: func(f *figureReader) string {
					return pair("failover_kill_to_takeover_p50_s", "failover_kill_to_takeover_p99_s", 2, " s; ")(f) +
						pair("failover_kill_to_first_checkpoint_p50_s", "failover_kill_to_first_checkpoint_p99_s", 2, " s")(f)
				}},
			figureRow{bench: "failover", flags: flags, what: "lease TTL " + ttl + ": graceful handoff, release → the next holder's first change queued; → its first checkpoint, p50 / p99 each", goal: "checkpoint ≤ 2 s",
				value: func(f *figureReader) string {
					return pair("handoff_to_first_queued_p50_s", "handoff_to_first_queued_p99_s", 2, " s; ")(f) +
						pair("handoff_gap_p50_s", "handoff_gap_p99_s", 2, " s")(f)
				}},
			figureRow{bench: "failover", flags: flags, what: "lease TTL " + ttl + ": changes queued by both the killed and the new generation, per failover: median / max", goal: "≤ one batch (200)",
				value: pair("replayed_per_failover_median", "replayed_per_failover_max", 0, "")},
			figureRow{bench: "failover", flags: flags, what: "lease TTL " + ttl + ": after the run, duplicate effects in PostgreSQL; documents differing from the source", goal: "0; 0",
				value: func(f *figureReader) string {
					return f.num(p+"pg_duplicate_effects", 0) + "; " + f.num(p+"pg_docs_differing_from_source", 0)
				}},
		)
	}
	return rows
}

// deployedFailoverRows are the deployed-failover benchmark's rows, for each
// idle setting.
func deployedFailoverRows(idles ...string) []figureRow {
	var rows []figureRow
	for _, idle := range idles {
		p, flags := "idle "+idle+" ", "-idle-settings "+idle
		three := func(a, b, c string) func(f *figureReader) string {
			return func(f *figureReader) string {
				return f.num(p+a, 2) + " / " + f.num(p+b, 2) + " / " + f.num(p+c, 2) + " s"
			}
		}
		rows = append(rows,
			figureRow{bench: "deployed-failover", flags: flags, what: "deployed stack on LocalStack, job defaults, `idle: " + idle + "`: SIGKILL of the lease holder's `bootstrap`, a standby beside it, every other kill at a random moment of the schedule's cycle (kills; seconds after the tick of each) → the lease taken; → the new holder's first checkpoint, p50 / p99 / max each", goal: "first checkpoint ≤ TTL + 1 s (11 s)",
				value: func(f *figureReader) string {
					return f.num(p+"kills", 0) + " (" + strings.Join(strings.Fields(f.text(p+"kill moments s after the tick")), ", ") + " s); " +
						three("kill_to_takeover_p50_s", "kill_to_takeover_p99_s", "kill_to_takeover_max_s")(f) + "; " +
						three("kill_to_first_checkpoint_p50_s", "kill_to_first_checkpoint_p99_s", "kill_to_first_checkpoint_max_s")(f)
				}},
			figureRow{bench: "deployed-failover", flags: flags, what: "the same: the other kills, a second crash within the schedule period, made as soon as a standby (the one the new holder started) marked the job item after the failover before (kills; seconds from that takeover, median / max) → the new holder's first checkpoint, median / max", goal: "first checkpoint ≤ TTL + 1 s (11 s)",
				value: func(f *figureReader) string {
					since := strings.Fields(f.text(p + "second_crash_after_takeover_p50_max_s"))
					took := strings.Fields(f.text(p + "second_crash_to_first_checkpoint_p50_max_s"))
					if len(since) != 2 || len(took) != 2 {
						f.missing = true
						return ""
					}
					return f.num(p+"second_crashes", 0) + " (" + since[0] + " / " + since[1] + " s); " + took[0] + " / " + took[1] + " s"
				}},
			figureRow{bench: "deployed-failover", flags: flags, what: "the same: changes queued by both the killed and the new generation, per failover, median / max; after the run, PostgreSQL documents differing from the source; live documents whose winning revision was never queued", goal: "≤ one batch (500); 0; 0",
				value: func(f *figureReader) string {
					return f.num(p+"replayed_per_failover_median", 0) + " / " + f.num(p+"replayed_per_failover_max", 0) + "; " +
						f.num(p+"pg_docs_differing_from_source", 0) + "; " + f.num(p+"winners_never_queued", 0)
				}},
			figureRow{bench: "deployed-failover", flags: flags, what: "the same: LocalStack's schedule (`rate(1 minute)`), seconds between ticks, median (min, max)",
				value: func(f *figureReader) string {
					minMax := strings.Fields(f.text(p + "tick_interval_min_max_s"))
					if len(minMax) != 2 {
						f.missing = true
						return ""
					}
					return f.num(p+"tick_interval_median_s", 1) + " (" + minMax[0] + ", " + minMax[1] + ")"
				}},
		)
	}
	return rows
}
