package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Assumptions of TestPollerStandbyEveryMoment about an invocation of the
// poller: EventBridge delivers a tick within its minute and the function may
// start cold, so the invocation begins up to standbyStartLate after its tick;
// it reads or stands by until its deadline less the margin poll keeps to
// release the lease (min(max(timeout/10, 1.5s), 5s)).
const standbyStartLate = 10 * time.Second

func releaseMargin(timeout time.Duration) time.Duration {
	return min(max(timeout/10, 1500*time.Millisecond), 5*time.Second)
}

// TestPollerStandbyEveryMoment synthesizes jobs with the default poller
// timeout and checks, from each job's poller function and schedule rule as
// deployed, that at every moment of the schedule's cycle two invocations
// read or stand by (the active one and a standby that takes over within the
// lease TTL of a crash), and that the function's reserved concurrency admits
// every invocation that runs at once, with the standby a failover starts. A schedule longer than 7 minutes
// cannot have that within Lambda's 15 minutes: its job gets a warning at
// synth, and the check finds the gap the warning names.
func TestPollerStandbyEveryMoment(t *testing.T) {
	synthesized(t) // one synthesis at a time through the jsii runtime
	jobs := []struct {
		id, schedule, idle string
		gap                bool // a part of each period without a standby, warned of
	}{
		{"default", "", "", false},
		{"sleeps", "", "sleep", false},
		{"two", "2m", "watch", false},
		{"five", "5m", "watch", false},
		{"seven", "7m", "watch", false},
		{"ten", "10m", "watch", true},
	}
	doc := `{"stack": {"prefix": "cwstandby"}, "jobs": [`
	for i, j := range jobs {
		if i > 0 {
			doc += ","
		}
		extra := ""
		if j.schedule != "" {
			extra += fmt.Sprintf(`"schedule": %q, `, j.schedule)
		}
		if j.idle != "" {
			extra += fmt.Sprintf(`"idle": %q, `, j.idle)
		}
		doc += fmt.Sprintf(`{"id": %q, %s"source": {"type": "couchdb", "url": "https://couch.example.com/%s"},
  "outputs": [{"id": "pg", "type": "postgres", "postgres": {"dsn": {"env": "PG_DSN"}, "table": %q}}]}`, j.id, extra, j.id, j.id)
	}
	doc += `]}`
	syn, err := synthesizeDoc(t, doc)
	if err != nil {
		t.Fatal(err)
	}
	rate := regexp.MustCompile(`^rate\((\d+) minutes?\)$`)
	for i, j := range syn.cfg.Jobs {
		t.Run(j.ID, func(t *testing.T) {
			warned := false
			for _, m := range syn.messages {
				warned = warned || strings.EqualFold(m.level, "warning") && strings.Contains(m.text, "jobs["+j.ID+"].schedule: ") && strings.Contains(m.text, "no invocation standing by")
			}
			if warned != jobs[i].gap {
				t.Errorf("warned of a standby gap: %v, want %v (messages %v)", warned, jobs[i].gap, syn.messages)
			}
			_, fn := syn.resource(t, "AWS::Lambda::Function", "FunctionName", functionName(syn.cfg, j, fnPoller))
			_, rule := syn.resource(t, "AWS::Events::Rule", "Name", scheduleName(syn.cfg, j))
			m := rate.FindStringSubmatch(fmt.Sprint(props(rule)["ScheduleExpression"]))
			if m == nil {
				t.Fatalf("ScheduleExpression = %v, want rate(N minutes)", props(rule)["ScheduleExpression"])
			}
			minutes, _ := strconv.Atoi(m[1])
			period := time.Duration(minutes) * time.Minute
			seconds, _ := props(fn)["Timeout"].(float64)
			timeout := time.Duration(seconds * float64(time.Second))
			reserved, _ := props(fn)["ReservedConcurrentExecutions"].(float64)
			// Ticks 0..n; look at the cycle of tick n/2, far from the first.
			const n, step = 40, 500 * time.Millisecond
			var short []time.Duration // moments with fewer than two reading or standing by
			for at := time.Duration(0); at < period; at += step {
				now := n/2*period + at
				watching, running := 0, 0
				for k := range n {
					tick := time.Duration(k) * period
					// Certainly reading or standing by, however late it started.
					if now >= tick+standbyStartLate && now < tick+timeout-releaseMargin(timeout) {
						watching++
					}
					// Possibly running: from its tick to its deadline, started late.
					if now >= tick && now < tick+standbyStartLate+timeout {
						running++
					}
				}
				if watching < 2 {
					short = append(short, at)
				}
				// And the standby a failover starts, beside a holder that hung.
				if float64(running+1) > reserved {
					t.Errorf("poller timeout %s, schedule %s: at %s of the cycle %d invocations may run, and a failover's standby, reserved concurrency %v",
						timeout, period, at, running, reserved)
					break
				}
			}
			if len(short) > 0 && !jobs[i].gap {
				t.Errorf("poller timeout %s, schedule %s: for %s of every cycle (%s) fewer than two invocations read or stand by, want the active one and a standby at every moment",
					timeout, period, time.Duration(len(short))*step, stretches(short, step, period))
			}
			if len(short) == 0 && jobs[i].gap {
				t.Errorf("poller timeout %s, schedule %s: a standby at every moment, but the synth warned of a gap", timeout, period)
			}
		})
	}
}

// stretches describes the moments of a cycle of length period, sampled every
// step, as the stretches they make ("25s to 70s"), a stretch that runs past
// the cycle's end into the next cycle's start shown as one.
func stretches(moments []time.Duration, step, period time.Duration) string {
	type stretch struct{ from, to time.Duration }
	var out []stretch
	for _, m := range moments {
		if n := len(out); n > 0 && out[n-1].to == m {
			out[n-1].to = m + step
			continue
		}
		out = append(out, stretch{m, m + step})
	}
	if n := len(out); n > 1 && out[0].from == 0 && out[n-1].to == period {
		out[0].from, out = out[n-1].from, out[:n-1]
		out[0].to += period
	}
	text := ""
	for i, s := range out {
		if i > 0 {
			text += ", "
		}
		text += fmt.Sprintf("%s to %s", s.from, s.to)
	}
	return text
}
