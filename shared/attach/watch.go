package attach

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/changes-worker/changes-worker/shared/feed"
)

// watch bounds one transfer from the source: its context is cancelled when
// nothing moved (a byte from the source, a byte taken by S3) for stall, or
// at deadline, with a cause that tells whose failure it is: the source's
// (errStalled, or ends, when the transfer was waiting on the source) or
// S3's (errS3Stalled, errS3Slow).
type watch struct {
	ctx      context.Context
	parent   context.Context
	cancel   context.CancelCauseFunc
	last     atomic.Int64 // when something last moved (Unix nanoseconds)
	inSource atomic.Bool  // waiting on the source (its answer, a read of its body)
	read     atomic.Int64 // bytes read from the source
	done     chan struct{}
}

// Why S3 stopped a watched transfer (transient, never the attachment's).
var (
	errS3Stalled = errors.New("no progress from S3")
	errS3Slow    = errors.New("S3 took the transfer past its time")
)

// newWatch starts watching a transfer that starts now, waiting on the
// source; stop ends it.
func newWatch(parent context.Context, stall time.Duration, deadline time.Time, ends error) *watch {
	ctx, cancel := context.WithCancelCause(parent)
	w := &watch{ctx: ctx, parent: parent, cancel: cancel, done: make(chan struct{})}
	w.inSource.Store(true)
	w.progress()
	start := time.Now()
	go func() {
		tick := time.NewTicker(min(stall/4, time.Second))
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				source := w.inSource.Load()
				switch {
				case !now.Before(deadline) && source:
					cancel(fmt.Errorf("%w: %d bytes read in %s", ends, w.read.Load(), now.Sub(start).Round(time.Millisecond)))
				case !now.Before(deadline):
					cancel(errS3Slow)
				case now.Sub(time.Unix(0, w.last.Load())) < stall:
					continue
				case source:
					cancel(fmt.Errorf("%w for %s, after %d bytes", errStalled, stall, w.read.Load()))
				default:
					cancel(fmt.Errorf("%w for %s", errS3Stalled, stall))
				}
				return
			}
		}
	}()
	return w
}

// stop ends the watch and releases its context.
func (w *watch) stop() {
	close(w.done)
	w.cancel(nil)
}

// progress notes that something moved.
func (w *watch) progress() { w.last.Store(time.Now().UnixNano()) }

// source returns body read under the watch: the transfer waits on the
// source while a read is in progress, every byte read is progress, and a
// failure to read is a *sourceError.
func (w *watch) source(body io.Reader) io.Reader {
	w.inSource.Store(false)
	return &watched{w: w, r: body}
}

type watched struct {
	w *watch
	r io.Reader
}

func (s *watched) Read(p []byte) (int, error) {
	s.w.inSource.Store(true)
	n, err := s.r.Read(p)
	s.w.inSource.Store(false)
	if n > 0 {
		s.w.read.Add(int64(n))
		s.w.progress()
	}
	if err != nil && err != io.EOF {
		err = &sourceError{err: err}
	}
	return n, err
}

// sourceError is a failure to read the source's answer: a connection cut
// (the body ended before its Content-Length) or the transfer stopped.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// stopped reports whose failure it is when the transfer was stopped, and
// nil when it was not: the caller's context ending is returned as it is; a
// stop the watch made is the attachment's failed transfer when it waited on
// the source, and transient otherwise.
func (w *watch) stopped(what string) error {
	if err := w.parent.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if w.ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(w.ctx)
	if errors.Is(cause, errS3Stalled) || errors.Is(cause, errS3Slow) {
		return feed.MarkTransient(fmt.Errorf("%s: %w", what, cause))
	}
	return &transferError{what: what, err: cause}
}

// classify tells whose failure the source's err is: see stopped; then err
// is the attachment's failed transfer when attempted (the source answered
// for it, then failed), else it keeps its class.
func (w *watch) classify(what string, err error, attempted bool) error {
	if serr := w.stopped(what); serr != nil {
		return serr
	}
	if attempted {
		return &transferError{what: what, err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}
