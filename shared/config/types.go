package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
	// envelope travels as an S3 pointer (claim check). Default 262144, at
	// most the package's MaxMessageBytes.
	MaxMessageBytes int `json:"max_message_bytes,omitempty"`
	// AlarmEmail, when set, is subscribed to the alarm topic.
	AlarmEmail string `json:"alarm_email"`
	// PollerTimeout is the timeout of every job's poller function, its time
	// budget per invocation. Unset, each job's is derived from its schedule
	// (File.PollerTimeout), so that an invocation always stands by beside
	// the one holding the lease.
	PollerTimeout Duration `json:"poller_timeout,omitempty"`
	// WriterTimeout is the writer function's timeout. Default 30s.
	WriterTimeout Duration `json:"writer_timeout,omitempty"`
	// LogRetentionDays for the functions' log groups. Default 30.
	LogRetentionDays int `json:"log_retention_days,omitempty"`
	// PollerMemoryMB and WriterMemoryMB are the functions' memory, which
	// their CPU share follows (1,769 MB is one vCPU). Default 256 and 512;
	// 128 to 10240.
	PollerMemoryMB int `json:"poller_memory_mb,omitempty"`
	WriterMemoryMB int `json:"writer_memory_mb,omitempty"`
	// Retain keeps the table, the buckets, the secrets and the log groups
	// when the stack is deleted. Default true.
	Retain *bool `json:"retain,omitempty"`
	// Dashboards gives each job a CloudWatch dashboard <prefix>-<job>-<region>.
	// Default true. An account's first three dashboards are free, each
	// further one costs $3 a month: about as much as the rest of an idle
	// job with idle sleep, which may want it off (the alarms and changesctl
	// status still show where each job stands).
	Dashboards *bool `json:"dashboards,omitempty"`
	// DocIDs is how document ids appear in the functions' logs, the
	// failure attributes of DLQ messages and the halt and quarantine
	// records: DocIDsPlain, DocIDsHash or DocIDsOff. Default plain.
	DocIDs string `json:"doc_ids,omitempty"`
	// VPC places the functions in a VPC (to reach a private database).
	VPC *VPC `json:"vpc,omitempty"`
	// DLQ sets how long the DLQs keep failed changes, when the pollers
	// archive them, and when the alarms call for an operator.
	DLQ DLQ `json:"dlq,omitzero"`
}

// DLQ sets what happens to the changes waiting in the DLQs. SQS deletes a
// message Retention after it was queued (in a standard DLQ, its time in the
// work queue counts). Before that, once it has waited ArchiveAfter, the
// job's poller archives it to the stack bucket, where it stays until an
// operator redrives or purges it: nothing expires unseen.
type DLQ struct {
	// Retention is every DLQ's message retention period. Default 14 days,
	// SQS's maximum; lower it only to see the archive at work.
	Retention Duration `json:"retention,omitempty"`
	// ArchiveAfter is how long after it was queued (its SentTimestamp) a
	// DLQ message is archived. Default: Retention less two days, or less
	// half of it when that is shorter, or less twice what the pollers may go
	// without archiving (see SweepGap) when that is longer.
	ArchiveAfter Duration `json:"archive_after,omitempty"`
	// AlarmAfter is how long a failed change may wait, in a DLQ or its
	// archive, before an alarm fires. Default 1 day.
	AlarmAfter Duration `json:"alarm_after,omitempty"`
}

// Values of Stack.DocIDs (docid.Exposure).
const (
	DocIDsPlain = "plain" // as they are
	DocIDsHash  = "hash"  // sha256: and 16 hex digits of the id's SHA-256
	DocIDsOff   = "off"   // not at all
)

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
	// A busy feed is read the same way in both. The default is watch
	// because a job made slower by a minute is slower silently, while its
	// bill shows what it costs.
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
	// AllowCleartextCredentials lets Auth travel unencrypted to an http://
	// URL whose host is not a loopback address; refused otherwise.
	AllowCleartextCredentials bool `json:"allow_cleartext_credentials,omitempty"`
}

// TLS names the certificate authorities (a PEM bundle) trusted for a
// source, in addition to the system's (the shape of Capella App Services,
// or a Sync Gateway with its own CA), or for a PostgreSQL output in place
// of them (its sslrootcert). Exactly one of CAFile and CAPEM is set.
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
	Limit int `json:"limit,omitempty"`
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
	FloodThreshold int `json:"flood_threshold,omitempty"`
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
	MaxReceiveCount int `json:"max_receive_count,omitempty"`
	// BatchSize is how many messages the writer takes at once: at most 10 on
	// a FIFO queue, at most 10,000 on a standard one (gathered for up to the
	// batching window). Default DefaultBatchSize for postgres outputs on a
	// standard queue, 10 otherwise.
	BatchSize int `json:"batch_size,omitempty"`
	// MaxConcurrency bounds concurrent writer invocations for this output.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
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
	// above which the writer slows down; it speeds up again under halfway
	// between 1 and Threshold. Default 2; must be above 1.
	Threshold float64 `json:"threshold,omitempty"`
	// BaselineRequests is how many first successful requests of a writer
	// instance make the baseline. Default 50.
	BaselineRequests int `json:"baseline_requests,omitempty"`
	// Window is how many latest requests the rolling average covers.
	// Default 20.
	Window int `json:"window,omitempty"`
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
	// DSN is the connection string, by reference. Its sslmode must say
	// whether connections use TLS: verify-full (or verify-ca, require) or
	// disable; without it, or with prefer or allow, a connection may fall
	// back to clear text, and the writer refuses it.
	DSN SecretRef `json:"dsn"`
	// TLS names the certificate authorities that verify the server (its
	// sslrootcert): the RDS CA bundle, or a private CA.
	TLS *TLS `json:"tls,omitempty"`
	// Table receives documents in document mode. Default: the output id.
	Table string `json:"table"`
	// Schema is the PostgreSQL schema. Default public.
	Schema string `json:"schema"`
	// CreateTables creates missing tables when the writer starts.
	CreateTables bool `json:"create_tables"`
	// MaxConns bounds the pool per writer instance. Default 4.
	MaxConns int `json:"max_conns,omitempty"`
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
	// AllowCleartextCredentials lets Auth, URLSecret and the headers given
	// by reference travel unencrypted to an http:// URL whose host is not
	// a loopback address; refused otherwise.
	AllowCleartextCredentials bool `json:"allow_cleartext_credentials,omitempty"`
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

// S3Output writes one JSON object per document.
type S3Output struct {
	// Bucket defaults to the stack bucket.
	Bucket string `json:"bucket"`
	// Prefix is prepended to every key; no key can leave it. It ends with
	// '/', and no other output, nor the claim checks or attachments, may
	// have keys under it. Default "<job>/<output>/".
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

// SleepAllowance is what a job with idle sleep leaves, within its latency
// objective, for the tick after a change to deliver it: the invocation's
// start (a cold one included), the lease, the read, the send, the writer's
// batching window (1 s) and the write. See Job.IdleStay.
const SleepAllowance = 5 * time.Second

// IdleStay is how long, from its start, a poller invocation of a job with
// idle sleep reads an idle feed before it ends: a change made just after it
// ends waits for the next tick (a schedule after the start) and is
// delivered within SleepAllowance of it, so within the latency objective.
// Where the schedule is no longer than the objective, that is
// SleepAllowance.
func (j *Job) IdleStay() time.Duration {
	return max(j.Schedule.D()-j.LatencyObjective.D(), 0) + SleepAllowance
}
