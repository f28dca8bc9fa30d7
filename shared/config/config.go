// Package config loads and validates the job configuration file: the jobs, their
// sources, feed options, outputs and the names of the AWS resources they use.
//
// The file is JSON with snake_case keys. Line (//) and block (/* */) comments are
// allowed so that a sample can explain itself; they are stripped before decoding.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Source types.
const (
	SourceCouchDB     = "couchdb"
	SourceSyncGateway = "sync_gateway"
	SourceAppServices = "app_services"
	SourceEdgeServer  = "edge_server"
)

// Auth types.
const (
	AuthBasic   = "basic"
	AuthBearer  = "bearer"
	AuthSession = "session"
)

// Output types.
const (
	OutputPostgres = "postgres"
	OutputHTTP     = "http"
	OutputS3       = "s3"
)

// Orderings.
const (
	OrderingPerDocument = "per_document"
	OrderingTotal       = "total"
	OrderingNone        = "none"
)

// Failure policies.
const (
	// OnFailureDLQ moves a change that cannot be delivered to the DLQ and
	// goes on with the next ones.
	OnFailureDLQ = "dlq"
	// OnFailureHalt stops the message group (the whole output with ordering
	// total, the document with per_document) at the change that cannot be
	// delivered until an operator retries or skips it.
	OnFailureHalt = "halt"
)

// MaxHaltReceiveCount bounds max_receive_count under on_failure halt: the
// queue's redrive policy allows SQS's maximum (1000) receives, and a halted
// change needs the rest of them while it waits for the operator.
const MaxHaltReceiveCount = 100

// Fetch modes.
const (
	FetchIncludeDocs = "include_docs"
	FetchBulkGet     = "bulk_get"

	// Feed modes: how the _changes feed is read.
	ModeLongpoll    = "longpoll"    // every source: one request per batch
	ModeContinuous  = "continuous"  // every source: one streaming response
	ModeWebSocket   = "websocket"   // Sync Gateway and App Services
	ModeSSE         = "sse"         // Edge Server: server-sent events
	ModeEventSource = "eventsource" // CouchDB: server-sent events

	// Idle modes: what a poller invocation does while the feed has
	// nothing new (see Job.Idle).
	IdleWatch = "watch" // read the feed for the whole budget, a standby beside it
	IdleSleep = "sleep" // end the invocation; the next schedule tick reads on
)

// Defaults.
const (
	DefaultPrefix           = "changes-worker"
	DefaultLimit            = 500
	DefaultFeedTimeout      = 10 * time.Second
	DefaultMaxAnswerBytes   = 32 << 20
	DefaultPageBytes        = 16 << 20
	DefaultQuarantineAfter  = 3
	DefaultLeaseTTL         = 10 * time.Second
	DefaultMaxReceiveCount  = 5
	DefaultMaxMessageBytes  = 256 * 1024
	DefaultSchedule         = time.Minute
	DefaultLatencyObjective = 60 * time.Second
	DefaultPollerTimeout    = 90 * time.Second
	DefaultWriterTimeout    = 30 * time.Second
	DefaultHTTPTimeout      = 10 * time.Second
	DefaultFloodThreshold   = 10000
	DefaultIdle             = IdleWatch
	// SleepAllowance is what a job with idle sleep leaves, within its
	// latency objective, for the tick after a change to deliver it: the
	// invocation's start (a cold one included), the lease, the read, the
	// send, the writer's batching window (1 s) and the write. See
	// Job.IdleStay.
	SleepAllowance = 5 * time.Second
	// The defaults of an output's backpressure settings, which package
	// backpressure uses too. DefaultBackpressureMinIncrease keeps jitter
	// from counting as slow: in local runs a PostgreSQL with a 1 ms
	// baseline averaged 2 to 3 ms at times, past the threshold of 2, and a
	// rise smaller than one SQS call (10-20 ms) is not worth fewer requests
	// at once.
	DefaultBackpressureThreshold   = 2.0
	DefaultBackpressureBaseline    = 50
	DefaultBackpressureWindow      = 20
	DefaultBackpressureMinIncrease = 10 * time.Millisecond
	// The defaults of an output's outage settings: a corrected secret or
	// a recovered output is tried within DefaultOutageMaxRetry.
	DefaultOutageRetry    = 2 * time.Second
	DefaultOutageMaxRetry = 30 * time.Second
	// DefaultBatchSize is the writer's batch for PostgreSQL outputs on a
	// standard queue: one transaction per batch, so its fixed cost (the
	// round trip, the statements, the commit) is shared by a hundred
	// changes. Measured locally (make bench, pg-mapping): batches of 100
	// write two to three times the documents per second of batches of 10.
	DefaultBatchSize = 100
	// MaxFIFOBatchSize is SQS's (and Lambda's) cap on a FIFO queue's batch;
	// MaxBatchSize is Lambda's cap on a standard queue's.
	MaxFIFOBatchSize = 10
	MaxBatchSize     = 10000
	// DefaultSendConcurrency is how many SendMessageBatch requests the
	// poller keeps in flight, across outputs and chunks. A page of 500
	// changes is 50 requests per output, 150 to three outputs: at 15-20 ms a
	// request (in a region), 128 in flight queue the three outputs' requests
	// in two round trips where 64 take three. Against 64, at 15 ms and one
	// chunk in flight, the poller's rate rose from 16,400 to 17,100 changes
	// a second to one output and from 7,200 to 8,800 to three (make bench,
	// cloud-poller).
	DefaultSendConcurrency = 128
	MaxSendConcurrency     = 512
	// DefaultSendDepth keeps one chunk in flight, so a failover replays at
	// most one batch; MaxSendDepth bounds the chunks a job may overlap.
	DefaultSendDepth = 1
	MaxSendDepth     = 4
)

// File is the whole configuration file.
type File struct {
	// Stack names the AWS resources shared by every job.
	Stack Stack `json:"stack"`
	// Jobs are the pipelines, one source each.
	Jobs []*Job `json:"jobs"`
}

// Stack holds the settings shared by every job.
type Stack struct {
	// Prefix starts the name of every resource (table, queues, bucket).
	Prefix string `json:"prefix"`
	// Bucket holds claim-check payloads and S3 outputs that name no bucket.
	// Default: "<prefix>-data".
	Bucket string `json:"bucket"`
	// MaxMessageBytes is the largest message body put on a queue; a larger
	// envelope travels as an S3 pointer (claim check). Default 262144.
	MaxMessageBytes int `json:"max_message_bytes"`
	// AlarmEmail, when set, is subscribed to the alarm topic.
	AlarmEmail string `json:"alarm_email"`
	// PollerTimeout is the poller function's timeout, its time budget per
	// invocation. Default 90s: longer than the schedule, so each invocation
	// overlaps the next one, which stands by and takes over the moment the
	// lease is released.
	PollerTimeout Duration `json:"poller_timeout,omitempty"`
	// WriterTimeout is the writer function's timeout. Default 30s.
	WriterTimeout Duration `json:"writer_timeout,omitempty"`
	// LogRetentionDays for the functions' log groups. Default 30.
	LogRetentionDays int `json:"log_retention_days"`
	// Retain keeps the table and bucket when the stack is deleted, and turns
	// on the table's deletion protection. Default true.
	Retain *bool `json:"retain,omitempty"`
	// Dashboards gives each job a CloudWatch dashboard <prefix>-<job>.
	// Default true. An account's first three dashboards are free, each
	// further one costs $3 a month: about as much as the rest of an idle
	// job with idle sleep, which may want it off (the alarms and changesctl
	// status still show where each job stands).
	Dashboards *bool `json:"dashboards,omitempty"`
	// VPC places the functions in a VPC (to reach a private database).
	VPC *VPC `json:"vpc,omitempty"`
}

// VPC names an existing VPC and where in it the functions run.
type VPC struct {
	ID               string   `json:"id"`
	SubnetIDs        []string `json:"subnet_ids"`
	SecurityGroupIDs []string `json:"security_group_ids"`
}

// Job is one pipeline: one source feed fanned out to one or more outputs.
type Job struct {
	ID         string     `json:"id"`
	Source     Source     `json:"source"`
	Feed       Feed       `json:"feed"`
	Processing Processing `json:"processing"`
	Lease      Lease      `json:"lease"`
	// Schedule is how often the poller is invoked. Default 1m.
	Schedule Duration `json:"schedule,omitempty"`
	// LatencyObjective is how old a queued change may get before an alarm
	// fires, and, with idle sleep, how late a change made while the job is
	// idle may reach its outputs. Default 60s.
	LatencyObjective Duration `json:"latency_objective,omitempty"`
	// Idle is what the poller does while the feed has nothing new: watch
	// (the default) reads it for the whole budget of every invocation,
	// with the next tick's invocation standing by, so a change reaches
	// the outputs within a second and a crashed poller is replaced within
	// the lease TTL; sleep ends an invocation once the feed has been idle
	// for IdleStay, releasing the lease, and the next tick reads on, so a
	// change made while idle reaches the outputs within the latency
	// objective and an idle job costs a few seconds of a function a tick.
	// A busy feed is read the same way in both. The default keeps the
	// latency of existing jobs: a job that becomes slower by a minute
	// does so silently, while its bill shows what it costs.
	Idle string `json:"idle,omitempty"`
	// SendConcurrency bounds the SQS requests (and claim-check puts) the
	// poller has in flight, across the outputs. Default DefaultSendConcurrency.
	SendConcurrency int `json:"send_concurrency,omitempty"`
	// SendDepth is how many chunks a poller catching up keeps in flight.
	// Above 1, pages read ahead are also merged into chunks of up to 1,000
	// changes: a faster backfill, for a failover that may replay that many
	// chunks instead of one batch. Default DefaultSendDepth.
	SendDepth int       `json:"send_depth,omitempty"`
	Outputs   []*Output `json:"outputs"`
	// Attachments copies the documents' attachments to S3; off by default.
	Attachments *Attachments `json:"attachments,omitempty"`
}

// Source is the database whose _changes feed is followed.
type Source struct {
	// Type is one of couchdb, sync_gateway, app_services, edge_server.
	Type string `json:"type"`
	// URL is the database (CouchDB) or keyspace (Sync Gateway: db or db.scope.collection).
	URL  string `json:"url"`
	Auth *Auth  `json:"auth,omitempty"`
	// TLS adds certificate authorities trusted for an https source.
	TLS *TLS `json:"tls,omitempty"`
}

// TLS names the certificate authorities (a PEM bundle) trusted for a
// source, in addition to the system's: the shape of Capella App Services,
// or a Sync Gateway with its own CA. Exactly one of CAFile and CAPEM is set.
type TLS struct {
	// CAFile is the path of the PEM bundle where the poller runs.
	CAFile string `json:"ca_file,omitempty"`
	// CAPEM is the PEM bundle itself (certificates are public).
	CAPEM string `json:"ca_pem,omitempty"`
}

// Auth is basic, bearer or session authentication. Secrets are given by
// reference only.
type Auth struct {
	// Type is basic, bearer, or session: a Sync Gateway or App Services
	// source only, which signs in with the username and password (POST
	// {db}/_session) and sends the session cookie instead of the password.
	Type     string     `json:"type"`
	Username string     `json:"username,omitempty"`
	Password *SecretRef `json:"password,omitempty"`
	Token    *SecretRef `json:"token,omitempty"`
}

// SecretRef names where a secret lives: an environment variable or a Secrets
// Manager secret (name or ARN, optionally a key of its JSON value). Exactly one
// of Env and Secret is set.
type SecretRef struct {
	Env     string `json:"env,omitempty"`
	Secret  string `json:"secret,omitempty"`
	JSONKey string `json:"json_key,omitempty"`
}

// Feed sets how the _changes feed is read.
type Feed struct {
	// Limit bounds the rows of one _changes request. Default 500.
	Limit int `json:"limit"`
	// Timeout is the long-poll timeout sent to the source. Default 10s.
	Timeout Duration `json:"timeout,omitempty"`
	// Fetch is include_docs (default) or bulk_get.
	Fetch string `json:"fetch"`
	// ActiveOnly skips deleted and removed documents at the source (Sync Gateway
	// family) or in the poller (CouchDB).
	ActiveOnly bool `json:"active_only"`
	// Channels restricts the feed to these channels (Sync Gateway family only).
	Channels []string `json:"channels,omitempty"`
	// MaxAnswerBytes bounds every answer read from the source: one larger is
	// cut there (what came whole is used) or, when nothing did, refused
	// with an error naming this setting. Default 32 MiB; 1 MiB to 128 MiB.
	MaxAnswerBytes int64 `json:"max_answer_bytes,omitempty"`
	// PageBytes is the budget of one page's document bodies: a page is cut
	// after the row that reaches it and the next one asks for fewer rows.
	// Default 16 MiB; 64 KiB to max_answer_bytes.
	PageBytes int64 `json:"page_bytes,omitempty"`
	// QuarantineAfter is how many times in a row the poller reads a feed
	// row that names no document (or a page it cannot parse) before it
	// records it in the job's quarantine: such a row is then skipped, such
	// a page stays blocked and alarmed. Default 3; 1 to 100.
	QuarantineAfter int `json:"quarantine_after,omitempty"`
	// Mode is longpoll (default), continuous, websocket (Sync Gateway, App
	// Services), sse (Edge Server) or eventsource (CouchDB).
	Mode string `json:"mode,omitempty"`
	// FloodThreshold is how many changes one poller invocation may read
	// before it counts as a flood (metric FloodBatches, a warning in the
	// log). Default 10000.
	FloodThreshold int `json:"flood_threshold"`
}

// Processing filters changes before they are queued.
type Processing struct {
	IgnoreDelete bool `json:"ignore_delete"`
	IgnoreRemove bool `json:"ignore_remove"`
}

// Lease sets the job lease.
type Lease struct {
	// TTL is how long a lease lasts without renewal. Default 10s.
	TTL Duration `json:"ttl,omitempty"`
}

// Output is one destination of a job's changes.
type Output struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	// Ordering is per_document (FIFO queue, one message group per
	// document), total (FIFO queue, one message group for the whole output)
	// or none (standard queue). Default: per_document for http, none for
	// postgres and s3.
	Ordering string `json:"ordering"`
	// OnFailure is dlq (a change that cannot be delivered goes to the DLQ;
	// the default) or halt (the message group stops at it; FIFO orderings
	// only).
	OnFailure string `json:"on_failure"`
	// MaxReceiveCount is how many deliveries a message gets before it moves
	// to the DLQ. Default 5.
	MaxReceiveCount int `json:"max_receive_count"`
	// BatchSize is how many messages the writer takes at once: at most 10 on
	// a FIFO queue, at most 10,000 on a standard one (gathered for up to the
	// batching window). Default DefaultBatchSize for postgres outputs on a
	// standard queue, 10 otherwise.
	BatchSize int `json:"batch_size"`
	// MaxConcurrency bounds concurrent writer invocations for this output.
	MaxConcurrency int `json:"max_concurrency"`
	// Backpressure tunes how the writer detects that this output is
	// struggling.
	Backpressure Backpressure `json:"backpressure"`
	// Outage tunes how the writer holds the messages of this output while
	// it is down.
	Outage Outage `json:"outage"`

	Postgres *PostgresOutput `json:"postgres,omitempty"`
	HTTP     *HTTPOutput     `json:"http,omitempty"`
	S3       *S3Output       `json:"s3,omitempty"`
}

// Backpressure tunes the writer's latency tracker for one output. The
// output's own signals (HTTP 429 or 503, PostgreSQL too_many_connections)
// are always honoured.
type Backpressure struct {
	// Threshold is the ratio of the rolling average latency to the baseline
	// above which the writer slows down. Default 2; must be above 1.
	Threshold float64 `json:"threshold"`
	// BaselineRequests is how many first successful requests of a writer
	// instance make the baseline. Default 50.
	BaselineRequests int `json:"baseline_requests"`
	// Window is how many latest requests the rolling average covers.
	// Default 20.
	Window int `json:"window"`
	// MinIncrease is how far above the baseline the rolling average must
	// also be: a 1 ms output at 2.5 ms is not struggling. Default 10ms.
	MinIncrease Duration `json:"min_increase,omitempty"`
}

// Outage tunes how the writer holds an output's messages while the output
// is down (it cannot be reached, refuses our credentials, cannot be opened,
// or fails every request of a batch): held messages do not count toward
// the DLQ. While the output stays down the writer tries it again after
// Retry, then twice as long each time (with jitter), up to MaxRetry.
type Outage struct {
	// Retry is the first wait before the output is tried again. Default 2s.
	Retry Duration `json:"retry,omitempty"`
	// MaxRetry bounds the wait. Default 30s.
	MaxRetry Duration `json:"max_retry,omitempty"`
	// MaxHold, when set, bounds how long after the poller queued it a change
	// is held for an output that is down; an older change's failures count
	// toward the DLQ again. Default: no bound (the queue's retention,
	// renewed by every resend).
	MaxHold Duration `json:"max_hold,omitempty"`
}

// PostgresOutput writes documents to PostgreSQL.
type PostgresOutput struct {
	// DSN is the connection string, by reference.
	DSN SecretRef `json:"dsn"`
	// Table receives documents in document mode. Default: the output id.
	Table string `json:"table"`
	// Schema is the PostgreSQL schema. Default public.
	Schema string `json:"schema"`
	// CreateTables creates missing tables when the writer starts.
	CreateTables bool `json:"create_tables"`
	// MaxConns bounds the pool per writer instance. Default 4.
	MaxConns int `json:"max_conns"`
	// Mapping, when set, maps documents to relational tables instead of document mode.
	Mapping *Mapping `json:"mapping,omitempty"`
}

// HTTPOutput sends documents to a REST endpoint.
type HTTPOutput struct {
	// URL is a template; {doc_id} is replaced by the path-escaped document id,
	// {secret} (in the path or query) by the value URLSecret points at. Errors
	// and logs show the template, never the URL built from it.
	URL string `json:"url"`
	// URLSecret is the part of the URL that is a credential (a webhook token),
	// by reference; required exactly when URL holds {secret}.
	URLSecret *SecretRef `json:"url_secret,omitempty"`
	// Method is PUT (default), POST or PATCH; tombstones use DELETE.
	Method string `json:"method"`
	// Headers are sent with every request. A header whose name looks like a
	// credential (CredentialName) must be a secret reference.
	Headers         map[string]HeaderValue `json:"headers,omitempty"`
	Auth            *Auth                  `json:"auth,omitempty"`
	Timeout         Duration               `json:"timeout,omitempty"`
	FollowRedirects bool                   `json:"follow_redirects"`
}

// HeaderValue is the value of a configured header: literal text for what is
// not secret ("X-Source": "demo"), or a secret reference ({"env": ...} or
// {"secret": ...}) resolved when the writer starts. Exactly one of Value and
// Ref is set.
type HeaderValue struct {
	Value string
	Ref   *SecretRef
}

// UnmarshalJSON reads a string or a secret reference object; unknown keys
// in the object are errors.
func (h *HeaderValue) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var r SecretRef
		if err := dec.Decode(&r); err != nil {
			return fmt.Errorf("decode header reference: %w", err)
		}
		*h = HeaderValue{Ref: &r}
		return nil
	}
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return errors.New(`decode header: a header value is a string or a secret reference ({"env": ...} or {"secret": ...})`)
	}
	*h = HeaderValue{Value: v}
	return nil
}

// MarshalJSON writes the reference object, or the literal string.
func (h HeaderValue) MarshalJSON() ([]byte, error) {
	if h.Ref != nil {
		return json.Marshal(h.Ref)
	}
	return json.Marshal(h.Value)
}

// credentialWords mark header and query parameter names that carry
// credentials: "X-Api-Key", "Cookie", "Proxy-Authorization", "X-Auth-Token",
// "X-Client-Secret", "access_token", ...
var credentialWords = []string{"auth", "cookie", "token", "secret", "key", "pass", "pwd", "session", "signature", "credential"}

// credentialParams are short query parameter names of well-known signed or
// keyed URLs (SAS "sig", function "code").
var credentialParams = []string{"sig", "code"}

// CredentialName reports whether a header or query parameter of this name
// looks like it carries a credential, so that its value may only be given
// by reference. The match is deliberately broad (any name containing "auth",
// "cookie", "token", "secret", "key", "pass", "pwd", "session", "signature"
// or "credential", case-insensitive): a false positive costs a reference, a
// false negative a credential in plain text.
func CredentialName(name string) bool {
	n := strings.ToLower(name)
	return slices.ContainsFunc(credentialWords, func(w string) bool { return strings.Contains(n, w) }) ||
		slices.Contains(credentialParams, n)
}

// S3Output writes one JSON object per document.
type S3Output struct {
	// Bucket defaults to the stack bucket.
	Bucket string `json:"bucket"`
	// Prefix is prepended to every key; no key can leave it.
	Prefix string `json:"prefix"`
	// KeyTemplate builds the key below the prefix; {doc_id} is the escaped id.
	// Default "{doc_id}.json".
	KeyTemplate string `json:"key_template"`
}

// Duration is a time.Duration written as a Go duration string ("10s") or a
// number of seconds. No setting takes 0: a key left out gets its default,
// and a 0 written in the file is refused by Validate rather than replaced.
type Duration time.Duration

// zeroGiven is what a duration written as 0 decodes to, so that defaults do
// not replace it and Validate can refuse it by name. It never leaves Parse.
const zeroGiven = Duration(math.MinInt64)

// zeroRefused is Validate's message for a duration written as 0.
const zeroRefused = "0 is not allowed: leave the key out for the default (%s)"

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("parse duration %q: %w", s, err)
		}
		*d = Duration(v)
		if v == 0 {
			*d = zeroGiven
		}
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration must be a string like \"10s\" or a number of seconds, got %s", b)
	}
	*d = Duration(n * float64(time.Second))
	if *d == 0 {
		*d = zeroGiven
	}
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return f, nil
}

// Parse decodes, defaults and validates a configuration document.
// Unknown keys are errors, so a misspelt setting is never silently ignored.
func Parse(b []byte) (*File, error) {
	dec := json.NewDecoder(bytes.NewReader(StripComments(b)))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	f.SetDefaults()
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// SetDefaults fills every unset setting with its default.
func (f *File) SetDefaults() {
	if f.Stack.Prefix == "" {
		f.Stack.Prefix = DefaultPrefix
	}
	if f.Stack.Bucket == "" {
		f.Stack.Bucket = f.Stack.Prefix + "-data"
	}
	if f.Stack.MaxMessageBytes == 0 {
		f.Stack.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if f.Stack.PollerTimeout == 0 {
		f.Stack.PollerTimeout = Duration(DefaultPollerTimeout)
	}
	if f.Stack.WriterTimeout == 0 {
		f.Stack.WriterTimeout = Duration(DefaultWriterTimeout)
	}
	if f.Stack.LogRetentionDays == 0 {
		f.Stack.LogRetentionDays = 30
	}
	if f.Stack.Retain == nil {
		t := true
		f.Stack.Retain = &t
	}
	if f.Stack.Dashboards == nil {
		t := true
		f.Stack.Dashboards = &t
	}
	for _, j := range f.Jobs {
		if j == nil {
			continue
		}
		if j.Feed.Limit == 0 {
			j.Feed.Limit = DefaultLimit
		}
		if j.Feed.Timeout == 0 {
			j.Feed.Timeout = Duration(DefaultFeedTimeout)
		}
		if j.Feed.Mode == "" {
			j.Feed.Mode = ModeLongpoll
		}
		if j.Feed.FloodThreshold == 0 {
			j.Feed.FloodThreshold = DefaultFloodThreshold
		}
		if j.Feed.Fetch == "" {
			j.Feed.Fetch = FetchIncludeDocs
		}
		if j.Feed.MaxAnswerBytes == 0 {
			j.Feed.MaxAnswerBytes = DefaultMaxAnswerBytes
		}
		if j.Feed.PageBytes == 0 {
			j.Feed.PageBytes = min(DefaultPageBytes, j.Feed.MaxAnswerBytes)
		}
		if j.Feed.QuarantineAfter == 0 {
			j.Feed.QuarantineAfter = DefaultQuarantineAfter
		}
		if j.Lease.TTL == 0 {
			j.Lease.TTL = Duration(DefaultLeaseTTL)
		}
		if j.Schedule == 0 {
			j.Schedule = Duration(DefaultSchedule)
		}
		if j.LatencyObjective == 0 {
			j.LatencyObjective = Duration(DefaultLatencyObjective)
		}
		if j.Idle == "" {
			j.Idle = DefaultIdle
		}
		if j.SendConcurrency == 0 {
			j.SendConcurrency = DefaultSendConcurrency
		}
		if j.SendDepth == 0 {
			j.SendDepth = DefaultSendDepth
		}
		if a := j.Attachments; a != nil && a.Enabled {
			a.defaults(f.Stack.Bucket, j.ID)
		}
		for _, o := range j.Outputs {
			if o == nil {
				continue
			}
			if o.Ordering == "" {
				o.Ordering = OrderingNone
				if o.Type == OutputHTTP {
					o.Ordering = OrderingPerDocument
				}
			}
			if o.OnFailure == "" {
				o.OnFailure = OnFailureDLQ
			}
			if o.MaxReceiveCount == 0 {
				o.MaxReceiveCount = DefaultMaxReceiveCount
			}
			if o.BatchSize == 0 {
				o.BatchSize = MaxFIFOBatchSize
				if o.Type == OutputPostgres && !o.FIFO() {
					o.BatchSize = DefaultBatchSize
				}
			}
			if o.MaxConcurrency == 0 {
				o.MaxConcurrency = 2
			}
			if o.Backpressure.Threshold == 0 {
				o.Backpressure.Threshold = DefaultBackpressureThreshold
			}
			if o.Backpressure.BaselineRequests == 0 {
				o.Backpressure.BaselineRequests = DefaultBackpressureBaseline
			}
			if o.Backpressure.Window == 0 {
				o.Backpressure.Window = DefaultBackpressureWindow
			}
			if o.Backpressure.MinIncrease == 0 {
				o.Backpressure.MinIncrease = Duration(DefaultBackpressureMinIncrease)
			}
			if o.Outage.Retry == 0 {
				o.Outage.Retry = Duration(DefaultOutageRetry)
			}
			if o.Outage.MaxRetry == 0 {
				o.Outage.MaxRetry = Duration(max(DefaultOutageMaxRetry, o.Outage.Retry.D()))
			}
			switch {
			case o.Postgres != nil:
				if o.Postgres.Table == "" {
					o.Postgres.Table = strings.ReplaceAll(o.ID, "-", "_")
				}
				if o.Postgres.Schema == "" {
					o.Postgres.Schema = "public"
				}
				if o.Postgres.MaxConns == 0 {
					o.Postgres.MaxConns = 4
				}
			case o.HTTP != nil:
				if o.HTTP.Method == "" {
					o.HTTP.Method = "PUT"
				}
				if o.HTTP.Timeout == 0 {
					o.HTTP.Timeout = Duration(DefaultHTTPTimeout)
				}
			case o.S3 != nil:
				if o.S3.Bucket == "" {
					o.S3.Bucket = f.Stack.Bucket
				}
				if o.S3.KeyTemplate == "" {
					o.S3.KeyTemplate = "{doc_id}.json"
				}
			}
		}
	}
}

var (
	idPattern     = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	prefixPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,29}$`)
	identPattern  = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// Validate reports every problem in the file at once, each naming its field.
func (f *File) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !prefixPattern.MatchString(f.Stack.Prefix) {
		bad("stack.prefix", "%q must be 1-30 lowercase letters, digits or '-'", f.Stack.Prefix)
	}
	if f.Stack.MaxMessageBytes < 1024 || f.Stack.MaxMessageBytes > 1024*1024 {
		bad("stack.max_message_bytes", "%d must be between 1024 and 1048576", f.Stack.MaxMessageBytes)
	}
	if t := f.Stack.PollerTimeout; t == zeroGiven {
		bad("stack.poller_timeout", zeroRefused, DefaultPollerTimeout)
	} else if t.D() < 10*time.Second || t.D() > 15*time.Minute {
		bad("stack.poller_timeout", "%s must be between 10s and 15m", t.D())
	}
	if t := f.Stack.WriterTimeout; t == zeroGiven {
		bad("stack.writer_timeout", zeroRefused, DefaultWriterTimeout)
	} else if t.D() < time.Second || t.D() > 15*time.Minute {
		bad("stack.writer_timeout", "%s must be between 1s and 15m", t.D())
	}
	if v := f.Stack.VPC; v != nil && (v.ID == "" || len(v.SubnetIDs) == 0 || len(v.SecurityGroupIDs) == 0) {
		bad("stack.vpc", "id, subnet_ids and security_group_ids are all required")
	}
	if len(f.Jobs) == 0 {
		bad("jobs", "at least one job is required")
	}
	seen := map[string]bool{}
	for i, j := range f.Jobs {
		p := fmt.Sprintf("jobs[%d]", i)
		if j == nil {
			bad(p, "must be an object")
			continue
		}
		if j.ID != "" {
			p = fmt.Sprintf("jobs[%s]", j.ID)
		}
		if !idPattern.MatchString(j.ID) {
			bad(p+".id", "%q must be 1-32 lowercase letters, digits or '-', starting with a letter or digit", j.ID)
		}
		if seen[j.ID] {
			bad(p+".id", "%q is used by another job", j.ID)
		}
		seen[j.ID] = true
		errs = append(errs, j.validate(p)...)
	}
	errs = append(errs, f.checkNames()...)
	return errors.Join(errs...)
}

func (j *Job) validate(p string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", p, field, fmt.Sprintf(format, args...)))
	}
	s := j.Source
	switch s.Type {
	case SourceCouchDB, SourceSyncGateway, SourceAppServices, SourceEdgeServer:
	case "":
		bad("source.type", "is required (couchdb, sync_gateway, app_services or edge_server)")
	default:
		bad("source.type", "%q is not one of couchdb, sync_gateway, app_services, edge_server", s.Type)
	}
	if err := checkURL(s.URL); err != nil {
		bad("source.url", "%v", err)
	}
	if s.Auth != nil {
		errs = append(errs, s.Auth.validate(p+".source.auth")...)
		if s.Auth.Type == AuthSession && s.Type != SourceSyncGateway && s.Type != SourceAppServices {
			// CouchDB's session is server-wide (/_session, AuthSession) and
			// Edge Server documents none: neither is implemented.
			bad("source.auth.type", "session is for sync_gateway and app_services sources (POST {db}/_session), not %q: use basic", s.Type)
		}
	}
	if s.TLS != nil {
		switch {
		case s.TLS.CAFile == "" && s.TLS.CAPEM == "":
			bad("source.tls", "give ca_file (a PEM bundle's path) or ca_pem (the bundle)")
		case s.TLS.CAFile != "" && s.TLS.CAPEM != "":
			bad("source.tls", "give ca_file or ca_pem, not both")
		case s.TLS.CAPEM != "" && !strings.Contains(s.TLS.CAPEM, "-----BEGIN CERTIFICATE-----"):
			bad("source.tls.ca_pem", "holds no PEM certificate")
		}
		if !strings.HasPrefix(strings.ToLower(s.URL), "https://") {
			bad("source.tls", "needs an https source.url")
		}
	}
	if j.Feed.Limit < 1 || j.Feed.Limit > 10000 {
		bad("feed.limit", "%d must be between 1 and 10000", j.Feed.Limit)
	}
	if j.Feed.FloodThreshold < 1 {
		bad("feed.flood_threshold", "%d must be at least 1", j.Feed.FloodThreshold)
	}
	if t := j.Feed.Timeout; t == zeroGiven {
		// A long-poll of 0 would have an idle poller ask the source as
		// fast as it answers, for its whole time budget.
		bad("feed.timeout", zeroRefused, DefaultFeedTimeout)
	} else if t.D() <= 0 || t.D() > 5*time.Minute {
		bad("feed.timeout", "%s must be more than 0 and at most 5m", t.D())
	}
	if err := ModeFits(j.Feed.Mode, s.Type); err != nil {
		bad("feed.mode", "%v", err)
	}
	if j.Feed.Fetch != FetchIncludeDocs && j.Feed.Fetch != FetchBulkGet {
		bad("feed.fetch", "%q is not include_docs or bulk_get", j.Feed.Fetch)
	}
	if n := j.Feed.MaxAnswerBytes; n < 1<<20 || n > 128<<20 {
		bad("feed.max_answer_bytes", "%d must be between 1048576 (1 MiB) and 134217728 (128 MiB)", n)
	}
	if n := j.Feed.PageBytes; n < 64<<10 || n > j.Feed.MaxAnswerBytes {
		bad("feed.page_bytes", "%d must be between 65536 (64 KiB) and max_answer_bytes (%d)", n, j.Feed.MaxAnswerBytes)
	}
	if n := j.Feed.QuarantineAfter; n < 1 || n > 100 {
		bad("feed.quarantine_after", "%d must be between 1 and 100", n)
	}
	if len(j.Feed.Channels) > 0 && s.Type == SourceCouchDB {
		bad("feed.channels", "channels need a Sync Gateway, App Services or Edge Server source")
	}
	for i, c := range j.Feed.Channels {
		if c == "" || strings.Contains(c, ",") {
			bad(fmt.Sprintf("feed.channels[%d]", i), "%q must be non-empty and contain no comma", c)
		}
	}
	if ttl := j.Lease.TTL; ttl == zeroGiven {
		bad("lease.ttl", zeroRefused, DefaultLeaseTTL)
	} else if ttl.D() < time.Second || ttl.D() > 10*time.Minute {
		bad("lease.ttl", "%s must be between 1s and 10m", ttl.D())
	}
	if d := j.Schedule; d == zeroGiven {
		bad("schedule", zeroRefused, DefaultSchedule)
	} else if d.D() < time.Minute || d.D()%time.Minute != 0 {
		bad("schedule", "%s must be a whole number of minutes, at least 1m", d.D())
	}
	if d := j.LatencyObjective; d == zeroGiven {
		bad("latency_objective", zeroRefused, DefaultLatencyObjective)
	} else if d.D() < time.Second {
		bad("latency_objective", "%s must be at least 1s", d.D())
	}
	if j.Idle != IdleWatch && j.Idle != IdleSleep {
		bad("idle", "%q is not watch or sleep", j.Idle)
	}
	if j.SendConcurrency < 1 || j.SendConcurrency > MaxSendConcurrency {
		bad("send_concurrency", "%d must be between 1 and %d", j.SendConcurrency, MaxSendConcurrency)
	}
	if j.SendDepth < 1 || j.SendDepth > MaxSendDepth {
		bad("send_depth", "%d must be between 1 and %d", j.SendDepth, MaxSendDepth)
	}
	if len(j.Outputs) == 0 {
		bad("outputs", "at least one output is required")
	}
	if a := j.Attachments; a != nil {
		errs = append(errs, a.validate(p+".attachments")...)
	}
	seen := map[string]bool{}
	for i, o := range j.Outputs {
		op := fmt.Sprintf("%s.outputs[%d]", p, i)
		if o == nil {
			errs = append(errs, fmt.Errorf("%s: must be an object", op))
			continue
		}
		if o.ID != "" {
			op = fmt.Sprintf("%s.outputs[%s]", p, o.ID)
		}
		if !idPattern.MatchString(o.ID) {
			errs = append(errs, fmt.Errorf("%s.id: %q must be 1-32 lowercase letters, digits or '-'", op, o.ID))
		}
		if seen[o.ID] {
			errs = append(errs, fmt.Errorf("%s.id: %q is used by another output of this job", op, o.ID))
		}
		seen[o.ID] = true
		errs = append(errs, o.validate(op)...)
	}
	return errs
}

func (o *Output) validate(p string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", p, field, fmt.Sprintf(format, args...)))
	}
	settings := 0
	for _, set := range []bool{o.Postgres != nil, o.HTTP != nil, o.S3 != nil} {
		if set {
			settings++
		}
	}
	if settings > 1 {
		bad("type", "only the settings block of the output's own type may be given")
	}
	switch o.Type {
	case OutputPostgres:
		if o.Postgres == nil {
			bad("postgres", "is required for a postgres output")
		} else {
			errs = append(errs, o.Postgres.validate(p+".postgres")...)
		}
	case OutputHTTP:
		if o.HTTP == nil {
			bad("http", "is required for an http output")
		} else {
			errs = append(errs, o.HTTP.validate(p+".http")...)
		}
	case OutputS3:
		if o.S3 == nil {
			bad("s3", "is required for an s3 output")
		} else {
			errs = append(errs, o.S3.validate(p+".s3")...)
		}
	case "":
		bad("type", "is required (postgres, http or s3)")
	default:
		bad("type", "%q is not one of postgres, http, s3", o.Type)
	}
	if o.Ordering != OrderingPerDocument && o.Ordering != OrderingTotal && o.Ordering != OrderingNone {
		bad("ordering", "%q is not per_document, total or none", o.Ordering)
	}
	switch o.OnFailure {
	case OnFailureDLQ:
	case OnFailureHalt:
		if o.Ordering == OrderingNone {
			bad("on_failure", "halt needs a FIFO queue: set ordering to total or per_document")
		}
		if o.MaxReceiveCount > MaxHaltReceiveCount {
			bad("max_receive_count", "%d: with on_failure halt at most %d (the rest of SQS's 1000 receives keep the halted change in the queue)", o.MaxReceiveCount, MaxHaltReceiveCount)
		}
	default:
		bad("on_failure", "%q is not dlq or halt", o.OnFailure)
	}
	if o.MaxReceiveCount < 1 || o.MaxReceiveCount > 1000 {
		bad("max_receive_count", "%d must be between 1 and 1000", o.MaxReceiveCount)
	}
	switch {
	case o.FIFO() && (o.BatchSize < 1 || o.BatchSize > MaxFIFOBatchSize):
		bad("batch_size", "%d must be between 1 and %d on a FIFO queue (ordering per_document)", o.BatchSize, MaxFIFOBatchSize)
	case o.BatchSize < 1 || o.BatchSize > MaxBatchSize:
		bad("batch_size", "%d must be between 1 and %d", o.BatchSize, MaxBatchSize)
	}
	if o.MaxConcurrency < 2 || o.MaxConcurrency > 1000 {
		bad("max_concurrency", "%d must be between 2 and 1000", o.MaxConcurrency)
	}
	if t := o.Backpressure.Threshold; t <= 1 || t > 100 {
		bad("backpressure.threshold", "%g must be above 1 and at most 100", t)
	}
	if n := o.Backpressure.BaselineRequests; n < 1 || n > 100000 {
		bad("backpressure.baseline_requests", "%d must be between 1 and 100000", n)
	}
	if n := o.Backpressure.Window; n < 1 || n > 10000 {
		bad("backpressure.window", "%d must be between 1 and 10000", n)
	}
	if d := o.Backpressure.MinIncrease; d == zeroGiven {
		bad("backpressure.min_increase", zeroRefused, DefaultBackpressureMinIncrease)
	} else if d.D() <= 0 || d.D() > time.Minute {
		bad("backpressure.min_increase", "%s must be more than 0 and at most 1m", d.D())
	}
	errs = append(errs, o.Outage.validate(p+".outage")...)
	return errs
}

// maxOutageRetry bounds outage.max_retry: a message held for a down output
// is made visible again (or sent back, delayed) after at most that long, and
// SQS delays a message at most 15 minutes.
const maxOutageRetry = 15 * time.Minute

func (u Outage) validate(p string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", p, field, fmt.Sprintf(format, args...)))
	}
	if u.Retry == zeroGiven {
		bad("retry", zeroRefused, DefaultOutageRetry)
	} else if u.Retry.D() < time.Second || u.Retry.D() > maxOutageRetry {
		bad("retry", "%s must be between 1s and %s", u.Retry.D(), maxOutageRetry)
	}
	if u.MaxRetry == zeroGiven {
		bad("max_retry", zeroRefused, DefaultOutageMaxRetry)
	} else if u.MaxRetry.D() < u.Retry.D() || u.MaxRetry.D() > maxOutageRetry {
		bad("max_retry", "%s must be at least retry (%s) and at most %s", u.MaxRetry.D(), u.Retry.D(), maxOutageRetry)
	}
	if u.MaxHold == zeroGiven {
		bad("max_hold", "0 is not allowed: leave the key out to hold changes for as long as the output is down")
	} else if u.MaxHold.D() < 0 {
		bad("max_hold", "%s must not be negative", u.MaxHold.D())
	}
	return errs
}

func (pg *PostgresOutput) validate(p string) []error {
	var errs []error
	if err := pg.DSN.validate(); err != nil {
		errs = append(errs, fmt.Errorf("%s.dsn: %w", p, err))
	}
	if !identPattern.MatchString(pg.Table) {
		errs = append(errs, fmt.Errorf("%s.table: %q must be a lowercase SQL identifier", p, pg.Table))
	}
	if !identPattern.MatchString(pg.Schema) {
		errs = append(errs, fmt.Errorf("%s.schema: %q must be a lowercase SQL identifier", p, pg.Schema))
	}
	if pg.MaxConns < 1 || pg.MaxConns > 100 {
		errs = append(errs, fmt.Errorf("%s.max_conns: %d must be between 1 and 100", p, pg.MaxConns))
	}
	if pg.Mapping != nil {
		errs = append(errs, pg.Mapping.validate(p+".mapping")...)
	}
	return errs
}

func (h *HTTPOutput) validate(p string) []error {
	var errs []error
	if err := checkURL(strings.NewReplacer("{doc_id}", "x", "{secret}", "x").Replace(h.URL)); err != nil {
		errs = append(errs, fmt.Errorf("%s.url: %w", p, err))
	} else {
		errs = append(errs, h.validateURLTemplate(p)...)
	}
	switch h.Method {
	case "PUT", "POST", "PATCH":
	default:
		errs = append(errs, fmt.Errorf("%s.method: %q is not PUT, POST or PATCH", p, h.Method))
	}
	if h.Auth != nil {
		errs = append(errs, h.Auth.validate(p+".auth")...)
		if h.Auth.Type == AuthSession {
			errs = append(errs, fmt.Errorf("%s.auth.type: session is for a Sync Gateway source, not an output: use basic or bearer", p))
		}
	}
	if t := h.Timeout; t == zeroGiven {
		errs = append(errs, fmt.Errorf("%s.timeout: "+zeroRefused, p, DefaultHTTPTimeout))
	} else if t.D() <= 0 || t.D() > 5*time.Minute {
		errs = append(errs, fmt.Errorf("%s.timeout: %s must be more than 0 and at most 5m", p, t.D()))
	}
	names := slices.Sorted(maps.Keys(h.Headers))
	for _, k := range names {
		v, hp := h.Headers[k], fmt.Sprintf("%s.headers[%s]", p, k)
		switch {
		case !validHeaderName(k):
			errs = append(errs, fmt.Errorf("%s: the name must be an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", hp))
		case strings.EqualFold(k, "authorization"):
			errs = append(errs, fmt.Errorf("%s: set Authorization through auth (basic or bearer), by reference", hp))
		case v.Ref != nil:
			if err := v.Ref.validate(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", hp, err))
			}
		case CredentialName(k):
			errs = append(errs, fmt.Errorf(`%s: looks like a credential: give it as a secret reference ({"env": ...} or {"secret": ...}), never the value`, hp))
		case strings.ContainsFunc(v.Value, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }):
			errs = append(errs, fmt.Errorf("%s: the value holds control characters", hp))
		}
	}
	return errs
}

// validateURLTemplate checks where {secret} is, that url_secret comes with
// it, and that no query parameter that looks like a credential has a
// literal value. Errors never quote the template's query.
func (h *HTTPOutput) validateURLTemplate(p string) []error {
	var errs []error
	rest, query, _ := strings.Cut(h.URL, "?")
	_, afterScheme, _ := strings.Cut(rest, "://")
	host, path, _ := strings.Cut(afterScheme, "/")
	hasSecret := strings.Contains(h.URL, "{secret}")
	if slices.ContainsFunc(strings.Split(path, "/"), func(seg string) bool { return seg == "." || seg == ".." }) {
		errs = append(errs, fmt.Errorf(`%s.url: the path must not have a "." or ".." segment`, p))
	}
	switch {
	case strings.Contains(host, "{secret}") || strings.Contains(host, "{doc_id}"):
		errs = append(errs, fmt.Errorf("%s.url: {doc_id} and {secret} may only appear in the path or query", p))
	case hasSecret && h.URLSecret == nil:
		errs = append(errs, fmt.Errorf("%s.url_secret: is required when url holds {secret}", p))
	case !hasSecret && h.URLSecret != nil:
		errs = append(errs, fmt.Errorf("%s.url: must contain {secret} where url_secret goes", p))
	}
	if h.URLSecret != nil {
		if err := h.URLSecret.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s.url_secret: %w", p, err))
		}
	}
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if name, err := url.QueryUnescape(k); err == nil && CredentialName(name) && v != "" && v != "{secret}" && v != "{doc_id}" {
			errs = append(errs, fmt.Errorf("%s.url: query parameter %s looks like a credential: write {secret} as its value and give url_secret by reference", p, name))
		}
	}
	return errs
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func (s *S3Output) validate(p string) []error {
	var errs []error
	if s.Bucket == "" {
		errs = append(errs, fmt.Errorf("%s.bucket: is required", p))
	}
	if !strings.Contains(s.KeyTemplate, "{doc_id}") {
		errs = append(errs, fmt.Errorf("%s.key_template: %q must contain {doc_id}", p, s.KeyTemplate))
	}
	dotSegment := func(k string) bool { return slices.Contains(strings.Split(k, "/"), ".") }
	if strings.Contains(s.Prefix, "..") || strings.HasPrefix(s.Prefix, "/") || dotSegment(s.Prefix) {
		errs = append(errs, fmt.Errorf("%s.prefix: %q must not start with '/', contain '..' or have a '.' segment", p, s.Prefix))
	}
	if strings.Contains(s.KeyTemplate, "..") || strings.HasPrefix(s.KeyTemplate, "/") || dotSegment(s.KeyTemplate) {
		errs = append(errs, fmt.Errorf("%s.key_template: %q must not start with '/', contain '..' or have a '.' segment", p, s.KeyTemplate))
	}
	return errs
}

func (a *Auth) validate(p string) []error {
	var errs []error
	switch a.Type {
	case AuthBasic, AuthSession:
		if a.Username == "" {
			errs = append(errs, fmt.Errorf("%s.username: is required for %s auth", p, a.Type))
		}
		if a.Password == nil {
			errs = append(errs, fmt.Errorf("%s.password: is required for %s auth", p, a.Type))
		} else if err := a.Password.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s.password: %w", p, err))
		}
	case "bearer":
		if a.Token == nil {
			errs = append(errs, fmt.Errorf("%s.token: is required for bearer auth", p))
		} else if err := a.Token.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s.token: %w", p, err))
		}
	default:
		errs = append(errs, fmt.Errorf("%s.type: %q is not basic, bearer or session", p, a.Type))
	}
	return errs
}

func (r SecretRef) validate() error {
	switch {
	case r.Env == "" && r.Secret == "":
		return errors.New("give env (an environment variable) or secret (a Secrets Manager name or ARN); the value itself never goes in this file")
	case r.Env != "" && r.Secret != "":
		return errors.New("give env or secret, not both")
	case r.JSONKey != "" && r.Secret == "":
		return errors.New("json_key only applies to secret")
	}
	return nil
}

func checkURL(s string) error {
	if s == "" {
		return errors.New("is required")
	}
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		// Quoted up to the query, which may hold a key.
		shown, _, _ := strings.Cut(s, "?")
		return fmt.Errorf("%q must start with http:// or https://", shown)
	}
	if strings.Contains(s, "@") {
		return errors.New("must not contain credentials; use auth with a secret reference")
	}
	return nil
}

// StripComments removes // and /* */ comments that are outside JSON strings.
func StripComments(b []byte) []byte {
	out := make([]byte, 0, len(b))
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			out = append(out, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			out = append(out, c)
			continue
		}
		if c == '/' && i+1 < len(b) && b[i+1] == '/' {
			for i < len(b) && b[i] != '\n' {
				i++
			}
			out = append(out, '\n')
			continue
		}
		if c == '/' && i+1 < len(b) && b[i+1] == '*' {
			i += 2
			for i+1 < len(b) && !(b[i] == '*' && b[i+1] == '/') {
				i++
			}
			i++
			out = append(out, ' ')
			continue
		}
		out = append(out, c)
	}
	return out
}

// Job returns the job with the given id, or nil.
func (f *File) Job(id string) *Job {
	for _, j := range f.Jobs {
		if j.ID == id {
			return j
		}
	}
	return nil
}

// Output returns the output with the given id, or nil.
func (j *Job) Output(id string) *Output {
	for _, o := range j.Outputs {
		if o.ID == id {
			return o
		}
	}
	return nil
}

// IdleStay is how long, from its start, a poller invocation of a job with
// idle sleep reads an idle feed before it ends: a change made just after it
// ends waits for the next tick (a schedule after the start) and is
// delivered within SleepAllowance of it, so within the latency objective.
// Where the schedule is no longer than the objective, that is
// SleepAllowance.
func (j *Job) IdleStay() time.Duration {
	return max(j.Schedule.D()-j.LatencyObjective.D(), 0) + SleepAllowance
}

// ModeFits reports whether a source type offers a feed mode.
func ModeFits(mode, sourceType string) error {
	switch mode {
	case ModeLongpoll, ModeContinuous:
		return nil
	case ModeWebSocket:
		if sourceType == SourceSyncGateway || sourceType == SourceAppServices {
			return nil
		}
		return fmt.Errorf("%q needs a sync_gateway or app_services source, not %s", mode, sourceType)
	case ModeSSE:
		if sourceType == SourceEdgeServer {
			return nil
		}
		return fmt.Errorf("%q needs an edge_server source, not %s", mode, sourceType)
	case ModeEventSource:
		if sourceType == SourceCouchDB {
			return nil
		}
		return fmt.Errorf("%q needs a couchdb source, not %s", mode, sourceType)
	}
	return fmt.Errorf("%q is not one of longpoll, continuous, websocket, sse, eventsource", mode)
}
