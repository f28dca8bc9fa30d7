package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/changes-worker/changes-worker/shared/testenv"
)

// ProcOptions shape one `changesctl run --no-writer` process.
type ProcOptions struct {
	// Name labels the process in logs and reports ("a", "b", ...).
	Name string
	// Tick is the schedule interval: a new poller invocation starts at
	// every tick, so a standby is always waiting while Tick is shorter than
	// PollerTimeout minus the budget margin.
	Tick time.Duration
	// PollerTimeout is each invocation's deadline.
	PollerTimeout time.Duration
	// ClockSkew offsets the process's poller clock (--clock-skew).
	ClockSkew time.Duration
	// DynamoDB and SQS, when set, are the endpoints the process uses for
	// those services instead of AWS_ENDPOINT_URL (a proxy).
	DynamoDB, SQS string
}

// Proc is one poller process. Its methods are safe for concurrent use.
type Proc struct {
	Name    string
	Options ProcOptions
	Started time.Time

	cmd  *exec.Cmd
	done chan struct{}
	err  error // after done

	mu     sync.Mutex
	lines  []string
	events []Event
}

// Event is a lease event a poller process logged.
type Event struct {
	Time       time.Time // when it was logged (real time: --clock-skew skews only the poller's clock)
	Msg        string    // "lease acquired", "lease released", "lease lost; stopping", "standing by"
	Owner      string
	Generation int64
	Takeover   string // for "lease acquired"
	Previous   string // for "lease acquired": the previous owner
	Holder     string // for "standing by": the owner it waits for
	Proc       string // the process's name
	PID        int
}

// Start starts a poller process for the stack.
func (s *Stack) Start(bin string, o ProcOptions) (*Proc, error) {
	args := []string{"run", "--config", s.ConfigPath, "--no-writer",
		"--tick", o.Tick.String(), "--poller-timeout", o.PollerTimeout.String()}
	if o.ClockSkew != 0 {
		args = append(args, "--clock-skew", o.ClockSkew.String())
	}
	cmd := exec.Command(bin, args...)
	// The stack's bucket, named: changesctl would otherwise look for a
	// deployed stack of the prefix in CloudFormation before its first
	// invocation, and LocalStack's CloudFormation, busy with the deploys of
	// other tests, has taken longer than a scenario waits for its first event.
	cmd.Env = append(testenv.Environ(), "CHANGES_BUCKET="+s.Config.Stack.Bucket)
	if o.DynamoDB != "" {
		cmd.Env = append(cmd.Env, "AWS_ENDPOINT_URL_DYNAMODB="+o.DynamoDB)
	}
	if o.SQS != "" {
		cmd.Env = append(cmd.Env, "AWS_ENDPOINT_URL_SQS="+o.SQS)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start poller %s: %w", o.Name, err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	p := &Proc{Name: o.Name, Options: o, cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start poller %s: %w", o.Name, err)
	}
	w.Close() // the child holds its copy
	p.Started = time.Now()
	read := make(chan struct{})
	go func() {
		defer close(read)
		p.read(r)
	}()
	go func() {
		err := cmd.Wait()
		<-read
		p.err = err
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

func (p *Proc) read(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		ev, ok := parseEvent(line)
		p.mu.Lock()
		p.lines = append(p.lines, line)
		if ok {
			ev.Proc, ev.PID = p.Name, p.PID()
			p.events = append(p.events, ev)
		}
		p.mu.Unlock()
	}
}

// leaseMessages are the poller's log messages that become Events.
var leaseMessages = map[string]bool{
	"lease acquired": true, "lease released": true, "lease lost; stopping": true, "standing by": true,
}

// parseEvent reads a lease event from a slog text line.
func parseEvent(line string) (Event, bool) {
	kv := parseLogfmt(line)
	if !leaseMessages[kv["msg"]] {
		return Event{}, false
	}
	ev := Event{Msg: kv["msg"], Owner: kv["owner"], Takeover: kv["takeover"], Previous: kv["previous_owner"], Holder: kv["holder"]}
	ev.Time, _ = time.Parse(time.RFC3339Nano, kv["time"])
	ev.Generation, _ = strconv.ParseInt(kv["generation"], 10, 64)
	return ev, true
}

// parseLogfmt splits a slog text line into its key=value pairs; quoted
// values are unquoted.
func parseLogfmt(line string) map[string]string {
	out := map[string]string{}
	for len(line) > 0 {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq <= 0 {
			break
		}
		key := line[:eq]
		line = line[eq+1:]
		if strings.HasPrefix(line, `"`) {
			// Find the closing quote, skipping escaped ones.
			end := 1
			for end < len(line) && line[end] != '"' {
				if line[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(line) {
				break
			}
			v, err := strconv.Unquote(line[:end+1])
			if err != nil {
				v = line[1:end]
			}
			out[key] = v
			line = line[end+1:]
			continue
		}
		sp := strings.IndexByte(line, ' ')
		if sp < 0 {
			sp = len(line)
		}
		out[key] = line[:sp]
		line = line[sp:]
	}
	return out
}

// Events returns the lease events logged so far.
func (p *Proc) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// Log returns the process's output so far.
func (p *Proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// Tail returns the last n lines of the process's output.
func (p *Proc) Tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lines
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// WaitEvent waits until the process logged an event that match accepts.
func (p *Proc) WaitEvent(ctx context.Context, timeout time.Duration, match func(Event) bool) (Event, error) {
	var found Event
	err := testenv.Poll(ctx, timeout, 50*time.Millisecond, func(context.Context) (bool, error) {
		evs := p.Events()
		i := slices.IndexFunc(evs, match)
		if i >= 0 {
			found = evs[i]
		}
		return i >= 0, nil
	})
	if errors.Is(err, testenv.ErrTimeout) {
		err = fmt.Errorf("process %s (pid %d) logged no such event within %s", p.Name, p.PID(), timeout)
	}
	return found, err
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s to %s (pid %d): %w", sig, p.Name, p.PID(), err)
	}
	return nil
}

// Kill sends SIGKILL and waits for the process to end.
func (p *Proc) Kill() error {
	if p.Exited() {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil && !p.Exited() {
		return err
	}
	<-p.done
	return nil
}

// Stop freezes the process (SIGSTOP); Continue resumes it (SIGCONT).
func (p *Proc) Stop() error     { return p.Signal(syscall.SIGSTOP) }
func (p *Proc) Continue() error { return p.Signal(syscall.SIGCONT) }

// Terminate asks the process to stop (SIGTERM: its invocations end and
// release the lease) and waits up to timeout, then kills it.
func (p *Proc) Terminate(timeout time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.Signal(syscall.SIGCONT) // a stopped process cannot handle SIGTERM
	if err := p.Signal(syscall.SIGTERM); err != nil && !p.Exited() {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		_ = p.Kill()
		return fmt.Errorf("poller %s (pid %d) did not stop within %s of SIGTERM; killed", p.Name, p.PID(), timeout)
	}
}
