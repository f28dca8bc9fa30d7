package feed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/semaphore"

	"github.com/changes-worker/changes-worker/shared/config"
)

// ErrModeUnsupported is returned by Stream when the source does not offer the
// requested feed mode (pouchdb-server answers feed=eventsource as a normal
// feed, for example). It is permanent: the job's feed.mode must change.
var ErrModeUnsupported = errors.New("feed mode not supported by the source")

// ErrStreamEnded is returned by Stream.Next once the source closed the
// stream or nothing whole (a row, an event, a heartbeat) arrived for longer
// than its heartbeat allows. It is transient: read from the last batch's
// LastSeq again.
var ErrStreamEnded = errors.New("change stream ended")

// Defaults for StreamOptions.
const (
	DefaultHeartbeat = 30 * time.Second
	// sgMinHeartbeat is the shortest heartbeat Sync Gateway grants.
	sgMinHeartbeat = 25 * time.Second
)

// StreamOptions configure Client.Stream.
type StreamOptions struct {
	// Mode is config.ModeContinuous, ModeWebSocket (Sync Gateway, App
	// Services), ModeSSE (Edge Server) or ModeEventSource (CouchDB).
	Mode string
	// Heartbeat is the interval at which the source is asked to show it is
	// alive; a stream silent for three heartbeats is dropped. Default
	// DefaultHeartbeat; at least 25s on Sync Gateway and App Services,
	// which raise anything shorter to that.
	Heartbeat time.Duration
}

// Stream is one open streaming feed: a goroutine reads the source's changes
// into a buffer and Next hands them out in batches. Next and Close must not
// be called concurrently with each other.
//
// A stream holds what a page holds (see Changes): one message of the source
// (a line, an event, a WebSocket message) is at most Options.MaxAnswerBytes,
// the rows received and not yet taken hold at most Options.PageBytes (and
// twice Options.Limit rows), and a batch from Next ends at the row that
// reaches PageBytes.
//
// How a poller uses it, inside the same lease and checkpoint rules as with
// Changes: catch up with Changes until a batch is CaughtUp; open a Stream
// from that batch's LastSeq; then loop on Next, FetchBatch, queue and
// checkpoint each batch as if Changes had returned it; on any error Close the
// stream and go back to catching up with Changes (with backoff) from the last
// checkpointed LastSeq. A batch cut after Next (Batch.Cut, by FetchBatch or
// the caller) ends before rows the stream has already handed out: Close the
// stream too, and read on with Changes from the batch's LastSeq. Close
// before the invocation ends.
type Stream struct {
	c      *Client
	buf    *rowBuffer
	cancel context.CancelFunc
	done   chan struct{}
	pos    json.RawMessage // the seq of the last row handed out
	n      int             // rows handed out, for error messages
	dog    *watchdog

	mu  sync.Mutex
	err error // why the reader stopped
}

// Stream opens the feed in a streaming mode from since (exactly as the source
// wrote it; nil starts from the beginning) and returns once the source has
// accepted the request, or after acceptWait when it has not answered yet (a
// refusal then comes from Next). The stream lives until ctx ends or Close.
//
//   - continuous: GET {url}/_changes?feed=continuous&heartbeat=MS&since=S
//     plus the parameters Changes sends (include_docs, revocations,
//     active_only, channel filter), one JSON row per line;
//   - eventsource (CouchDB), sse (Edge Server): the same with
//     feed=eventsource or feed=sse, answered as text/event-stream whose
//     "data:" lines are rows;
//   - websocket (Sync Gateway, App Services): GET {url}/_changes?feed=websocket
//     upgraded to a WebSocket, the options sent as the first message, rows
//     arriving as JSON arrays. Sync Gateway takes its options only from that
//     message, which has no revocations field: revocations are not reported
//     in this mode.
//
// Errors are as for Changes, or ErrModeUnsupported.
func (c *Client) Stream(ctx context.Context, since json.RawMessage, o StreamOptions) (*Stream, error) {
	if err := config.ModeFits(o.Mode, c.o.SourceType); err != nil || o.Mode == config.ModeLongpoll {
		return nil, fmt.Errorf("stream: mode %q on a %s source: %w", o.Mode, c.o.SourceType, ErrModeUnsupported)
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if revocations(c.o.SourceType) { // Sync Gateway itself
		o.Heartbeat = max(o.Heartbeat, sgMinHeartbeat)
	}
	sctx, cancel := context.WithCancel(ctx)
	dog := newWatchdog(o.Heartbeat, cancel)
	s := &Stream{c: c, buf: newRowBuffer(2*c.o.Limit, c.o.PageBytes, dog), cancel: cancel, done: make(chan struct{}), pos: since, dog: dog}
	var read func(context.Context) error
	var err error
	switch o.Mode {
	case config.ModeWebSocket:
		read, err = c.openWebSocket(sctx, since, o.Heartbeat, s.dog, s.buf)
	default:
		read, err = c.openHTTPStream(sctx, since, o, s.dog, s.buf)
	}
	if err != nil {
		s.dog.stop()
		cancel()
		return nil, err
	}
	go func() {
		defer close(s.done)
		defer close(s.buf.rows)
		defer s.dog.stop()
		err := read(sctx)
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}()
	return s, nil
}

// Next waits up to wait for a change, then takes the changes already
// received, as a page would hold them: up to Options.Limit rows, ending at
// the row whose bytes reach Options.PageBytes. It returns them as a batch,
// like Changes would (LastSeq is the last row's seq; Full when either bound
// ended the batch); the rows after it stay in the stream for the next call.
// When nothing arrives within wait, the batch is empty at the previous
// position, which reads as caught up. Once the stream has ended, Next returns
// the rows still buffered and then a transient error wrapping
// ErrStreamEnded (or the reason the source gave).
func (s *Stream) Next(ctx context.Context, wait time.Duration) (*Batch, error) {
	var raws []json.RawMessage
	var size int64
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r, ok := <-s.buf.rows:
		if !ok {
			return nil, s.failure()
		}
		raws, size = append(raws, s.buf.taken(r)), int64(len(r))
	case <-timer.C:
		return &Batch{Rows: []Row{}, LastSeq: s.pos, Pending: -1}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("stream: %w", ctx.Err())
	}
	full := func() bool { return len(raws) >= s.c.o.Limit || size >= s.c.o.PageBytes }
drain:
	for !full() {
		select {
		case r, ok := <-s.buf.rows:
			if !ok {
				break drain
			}
			raws, size = append(raws, s.buf.taken(r)), size+int64(len(r))
		default:
			break drain
		}
	}
	// Rows are read as Changes reads them: one that names a document is
	// kept whatever else it lacks, one that names none is in Malformed.
	b := &Batch{Rows: make([]Row, 0, len(raws)), Pending: -1, Full: full()}
	p := &pageReader{activeOnly: s.c.o.ActiveOnly, b: b}
	for _, raw := range raws {
		p.row(raw)
		s.n++
	}
	b.LastSeq = s.pos
	if p.pos != nil {
		b.LastSeq = p.pos
	}
	for i := range b.Malformed {
		if b.Malformed[i].After == nil {
			b.Malformed[i].After = s.pos
		}
	}
	s.pos = b.LastSeq
	return b, nil
}

// failure is the error of an ended stream.
func (s *Stream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil || errors.Is(s.err, io.EOF) {
		return &transportError{op: "stream", err: ErrStreamEnded}
	}
	if s.dog.fired.Load() {
		return &transportError{op: "stream", err: fmt.Errorf("%w: no change or heartbeat within %s", ErrStreamEnded, s.dog.d)}
	}
	var se *StatusError
	if errors.As(s.err, &se) || errors.Is(s.err, ErrMalformed) || errors.Is(s.err, ErrModeUnsupported) {
		return s.err
	}
	return &transportError{op: "stream", err: fmt.Errorf("%w: %w", ErrStreamEnded, s.err)}
}

// Close stops the stream and waits for its reader. It is idempotent.
func (s *Stream) Close() error {
	s.cancel()
	<-s.done
	return nil
}

// rowBuffer holds the rows a stream's reader received and Next has not
// taken yet: at most its rows' capacity, and at most budget bytes (a row
// larger than budget waits until the buffer is empty). Safe for one reader
// and one taker at a time.
type rowBuffer struct {
	rows   chan json.RawMessage
	room   *semaphore.Weighted // budget bytes
	budget int64
	dog    *watchdog // the stream's, paused while put waits
}

func newRowBuffer(rows int, budget int64, dog *watchdog) *rowBuffer {
	return &rowBuffer{rows: make(chan json.RawMessage, rows), room: semaphore.NewWeighted(budget), budget: budget, dog: dog}
}

// put adds a row once there is room for it, or fails when ctx ends first.
// The watchdog does not run meanwhile: while the reader waits for room the
// source is not silent, the taker is slow.
func (b *rowBuffer) put(ctx context.Context, r json.RawMessage) error {
	b.dog.stop()
	defer b.dog.alive()
	w := b.weight(r)
	if err := b.room.Acquire(ctx, w); err != nil {
		return err
	}
	select {
	case b.rows <- r:
		return nil
	case <-ctx.Done():
		b.room.Release(w)
		return ctx.Err()
	}
}

// taken records that r left the buffer, and returns it.
func (b *rowBuffer) taken(r json.RawMessage) json.RawMessage {
	b.room.Release(b.weight(r))
	return r
}

func (b *rowBuffer) weight(r json.RawMessage) int64 { return min(int64(len(r)), b.budget) }

// watchdog cancels a stream in which nothing whole (a row, an event, a
// heartbeat) arrives for three heartbeats; alive resets it.
type watchdog struct {
	t     *time.Timer
	d     time.Duration
	fired atomic.Bool
}

func newWatchdog(heartbeat time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{d: 3 * heartbeat}
	w.t = time.AfterFunc(w.d, func() {
		w.fired.Store(true)
		cancel()
	})
	return w
}

func (w *watchdog) alive() { w.t.Reset(w.d) }
func (w *watchdog) stop()  { w.t.Stop() }

// openHTTPStream sends the request of continuous, eventsource or sse and
// returns the function that reads its rows.
func (c *Client) openHTTPStream(ctx context.Context, since json.RawMessage, o StreamOptions, dog *watchdog, out *rowBuffer) (func(context.Context) error, error) {
	q, err := c.feedQuery(since)
	if err != nil {
		return nil, err
	}
	q.Set("feed", o.Mode)
	q.Set("heartbeat", strconv.FormatInt(o.Heartbeat.Milliseconds(), 10))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint("_changes", q), nil)
	if err != nil {
		return nil, fmt.Errorf("stream: build request: %w", err)
	}
	accept := acceptJSON
	if o.Mode != config.ModeContinuous {
		accept = "text/event-stream"
	}
	c.header(req, accept, false)
	// A compressed stream arrives only when the compressor flushes, which a
	// source's gzip middleware does not do for heartbeats (pouchdb-server):
	// ask for it as sent. (Setting the header also turns off Go's own gzip.)
	req.Header.Set("Accept-Encoding", "identity")
	answer := make(chan answered, 1)
	go func() {
		resp, err := c.hc.Do(req)
		answer <- answered{resp, err}
	}()
	timer := time.NewTimer(acceptWait)
	defer timer.Stop()
	select {
	case a := <-answer:
		resp, err := accepted(a, o.Mode)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return readStream(ctx, resp, o.Mode, c.o.MaxAnswerBytes, dog, out) }, nil
	case <-timer.C:
		// Some sources (pouchdb-server) send the headers only with the
		// first change or heartbeat: the answer is awaited by the reader,
		// and a refusal comes from Next.
		return func(ctx context.Context) error {
			resp, err := accepted(<-answer, o.Mode)
			if err != nil {
				return err
			}
			return readStream(ctx, resp, o.Mode, c.o.MaxAnswerBytes, dog, out)
		}, nil
	}
}

// acceptWait is how long Stream waits for a streaming answer's headers
// before returning.
const acceptWait = 2 * time.Second

// answered is the outcome of a streaming request.
type answered struct {
	resp *http.Response
	err  error
}

// accepted checks the answer to a continuous, eventsource or sse request.
func accepted(a answered, mode string) (*http.Response, error) {
	if a.err != nil {
		return nil, &transportError{op: "stream", err: a.err}
	}
	resp := a.resp
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, newStatusError("stream", resp.StatusCode, b)
	}
	if mode != config.ModeContinuous {
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
			resp.Body.Close()
			return nil, fmt.Errorf("stream: feed=%s answered as %q, not text/event-stream: %w", mode, mt, ErrModeUnsupported)
		}
	}
	return resp, nil
}

// readStream reads the rows of an accepted continuous, eventsource or sse
// answer; limit bounds one line, and one event's data.
func readStream(ctx context.Context, resp *http.Response, mode string, limit int64, dog *watchdog, out *rowBuffer) error {
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	if mode == config.ModeContinuous {
		return readLines(ctx, br, limit, dog, out)
	}
	return readEvents(ctx, br, limit, dog, out)
}

// readLine reads one line, without its end, of at most limit bytes.
func readLine(br *bufio.Reader, limit int64) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if int64(len(line)) > limit {
			return nil, malformed("stream", "a line longer than %d bytes (%s)", limit, BoundAnswerBytes)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil && len(line) == 0 {
			return nil, err
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

// readLines reads a continuous feed: one JSON row per line, empty lines as
// heartbeats, and {"last_seq":...} when the source ends the feed.
func readLines(ctx context.Context, br *bufio.Reader, limit int64, dog *watchdog, out *rowBuffer) error {
	for {
		line, err := readLine(br, limit)
		if len(bytes.TrimSpace(line)) > 0 {
			if stop, serr := emit(ctx, bytes.TrimSpace(line), out); stop || serr != nil {
				return serr
			}
		}
		if err != nil {
			return err
		}
		dog.alive()
	}
}

// readEvents reads server-sent events whose data is one JSON row; events
// without data (heartbeats) and comments only show the stream is alive. An
// event's data is at most limit bytes, and only a whole event (or a comment
// between events) shows the stream is alive: an event that never ends
// fails, at limit bytes or when the watchdog fires, whichever comes first.
func readEvents(ctx context.Context, br *bufio.Reader, limit int64, dog *watchdog, out *rowBuffer) error {
	var data []byte
	for {
		line, err := readLine(br, limit)
		alive := false
		switch {
		case len(line) == 0:
			if d := bytes.TrimSpace(data); len(d) > 0 {
				if stop, serr := emit(ctx, d, out); stop || serr != nil {
					return serr
				}
			}
			data, alive = data[:0], true
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))
			if int64(len(data)+1+len(v)) > limit {
				return malformed("stream", "an event's data longer than %d bytes (%s)", limit, BoundAnswerBytes)
			}
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, v...)
		case line[0] == ':':
			alive = len(data) == 0
		}
		if err != nil {
			return err
		}
		if alive {
			dog.alive()
		}
	}
}

// emit sends one message of a stream on: a row, or the end of the feed
// ({"last_seq":...} with no id), or an error object. stop reports the end.
func emit(ctx context.Context, msg []byte, out *rowBuffer) (stop bool, err error) {
	var probe struct {
		ID      string          `json:"id"`
		LastSeq json.RawMessage `json:"last_seq"`
		Error   any             `json:"error"`
		Reason  any             `json:"reason"`
	}
	if err := json.Unmarshal(msg, &probe); err != nil {
		return true, malformed("stream", "%v", err)
	}
	switch {
	case probe.Error != nil:
		return true, &StatusError{Op: "stream", Status: http.StatusBadGateway, Reason: reason(http.StatusBadGateway, text(probe.Error), text(probe.Reason))}
	case probe.ID == "" && !isNull(probe.LastSeq):
		return true, nil
	}
	if err := out.put(ctx, json.RawMessage(bytes.Clone(msg))); err != nil {
		return true, err
	}
	return false, nil
}

// openWebSocket connects Sync Gateway's WebSocket feed and returns the
// function that reads its rows.
func (c *Client) openWebSocket(ctx context.Context, since json.RawMessage, heartbeat time.Duration, dog *watchdog, out *rowBuffer) (func(context.Context) error, error) {
	u := c.endpoint("_changes", nil) + "?feed=websocket"
	u = "ws" + strings.TrimPrefix(u, "http")
	h := http.Header{}
	c.identify(h)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			return nil, newStatusError("stream", resp.StatusCode, b)
		}
		return nil, &transportError{op: "stream", err: err}
	}
	conn.SetReadLimit(c.o.MaxAnswerBytes)
	opts := map[string]any{
		"include_docs": c.o.Fetch == config.FetchIncludeDocs,
		"active_only":  c.o.ActiveOnly,
		"heartbeat":    heartbeat.Milliseconds(),
	}
	if !isNull(since) {
		opts["since"] = since
	}
	if len(c.o.Channels) > 0 {
		opts["filter"], opts["channels"] = "sync_gateway/bychannel", strings.Join(c.o.Channels, ",")
	}
	msg, err := json.Marshal(opts)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("stream: encode options: %w", err)
	}
	if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
		conn.CloseNow()
		return nil, &transportError{op: "stream", err: err}
	}
	return func(ctx context.Context) error {
		defer conn.CloseNow()
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
					return io.EOF
				}
				return err
			}
			dog.alive()
			if len(bytes.TrimSpace(data)) == 0 {
				continue // heartbeat
			}
			var rows []json.RawMessage
			if err := json.Unmarshal(data, &rows); err != nil {
				return malformed("stream", "websocket message: %v", err)
			}
			for _, r := range rows {
				if stop, err := emit(ctx, r, out); stop || err != nil {
					return err
				}
			}
		}
	}, nil
}
