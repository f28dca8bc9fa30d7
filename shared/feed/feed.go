// Package feed reads the _changes feed of a CouchDB-compatible source (Apache
// CouchDB, Couchbase Sync Gateway, Capella App Services, Couchbase Edge Server)
// and fetches the documents the feed names.
//
// The client keeps no position: the caller passes the opaque since value it
// checkpointed and gets back the source's last_seq, both exactly as the source
// wrote them. Nothing here retries; every error says whether a retry can help
// (see Transient), and the caller decides when to retry.
package feed

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
)

// Defaults for Options fields left zero.
const (
	DefaultSlack          = 2 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	DefaultConcurrency    = 8
	// DefaultMaxAnswerBytes is above the largest document Couchbase (20 MB)
	// and CouchDB (8 MB by default) store.
	DefaultMaxAnswerBytes = config.DefaultMaxAnswerBytes
	// DefaultPageBytes keeps a page's bodies, and the copies queueing them
	// makes, well within a 256 MB poller.
	DefaultPageBytes = config.DefaultPageBytes
)

// Options configure a Client. Credentials are already resolved; they are sent
// only in the Authorization header (or, for a session, the sign-in request
// and the Cookie header) and never appear in errors or String.
type Options struct {
	// SourceType is config.SourceCouchDB, SourceSyncGateway, SourceAppServices
	// or SourceEdgeServer.
	SourceType string
	// URL is the database (CouchDB) or keyspace (Sync Gateway family:
	// http://host:4984/db or http://host:4984/db.scope.collection), used as given.
	URL string
	// Username and Password select basic authentication when Username is set.
	Username, Password string
	// Session signs in with Username and Password instead (POST
	// {db}/_session, Sync Gateway and App Services only) and sends the
	// session's cookie with every request; on a 401 it signs in again once
	// and resends the request. The sign-in is reported to OnRequest as
	// "session".
	Session bool
	// Token selects bearer authentication when set.
	Token string
	// Limit bounds the rows of one _changes request. Default config.DefaultLimit.
	Limit int
	// Fetch is config.FetchIncludeDocs (default) or config.FetchBulkGet.
	Fetch string
	// ActiveOnly drops deleted and removed rows: at the source for the Sync
	// Gateway family (active_only=true), in the client for CouchDB.
	ActiveOnly bool
	// Channels restricts the feed to these channels (Sync Gateway family only).
	Channels []string
	// CAPEM is a PEM bundle of certificate authorities trusted for an https
	// source in addition to the system roots. Ignored when HTTPClient is set.
	CAPEM []byte
	// HTTPClient sends the requests. Nil means a client with dial and TLS
	// timeouts that does not follow redirects (a 3xx is reported as a permanent
	// StatusError). Per-request deadlines come from Slack and RequestTimeout
	// either way, so the client should not set its own Timeout below them.
	HTTPClient *http.Client
	// Slack is how long a long-poll may run past its timeout before it is
	// abandoned. Default DefaultSlack.
	Slack time.Duration
	// RequestTimeout bounds every request other than _changes. Default
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Concurrency bounds the per-document GETs of FetchDocs. Default
	// DefaultConcurrency.
	Concurrency int
	// MaxAnswerBytes bounds every answer the client reads. An answer that
	// goes past it is cut there: what was whole before is used, and when
	// nothing was, the error is a *LimitError naming the limit. Default
	// DefaultMaxAnswerBytes.
	MaxAnswerBytes int64
	// PageBytes is the budget of the document bodies one page holds (see
	// Changes and FetchBatch): a page is cut after the row whose body
	// reaches it, and the next page asks for fewer rows. Default
	// DefaultPageBytes; at most MaxAnswerBytes.
	PageBytes int64
	// OnRequest, when set, is told of every request to the source once it
	// ended: the operation ("changes", "bulk_get", "get", ...), the HTTP
	// status (0 when no answer came) and how long it took. The poller turns
	// it into the source request and auth failure metrics. It must be safe
	// for concurrent use.
	OnRequest func(op string, status int, d time.Duration)
}

// String describes the options without their secrets.
func (o Options) String() string {
	auth := "none"
	switch {
	case o.Token != "":
		auth = "bearer [redacted]"
	case o.Session:
		auth = fmt.Sprintf("session %s:[redacted]", o.Username)
	case o.Username != "":
		auth = fmt.Sprintf("basic %s:[redacted]", o.Username)
	}
	u := "[invalid]"
	if p, err := url.Parse(o.URL); err == nil {
		u = p.Redacted()
	}
	return fmt.Sprintf("feed.Options{source=%s url=%s auth=%s limit=%d fetch=%s active_only=%t channels=%v}",
		o.SourceType, u, auth, o.Limit, o.Fetch, o.ActiveOnly, o.Channels)
}

// GoString is String, so that %#v does not print the secrets either.
func (o Options) GoString() string { return o.String() }

// Validate reports every problem with the options at once, each naming its field.
func (o Options) Validate() error {
	var errs []error
	switch o.SourceType {
	case config.SourceCouchDB, config.SourceSyncGateway, config.SourceAppServices, config.SourceEdgeServer:
	default:
		errs = append(errs, fmt.Errorf("source_type: %q is not one of %s, %s, %s, %s", o.SourceType,
			config.SourceCouchDB, config.SourceSyncGateway, config.SourceAppServices, config.SourceEdgeServer))
	}
	if err := validateURL(o.URL); err != nil {
		errs = append(errs, fmt.Errorf("url: %w", err))
	}
	if o.Token != "" && o.Username != "" {
		errs = append(errs, errors.New("auth: set either username/password or token, not both"))
	}
	if o.Username == "" && o.Password != "" {
		errs = append(errs, errors.New("username: required when a password is set"))
	}
	if o.Session {
		errs = append(errs, o.validateSession()...)
	}
	if o.Limit < 0 {
		errs = append(errs, fmt.Errorf("limit: %d is negative", o.Limit))
	}
	switch o.Fetch {
	case "", config.FetchIncludeDocs, config.FetchBulkGet:
	default:
		errs = append(errs, fmt.Errorf("fetch: %q is not one of %s, %s", o.Fetch, config.FetchIncludeDocs, config.FetchBulkGet))
	}
	if len(o.Channels) > 0 && !syncGatewayFamily(o.SourceType) {
		errs = append(errs, fmt.Errorf("channels: only a Sync Gateway family source has channels, not %q", o.SourceType))
	}
	if slices.Contains(o.Channels, "") {
		errs = append(errs, errors.New("channels: empty channel name"))
	}
	if o.Slack < 0 {
		errs = append(errs, fmt.Errorf("slack: %s is negative", o.Slack))
	}
	if o.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("request_timeout: %s is negative", o.RequestTimeout))
	}
	if o.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("concurrency: %d is negative", o.Concurrency))
	}
	if o.MaxAnswerBytes < 0 {
		errs = append(errs, fmt.Errorf("max_answer_bytes: %d is negative", o.MaxAnswerBytes))
	}
	if o.PageBytes < 0 {
		errs = append(errs, fmt.Errorf("page_bytes: %d is negative", o.PageBytes))
	}
	if maxAnswer := cmp.Or(o.MaxAnswerBytes, DefaultMaxAnswerBytes); o.PageBytes > maxAnswer {
		errs = append(errs, fmt.Errorf("page_bytes: %d is more than max_answer_bytes (%d)", o.PageBytes, maxAnswer))
	}
	return errors.Join(errs...)
}

func validateURL(raw string) error {
	if raw == "" {
		return errors.New("required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the input; it has no credentials (checked below
		// only once parsed), so report the problem without echoing it.
		return errors.New("not a valid URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q is not http or https", u.Scheme)
	case u.User != nil:
		return errors.New("must not carry credentials; use the auth settings")
	case u.Host == "":
		return errors.New("has no host")
	case u.RawQuery != "" || u.Fragment != "":
		return errors.New("must not have a query or fragment")
	case strings.Trim(u.Path, "/") == "":
		return errors.New("names no database or keyspace")
	}
	return nil
}

func syncGatewayFamily(sourceType string) bool {
	switch sourceType {
	case config.SourceSyncGateway, config.SourceAppServices, config.SourceEdgeServer:
		return true
	}
	return false
}

// Client reads one source. It is safe for concurrent use. It keeps no
// position, only what it learnt about the sizes of the source's documents:
// the page size that fits Options.PageBytes (see pager) and the average body
// size that splits _bulk_get requests.
type Client struct {
	o     Options
	base  string // the URL without a trailing slash
	hc    *http.Client
	pages pager
}

// New validates the options, fills in defaults and returns a Client.
func New(o Options) (*Client, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("feed options: %w", err)
	}
	if o.Limit == 0 {
		o.Limit = config.DefaultLimit
	}
	if o.Fetch == "" {
		o.Fetch = config.FetchIncludeDocs
	}
	if o.Slack == 0 {
		o.Slack = DefaultSlack
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MaxAnswerBytes == 0 {
		o.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if o.PageBytes == 0 {
		o.PageBytes = min(DefaultPageBytes, o.MaxAnswerBytes)
	}
	o.Channels = slices.Clone(o.Channels)
	hc := o.HTTPClient
	if hc == nil {
		var roots *x509.CertPool
		if len(o.CAPEM) > 0 {
			var err error
			if roots, err = certPool(o.CAPEM); err != nil {
				return nil, fmt.Errorf("feed options: ca: %w", err)
			}
		}
		hc = defaultHTTPClient(o.Concurrency, roots)
	}
	if o.Session {
		var err error
		if hc, err = o.withSession(hc); err != nil {
			return nil, fmt.Errorf("feed options: %w", err)
		}
	}
	return &Client{o: o, base: strings.TrimRight(o.URL, "/"), hc: hc, pages: pager{max: o.Limit}}, nil
}

// certPool returns the system roots plus the certificates of a PEM bundle.
func certPool(bundle []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, errors.New("no PEM certificate in the bundle")
	}
	return pool, nil
}

func defaultHTTPClient(concurrency int, roots *x509.CertPool) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if roots != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	t.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = 10 * time.Second
	t.MaxIdleConnsPerHost = concurrency + 2 // the fetchers plus the feed
	return &http.Client{
		Transport: t,
		// A redirect means the URL is wrong (or a proxy wants a login): report
		// it rather than follow it with our credentials.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Row is one change from the feed. A row is exactly one of: live (Doc set
// once fetched), Deleted, or Removed.
type Row struct {
	// Seq is the row's sequence exactly as the source sent it (number or string).
	Seq json.RawMessage
	ID  string
	// Rev is the winning revision (changes[0].rev), or the current winner that
	// FetchDocs found when the feed's revision was gone.
	Rev string
	// Deleted: the document was deleted at the source. Sync Gateway also
	// lists the channels a deletion left ("deleted":true with "removed":[..])
	// when the tombstone has no channels; that is still a deletion, and only
	// Deleted is set.
	Deleted bool
	// Removed: the document still exists but the reader can no longer see
	// it. Sync Gateway reports this when the document left the reader's
	// channels ("removed":[...]) or, with revocations=true, when the reader
	// lost access to the channels it was seen through (Revoked).
	Removed bool
	// Revoked marks a removal caused by a revoked channel ("revoked":true).
	Revoked bool
	// Doc is the body once fetched; nil for tombstones and removals.
	Doc json.RawMessage
}

// needsBody reports whether FetchDocs has a body to fetch for the row.
func (r *Row) needsBody() bool { return !r.Deleted && !r.Removed && len(r.Doc) == 0 }

// Batch is the answer to one _changes request.
type Batch struct {
	// Rows are the changes, in the source's order. A row's Seq is nil when
	// the source sent none (see Changes).
	Rows []Row
	// LastSeq is the source's last_seq exactly as sent; the next request
	// starts from it. It covers rows the client dropped (ActiveOnly on
	// CouchDB, Sync Gateway's _user/ rows).
	LastSeq json.RawMessage
	// Pending is the number of changes after LastSeq, or -1 when the source
	// does not report it.
	Pending int64
	// Full is set when the source sent as many rows as the request's limit
	// (counting the rows dropped from Rows), so more may follow at once. A
	// cut batch is full.
	Full bool
	// Cut, when set, says why the batch ends before the source's answer
	// did: the page's byte budget, an answer over its limit, or an answer
	// broken after whole rows. LastSeq is then the position after the last
	// row kept, and Pending is -1.
	Cut string
	// Malformed are the rows that name no document (see Malformed), in the
	// order met; LastSeq covers them.
	Malformed []Malformed
}

// Malformed is a row of a _changes answer that names no usable document: not
// an object, or without an id. It cannot be fetched; the caller decides
// whether to read it again (CutBefore) or to record it and move on.
type Malformed struct {
	// Before is the index in Batch.Rows of the first row after it
	// (len(Rows) when none).
	Before int
	// Seq is the row's own seq, nil when it has none that can be used.
	Seq json.RawMessage
	// After is the position it followed: the seq of the last row before
	// it that had one, or since when none did (nil: the beginning).
	After json.RawMessage
	// Raw is the row as the source sent it, at most MalformedRawMax bytes.
	Raw []byte
	// Reason says what is wrong with it.
	Reason string
}

// MalformedRawMax bounds Malformed.Raw.
const MalformedRawMax = 4 << 10

// CutBefore ends the batch before Rows[i], so that the next read starts
// with it: LastSeq becomes the seq of the last row before it that has one
// (since when none does), Full is set, Pending is unknown, Cut says why, and
// Malformed keeps only the rows before the cut.
func (b *Batch) CutBefore(i int, since json.RawMessage, why string) {
	b.Rows = b.Rows[:i]
	b.LastSeq = since
	for k := i - 1; k >= 0; k-- {
		if b.Rows[k].Seq != nil {
			b.LastSeq = b.Rows[k].Seq
			break
		}
	}
	b.Full, b.Pending, b.Cut = true, -1, why
	b.Malformed = slices.DeleteFunc(b.Malformed, func(m Malformed) bool { return m.Before >= i })
}

// CaughtUp reports whether the batch reached the end of the feed: the
// source says nothing is pending, or, when it does not say, the answer was
// not full: a page shorter than the limit holds everything the source had
// when it answered, so a long poll answered with the one change made
// meanwhile is caught up. A page made only of rows the client drops (Sync
// Gateway's "_user/" rows, tombstones under ActiveOnly) is full and so not
// caught up.
func (b *Batch) CaughtUp() bool {
	if b.Pending >= 0 {
		return b.Pending == 0
	}
	return !b.Full
}

// DocRev is a live document and its winning revision.
type DocRev struct {
	ID, Rev string
}
