package poll

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/changes-worker/changes-worker/shared/feed"
)

// aheadPages is how many pages the reader holds, read and not yet taken.
// Together with the page being read and the batch being queued, a poller
// catching up has at most aheadPages+2 pages in memory, and fewer when
// they are large (see readAhead).
const aheadPages = 2

// readAhead reads the feed in the background, page after page, while the
// batches before are queued, so that a poller catching up waits on the
// source or on its sends, whichever is slower, not on both one after the
// other. Reads have no side effects: a page that is never taken is simply
// dropped. The reader holds at most aheadPages pages, and reads no further
// while what it holds reaches the chunk byte budget, so large documents
// keep at most one page read ahead. It stops after a page that ends the
// feed (see invocation.more) and after a failed read, which it hands over
// like a page.
type readAhead struct {
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reader has stopped
	arrived chan struct{} // a page arrived (capacity 1)
	room    chan struct{} // a page was taken (capacity 1)

	mu    sync.Mutex
	pages []aheadPage
	bytes int // of the documents in pages
}

// aheadPage is one read: the page from since, or the error reading it.
type aheadPage struct {
	since json.RawMessage
	batch *feed.Batch
	err   error
	bytes int
}

// readAhead starts reading from since. timeout is the long-poll timeout of
// every read; a page is read ahead only when the source has more, so it
// is answered at once.
func (v *invocation) readAhead(ctx context.Context, since json.RawMessage, timeout time.Duration) *readAhead {
	rctx, cancel := context.WithCancel(ctx)
	r := &readAhead{cancel: cancel, done: make(chan struct{}), arrived: make(chan struct{}, 1), room: make(chan struct{}, 1)}
	budget := v.chunkBytes()
	go func() {
		defer close(r.done)
		for r.waitRoom(rctx, budget) {
			b, err := v.fetch(rctx, since, timeout)
			if rctx.Err() != nil {
				return // stopped: nobody takes it
			}
			r.put(aheadPage{since: since, batch: b, err: err, bytes: docBytes(b)})
			if err != nil || !v.more(b) {
				return
			}
			since = nextSince(b)
		}
	}()
	return r
}

// waitRoom waits until the reader holds fewer than aheadPages pages and
// fewer than budget bytes; false when it was stopped meanwhile.
func (r *readAhead) waitRoom(ctx context.Context, budget int) bool {
	for {
		r.mu.Lock()
		full := len(r.pages) >= aheadPages || r.bytes >= budget
		r.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-r.room:
		case <-ctx.Done():
			return false
		}
	}
}

func (r *readAhead) put(p aheadPage) {
	r.mu.Lock()
	r.pages = append(r.pages, p)
	r.bytes += p.bytes
	r.mu.Unlock()
	signal(r.arrived)
}

// take returns the page read from since, with the pages after it that have
// already arrived merged in, up to maxRows rows and maxBytes of documents:
// on a feed read faster than it is queued, sends grow to whole chunks and
// a checkpoint covers them all. ok is false when the reader has nothing
// from since (it read from elsewhere, or stopped before); the caller then
// reads for itself.
func (r *readAhead) take(ctx context.Context, since json.RawMessage, maxRows, maxBytes int) (b *feed.Batch, ok bool, err error) {
	for {
		r.mu.Lock()
		if len(r.pages) > 0 {
			break // unlocked below
		}
		r.mu.Unlock()
		select {
		case <-r.arrived:
		case <-r.done:
			r.mu.Lock()
			empty := len(r.pages) == 0
			r.mu.Unlock()
			if empty {
				return nil, false, nil
			}
		case <-ctx.Done():
			return nil, true, ctx.Err()
		}
	}
	defer signal(r.room)
	defer r.mu.Unlock()
	first := r.pop()
	if string(first.since) != string(since) {
		return nil, false, nil
	}
	if first.err != nil {
		return nil, true, first.err
	}
	b, size := first.batch, first.bytes
	for len(r.pages) > 0 && mergeable(b) {
		p := r.pages[0]
		if p.err != nil || !mergeable(p.batch) || len(b.Rows)+len(p.batch.Rows) > maxRows || size+p.bytes > maxBytes {
			break
		}
		r.pop()
		b = &feed.Batch{Rows: append(b.Rows, p.batch.Rows...), LastSeq: p.batch.LastSeq, Pending: p.batch.Pending, Full: p.batch.Full}
		size += p.bytes
	}
	return b, true, nil
}

// pop removes the first page held; r.mu is held.
func (r *readAhead) pop() aheadPage {
	p := r.pages[0]
	r.pages[0] = aheadPage{}
	r.pages = r.pages[1:]
	r.bytes -= p.bytes
	return p
}

// ready reports whether a page has arrived and waits to be taken (false for
// a nil reader).
func (r *readAhead) ready() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pages) > 0
}

// await waits until a page arrives (true), or until done is closed or the
// reader stops (false). A nil reader waits for done.
func (r *readAhead) await(ctx context.Context, done <-chan struct{}) bool {
	if r == nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
		return false
	}
	select {
	case <-r.arrived:
		signal(r.arrived) // for take
		return true
	case <-done:
	case <-r.done:
	case <-ctx.Done():
	}
	return false
}

// stop abandons the reader (nil: nothing to stop) and waits for it.
func (r *readAhead) stop() {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

// mergeable reports whether another page may be appended to b: b is whole
// (not cut short) and every row of it names a document, so the merged
// batch means just what the two pages did.
func mergeable(b *feed.Batch) bool {
	return len(b.Rows) > 0 && b.Cut == "" && len(b.Malformed) == 0
}

// docBytes is the size of b's document bodies.
func docBytes(b *feed.Batch) int {
	if b == nil {
		return 0
	}
	n := 0
	for _, r := range b.Rows {
		n += len(r.Doc)
	}
	return n
}

// signal wakes whoever waits on c, without waiting itself.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
