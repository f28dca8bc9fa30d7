package feed

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/changes-worker/changes-worker/shared/config"
)

// streamed answers a streaming request with the chunks, flushing after each
// and pausing between them, then holds the connection until the client
// leaves (or closes it when hangUp is set).
func streamed(contentType string, pause time.Duration, hangUp bool, chunks ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for _, c := range chunks {
			io.WriteString(w, c)
			rc.Flush()
			select {
			case <-time.After(pause):
			case <-r.Context().Done():
				return
			}
		}
		if !hangUp {
			<-r.Context().Done()
		}
	}
}

func sgRow(seq, id, rev string) string {
	return fmt.Sprintf(`{"seq":%s,"id":%q,"changes":[{"rev":%q}]}`, seq, id, rev)
}

func TestStreamContinuousAndEvents(t *testing.T) {
	t.Parallel()
	continuous := []string{
		sgRow(`1`, "a", "1-a") + "\n",
		"\n", // heartbeat
		sgRow(`2`, "b", "1-b") + "\n" + `{"seq":3,"id":"c","deleted":true,"changes":[{"rev":"2-c"}]}` + "\n",
	}
	events := []string{
		": comment\n\n",
		"id: 1\ndata: " + sgRow(`1`, "a", "1-a") + "\n\n",
		"event: heartbeat\ndata:\n\n",
		"data: " + sgRow(`2`, "b", "1-b") + "\nid: 2\n\ndata: " + `{"seq":3,"id":"c","deleted":true,"changes":[{"rev":"2-c"}]}` + "\n\n",
	}
	want := []Row{
		{Seq: raw(`1`), ID: "a", Rev: "1-a"},
		{Seq: raw(`2`), ID: "b", Rev: "1-b"},
		{Seq: raw(`3`), ID: "c", Rev: "2-c", Deleted: true},
	}
	tests := []struct {
		name, mode, source, contentType string
		chunks                          []string
	}{
		{name: "continuous couchdb", mode: config.ModeContinuous, source: config.SourceCouchDB, contentType: "application/json", chunks: continuous},
		{name: "eventsource couchdb", mode: config.ModeEventSource, source: config.SourceCouchDB, contentType: "text/event-stream", chunks: events},
		{name: "sse edge server", mode: config.ModeSSE, source: config.SourceEdgeServer, contentType: "text/event-stream; charset=utf-8", chunks: events},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, streamed(tt.contentType, 20*time.Millisecond, false, tt.chunks...))
			c := f.client(func(o *Options) { o.SourceType, o.Fetch = tt.source, config.FetchBulkGet })
			s, err := c.Stream(t.Context(), raw(`0`), StreamOptions{Mode: tt.mode, Heartbeat: time.Second})
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			defer s.Close()
			var got []Row
			for len(got) < 3 {
				b, err := s.Next(t.Context(), 2*time.Second)
				if err != nil {
					t.Fatalf("Next: %v", err)
				}
				if len(b.Rows) == 0 {
					t.Fatalf("no row within 2s; have %+v", got)
				}
				got = append(got, b.Rows...)
				if want := got[len(got)-1].Seq; string(b.LastSeq) != string(want) {
					t.Errorf("LastSeq %s, want the last row's %s", b.LastSeq, want)
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			b, err := s.Next(t.Context(), 100*time.Millisecond)
			if err != nil || len(b.Rows) != 0 || !b.CaughtUp() || string(b.LastSeq) != `3` {
				t.Errorf("quiet stream: %+v, %v; want an empty caught-up batch at 3", b, err)
			}
			u := f.requests()[0].RequestURI
			if !strings.Contains(u, "feed="+tt.mode) || !strings.Contains(u, "heartbeat=1000") || !strings.Contains(u, "since=0") {
				t.Errorf("request %s", u)
			}
		})
	}
}

// TestStreamGreedyDrain: rows already received leave together, at most Limit.
func TestStreamGreedyDrain(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for i := 1; i <= 25; i++ {
		all.WriteString(sgRow(fmt.Sprint(i), fmt.Sprint("d", i), "1-x") + "\n")
	}
	s := openContinuous(t, all.String(), func(o *Options) { o.Limit, o.Fetch = 10, config.FetchBulkGet })
	time.Sleep(200 * time.Millisecond) // let every row arrive
	var sizes []int
	var full []bool
	for range 3 {
		time.Sleep(100 * time.Millisecond) // the reader refills the buffer
		b, err := s.Next(t.Context(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		sizes, full = append(sizes, len(b.Rows)), append(full, b.Full)
	}
	if !cmp.Equal(sizes, []int{10, 10, 5}) || !cmp.Equal(full, []bool{true, true, false}) {
		t.Errorf("batch sizes %v full %v, want [10 10 5] [true true false]", sizes, full)
	}
}

// TestStreamEnds: a source that ends the feed, drops it, or falls silent
// makes Next fail with a transient error once the buffered rows are out.
func TestStreamEnds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		h    http.HandlerFunc
	}{
		{name: "last_seq ends the feed", h: streamed("application/json", 0, true, sgRow(`1`, "a", "1-a")+"\n"+`{"last_seq":1}`+"\n")},
		{name: "connection dropped", h: streamed("application/json", 0, true, sgRow(`1`, "a", "1-a")+"\n")},
		{name: "silent past three heartbeats", h: streamed("application/json", 0, false, sgRow(`1`, "a", "1-a")+"\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeSource(t, tt.h)
			c := f.client(func(o *Options) { o.Fetch = config.FetchBulkGet })
			s, err := c.Stream(t.Context(), nil, StreamOptions{Mode: config.ModeContinuous, Heartbeat: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b, err := s.Next(t.Context(), time.Second)
			if err != nil || len(b.Rows) != 1 {
				t.Fatalf("first Next: %+v, %v; want the row", b, err)
			}
			deadline := time.Now().Add(3 * time.Second)
			for {
				_, err = s.Next(t.Context(), 100*time.Millisecond)
				if err != nil || time.Now().After(deadline) {
					break
				}
			}
			if !errors.Is(err, ErrStreamEnded) || !Transient(err) {
				t.Errorf("Next after the end: %v, want a transient ErrStreamEnded", err)
			}
		})
	}
}

// TestStreamRefused: errors before the stream starts.
func TestStreamRefused(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, reply(401, `{"error":"unauthorized","reason":"Login required"}`))
	_, err := f.client(nil).Stream(t.Context(), nil, StreamOptions{Mode: config.ModeContinuous})
	var se *StatusError
	if !errors.As(err, &se) || se.Status != 401 || Transient(err) {
		t.Errorf("401: %v", err)
	}
	// pouchdb-server answers feed=eventsource as a normal JSON feed.
	g := newFakeSource(t, replyType(200, "text/plain; charset=utf-8", `{"results":[],"last_seq":0}`))
	if _, err := g.client(nil).Stream(t.Context(), nil, StreamOptions{Mode: config.ModeEventSource}); !errors.Is(err, ErrModeUnsupported) || Transient(err) {
		t.Errorf("eventsource answered as JSON: %v, want permanent ErrModeUnsupported", err)
	}
	for _, tt := range []struct{ mode, source string }{
		{config.ModeWebSocket, config.SourceCouchDB}, {config.ModeSSE, config.SourceSyncGateway},
		{config.ModeEventSource, config.SourceEdgeServer}, {config.ModeLongpoll, config.SourceCouchDB}, {"poll", config.SourceCouchDB},
	} {
		c := g.client(func(o *Options) { o.SourceType = tt.source })
		if _, err := c.Stream(t.Context(), nil, StreamOptions{Mode: tt.mode}); !errors.Is(err, ErrModeUnsupported) {
			t.Errorf("mode %s on %s: %v, want ErrModeUnsupported", tt.mode, tt.source, err)
		}
	}
}

// TestStreamHeadersLate: a source that sends its answer's headers only with
// the first change or heartbeat (pouchdb-server with nothing new) does not
// hold Stream up past acceptWait; the row comes from Next, and a refusal
// that comes late comes from Next too, still permanent.
func TestStreamHeadersLate(t *testing.T) {
	t.Parallel()
	late := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(acceptWait + 500*time.Millisecond):
				h(w, r)
			case <-r.Context().Done():
			}
		}
	}
	f := newFakeSource(t, late(streamed("application/json", 0, false, sgRow(`7`, "a", "1-a")+"\n")))
	began := time.Now()
	s, err := f.client(nil).Stream(t.Context(), []byte("6"), StreamOptions{Mode: config.ModeContinuous})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := time.Since(began); d > acceptWait+250*time.Millisecond {
		t.Errorf("Stream returned after %s, want about %s", d, acceptWait)
	}
	b, err := s.Next(t.Context(), 5*time.Second)
	if err != nil || len(b.Rows) != 1 || string(b.LastSeq) != "7" {
		t.Fatalf("Next: %+v, %v; want the row with seq 7", b, err)
	}

	g := newFakeSource(t, late(replyType(200, "text/plain; charset=utf-8", `{"results":[],"last_seq":0}`)))
	s, err = g.client(nil).Stream(t.Context(), nil, StreamOptions{Mode: config.ModeEventSource})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Next(t.Context(), 5*time.Second); !errors.Is(err, ErrModeUnsupported) || Transient(err) {
		t.Errorf("late eventsource answered as JSON: %v, want permanent ErrModeUnsupported", err)
	}
}

// openContinuous opens a continuous stream, from the beginning, on a fake
// source that sends body at once; the client's options are edited by edit.
// The stream is closed when the test ends.
func openContinuous(t *testing.T, body string, edit func(*Options)) *Stream {
	t.Helper()
	f := newFakeSource(t, streamed("application/json", 0, false, body))
	s, err := f.client(edit).Stream(t.Context(), nil, StreamOptions{Mode: config.ModeContinuous, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rowsWithDocs is a continuous feed of n rows d1..dn (seq 1..n), each with
// its doc padded by pad bytes.
func rowsWithDocs(n, pad int) string {
	var all strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&all, `{"seq":%d,"id":"d%d","changes":[{"rev":"1-x"}],"doc":{"_id":"d%d","_rev":"1-x","pad":%q}}`+"\n", i, i, i, strings.Repeat("x", pad))
	}
	return all.String()
}

// TestStreamNextPageBudget: Next hands out a page's worth of rows at most
// (PageBytes, the row that reaches it included), as Changes does, and
// leaves the rest in the stream for the next call.
func TestStreamNextPageBudget(t *testing.T) {
	t.Parallel()
	s := openContinuous(t, rowsWithDocs(25, 200), func(o *Options) { o.Limit, o.PageBytes = 100, 1000 })
	time.Sleep(200 * time.Millisecond) // let every row arrive
	var got []Row
	for len(got) < 25 {
		b, err := s.Next(t.Context(), time.Second)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if len(b.Rows) == 0 {
			t.Fatalf("no row within 1s; have %d", len(got))
		}
		size := docBytes(b.Rows[:len(b.Rows)-1])
		if size >= 1000 || (docBytes(b.Rows) >= 1000 && !b.Full) {
			t.Errorf("batch of %d rows (%d bytes of bodies before its last row, full %t): want it to end at the row that reaches page_bytes (1000), full",
				len(b.Rows), size, b.Full)
		}
		if want := b.Rows[len(b.Rows)-1].Seq; string(b.LastSeq) != string(want) {
			t.Errorf("LastSeq %s, want the last row's %s", b.LastSeq, want)
		}
		got = append(got, b.Rows...)
	}
	for i, r := range got {
		if want := fmt.Sprint("d", i+1); r.ID != want {
			t.Fatalf("row %d is %s, want %s: rows must come once each, in order", i, r.ID, want)
		}
	}
}

// TestStreamBufferBounded: rows a stream received and Next has not taken
// hold at most PageBytes, however fast the source sends them.
func TestStreamBufferBounded(t *testing.T) {
	t.Parallel()
	const budget = 50 << 10
	s := openContinuous(t, rowsWithDocs(150, 10<<10), func(o *Options) { o.Limit, o.PageBytes = 100, budget })
	time.Sleep(500 * time.Millisecond) // the reader fills what it may
	held, rows := 0, 0
	for drained := false; !drained; {
		select {
		case r := <-s.buf.rows:
			held, rows = held+len(r), rows+1
		default:
			drained = true
		}
	}
	if held > budget {
		t.Errorf("the stream buffered %d rows, %d bytes, with nobody taking them: want at most page_bytes (%d)", rows, held, budget)
	}
}

// TestStreamEventBounds: an event stream whose event never ends (data:
// lines without the blank line that ends an event) fails within
// max_answer_bytes and within the watchdog's time, a clear transient
// error, instead of growing; so does a continuous line that never ends.
func TestStreamEventBounds(t *testing.T) {
	t.Parallel()
	line := "data: " + strings.Repeat("x", 64<<10) + "\n"
	// endless writes line forever, pausing between writes; written counts
	// what it wrote.
	endless := func(contentType, line string, pause time.Duration, written *atomic.Int64) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", contentType)
			w.WriteHeader(http.StatusOK)
			rc := http.NewResponseController(w)
			for {
				n, err := io.WriteString(w, line)
				written.Add(int64(n))
				if err != nil || rc.Flush() != nil {
					return
				}
				select {
				case <-time.After(pause):
				case <-r.Context().Done():
					return
				}
			}
		}
	}
	const limit = 1 << 20
	tests := []struct {
		name, mode, contentType, line string
		pause, heartbeat              time.Duration
		maxAnswer                     int64
		want                          string
	}{
		// Only the byte bound can end these: the watchdog allows a minute.
		{name: "an event that never ends, sent fast", mode: config.ModeEventSource, contentType: "text/event-stream", line: line,
			heartbeat: 20 * time.Second, maxAnswer: limit, want: "max_answer_bytes"},
		{name: "a line that never ends, sent fast", mode: config.ModeContinuous, contentType: "application/json", line: strings.Repeat("x", 64<<10),
			heartbeat: 20 * time.Second, maxAnswer: limit, want: "max_answer_bytes"},
		// Only the watchdog can end this one before the test does.
		{name: "an event that never ends, sent slowly", mode: config.ModeEventSource, contentType: "text/event-stream", line: line,
			pause: 20 * time.Millisecond, heartbeat: 500 * time.Millisecond, maxAnswer: 1 << 30, want: "within 1.5s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var written atomic.Int64
			f := newFakeSource(t, endless(tt.contentType, tt.line, tt.pause, &written))
			c := f.client(func(o *Options) { o.MaxAnswerBytes, o.Fetch = tt.maxAnswer, config.FetchBulkGet })
			s, err := c.Stream(t.Context(), nil, StreamOptions{Mode: tt.mode, Heartbeat: tt.heartbeat})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			began := time.Now()
			for time.Since(began) < 5*time.Second {
				if _, err = s.Next(t.Context(), 100*time.Millisecond); err != nil {
					break
				}
			}
			took := time.Since(began)
			t.Logf("Next failed after %s, the source having written %d KiB: %v", took.Round(time.Millisecond), written.Load()>>10, err)
			if err == nil {
				t.Fatalf("no error within %s; the source wrote %d MiB", took.Round(time.Millisecond), written.Load()>>20)
			}
			if !Transient(err) || !errors.Is(err, ErrStreamEnded) && !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Next after %s, %d KiB written: %v; want a transient error saying %q", took, written.Load()>>10, err, tt.want)
			}
			if n := written.Load(); tt.maxAnswer == limit && n > 16*limit {
				t.Errorf("the source wrote %d MiB before the stream failed: want a bound near max_answer_bytes (%d)", n>>20, limit)
			}
		})
	}
}

// TestStreamWaitingForRoomIsNotSilence: a reader that waits for Next to
// make room in the buffer is not a silent source: the stream outlives its
// watchdog however long the caller takes, and every row comes.
func TestStreamWaitingForRoomIsNotSilence(t *testing.T) {
	t.Parallel()
	f := newFakeSource(t, streamed("application/json", 0, false, rowsWithDocs(20, 10<<10)))
	c := f.client(func(o *Options) { o.Limit, o.PageBytes = 100, 64<<10 })
	s, err := c.Stream(t.Context(), nil, StreamOptions{Mode: config.ModeContinuous, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := 0
	for got < 20 {
		time.Sleep(time.Second) // three heartbeats and more between batches
		b, err := s.Next(t.Context(), time.Second)
		if err != nil {
			t.Fatalf("Next after %d rows: %v", got, err)
		}
		got += len(b.Rows)
	}
}
