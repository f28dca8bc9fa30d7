package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/mail"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/failure"
)

// Limits of the settings.
const (
	// MaxFIFOReceiveCount bounds max_receive_count on a FIFO queue: the
	// queue's redrive policy allows SQS's maximum (1000) receives, and the
	// writer counts max_receive_count itself; the rest of the receives are
	// spent by changes held while their output is down or asks to slow down,
	// and by a halted change while it waits for the operator.
	MaxFIFOReceiveCount = 100
	// MaxFIFOBatchSize is SQS's (and Lambda's) cap on a FIFO queue's batch;
	// MaxBatchSize is Lambda's cap on a standard queue's.
	MaxFIFOBatchSize = 10
	MaxBatchSize     = 10000
	// MaxSendConcurrency bounds a job's send_concurrency.
	MaxSendConcurrency = 512
	// MaxSendDepth bounds the chunks a job may overlap.
	MaxSendDepth = 4
	// SQSMessageBytes is the most SQS takes in one message: its body and
	// every attribute's name, data type and value together (1 MiB).
	SQSMessageBytes = 1 << 20
	// HeldCounterBytes is the room kept for the writer's deferral counter
	// (a Number attribute: name, data type and at most 20 digits), which it
	// adds to a message it sends back to its queue.
	HeldCounterBytes = 64
	// MaxMessageBytes bounds stack.max_message_bytes: SQS's limit less the
	// most the writer adds to a body it sends again. A message held back
	// goes back to its queue with the deferral counter, and, redriven from
	// the DLQ, with its failure record too; one moved to the DLQ goes with
	// its failure record (failure.MaxSize).
	MaxMessageBytes = SQSMessageBytes - failure.MaxSize - HeldCounterBytes
	// MinMemoryMB and MaxMemoryMB bound the functions' memory: what
	// Lambda allows.
	MinMemoryMB = 128
	MaxMemoryMB = 10240
	// MaxSchedule bounds a job's schedule: its lease-holder alarm evaluates
	// a few schedule periods, and CloudWatch evaluates an alarm over at most
	// seven days.
	MaxSchedule = 24 * time.Hour
)

// zeroRefused is the message for a duration or a number written as 0.
const zeroRefused = "0 is not allowed: leave the key out for the default (%s)"

// memoryRefused is Validate's message for a function's memory out of
// Lambda's bounds.
const memoryRefused = "%d must be between %d and %d (MB, what Lambda allows)"

var (
	idPattern     = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	prefixPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,29}$`)
	identPattern  = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// Validate reports every problem in the file at once, each naming its field.
func (f *File) Validate() error { return errors.Join(f.problems()...) }

// problems are Validate's errors, one a problem.
func (f *File) problems() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !prefixPattern.MatchString(f.Stack.Prefix) {
		bad("stack.prefix", "%q must be 1-30 lowercase letters, digits or '-'", f.Stack.Prefix)
	}
	if d := f.Stack.DocIDs; d != DocIDsPlain && d != DocIDsHash && d != DocIDsOff {
		bad("stack.doc_ids", "%q is not plain, hash or off", d)
	}
	if e := f.Stack.AlarmEmail; e != "" && !emailAddress(e) {
		bad("stack.alarm_email", "%q is not one e-mail address (name@example.com)", e)
	}
	if f.Stack.MaxMessageBytes < 1024 || f.Stack.MaxMessageBytes > MaxMessageBytes {
		bad("stack.max_message_bytes", "%d must be between 1024 and %d (SQS's 1 MiB less the attributes of a message held back or dead-lettered)", f.Stack.MaxMessageBytes, MaxMessageBytes)
	}
	if t := f.Stack.PollerTimeout; t == zeroGiven {
		bad("stack.poller_timeout", zeroRefused, fmt.Sprintf("two of each job's schedule periods plus %s", PollerStandbyAllowance))
	} else if t != 0 && (t.D() < 10*time.Second || t.D() > MaxPollerTimeout) {
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
	if mb := f.Stack.PollerMemoryMB; mb < MinMemoryMB || mb > MaxMemoryMB {
		bad("stack.poller_memory_mb", memoryRefused, mb, MinMemoryMB, MaxMemoryMB)
	}
	if mb := f.Stack.WriterMemoryMB; mb < MinMemoryMB || mb > MaxMemoryMB {
		bad("stack.writer_memory_mb", memoryRefused, mb, MinMemoryMB, MaxMemoryMB)
	}
	if len(f.Jobs) == 0 {
		bad("jobs", "at least one job is required")
	}
	seen := map[string]bool{}
	for i, j := range f.Jobs {
		if j == nil {
			bad(fmt.Sprintf("jobs[%d]", i), "must be an object")
			continue
		}
		p := item("jobs", i, j.ID)
		if !idPattern.MatchString(j.ID) {
			bad(p+".id", "%q must be 1-32 lowercase letters, digits or '-', starting with a letter or digit", j.ID)
		}
		if seen[j.ID] {
			bad(p+".id", "%q is used by another job", j.ID)
		}
		seen[j.ID] = true
		errs = append(errs, j.validate(p)...)
	}
	errs = append(errs, f.validateDLQ()...)
	errs = append(errs, f.checkNames()...)
	errs = append(errs, f.checkObjectAreas()...)
	return append(errs, f.checkPostgresTables()...)
}

// item names element i of the list at key list in an error: by its id when
// it has one, else by its index.
func item(list string, i int, id string) string {
	if id != "" {
		return fmt.Sprintf("%s[%s]", list, id)
	}
	return fmt.Sprintf("%s[%d]", list, i)
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
	} else if strings.ContainsAny(s.URL, "?#") {
		// The feed client refuses them: it adds its own paths to the URL.
		bad("source.url", "must not have a query or fragment: credentials go in source.auth, by reference (the URL is not shown)")
	} else if s.Auth != nil && !s.AllowCleartextCredentials {
		if host, clear := cleartextHost(s.URL); clear {
			bad("source.url", cleartextRefused, "source.auth", host, "source")
		}
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
		errs = append(errs, s.TLS.validate(p+".source.tls")...)
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
	} else if d.D() < time.Minute || d.D() > MaxSchedule || d.D()%time.Minute != 0 {
		bad("schedule", "%s must be a whole number of minutes, from 1m to %dh", d.D(), MaxSchedule/time.Hour)
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
		if o == nil {
			errs = append(errs, fmt.Errorf("%s.outputs[%d]: must be an object", p, i))
			continue
		}
		op := p + "." + item("outputs", i, o.ID)
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
	default:
		bad("on_failure", "%q is not dlq or halt", o.OnFailure)
	}
	switch {
	case o.MaxReceiveCount < 1 || o.MaxReceiveCount > 1000:
		bad("max_receive_count", "%d must be between 1 and 1000", o.MaxReceiveCount)
	case o.FIFO() && o.MaxReceiveCount > MaxFIFOReceiveCount:
		bad("max_receive_count", "%d: on a FIFO queue (ordering %s) at most %d (the rest of SQS's 1000 receives keep held and halted changes in the queue)", o.MaxReceiveCount, o.Ordering, MaxFIFOReceiveCount)
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
	if pg.TLS != nil {
		errs = append(errs, pg.TLS.validate(p+".tls")...)
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
		if creds := h.credentials(); len(creds) > 0 && !h.AllowCleartextCredentials {
			if host, clear := cleartextHost(h.URL); clear {
				errs = append(errs, fmt.Errorf("%s.url: "+cleartextRefused, p, strings.Join(creds, ", "), host, "http"))
			}
		}
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

// credentials names the settings of h that put a credential in its
// requests.
func (h *HTTPOutput) credentials() []string {
	var creds []string
	if h.Auth != nil {
		creds = append(creds, "http.auth")
	}
	if h.URLSecret != nil {
		creds = append(creds, "http.url_secret")
	}
	for _, k := range slices.Sorted(maps.Keys(h.Headers)) {
		if h.Headers[k].Ref != nil {
			creds = append(creds, "http.headers["+k+"]")
		}
	}
	return creds
}

// cleartextRefused is Validate's message for credentials bound for an
// http:// URL: what would be sent, to which host, and the block whose
// allow_cleartext_credentials allows it.
const cleartextRefused = "http:// would send %s in clear to %s: use https://, or set %s.allow_cleartext_credentials to true"

// cleartextHost returns the host of u, and whether a request to u goes
// unencrypted over a network: an http:// URL whose host is neither
// "localhost" nor a loopback address. u has passed checkURL (a template's
// placeholders, which checkURL refuses in the host, may remain).
func cleartextHost(u string) (string, bool) {
	rest, ok := strings.CutPrefix(u, "http://")
	if !ok {
		return "", false
	}
	authority, _, _ := strings.Cut(rest, "/")
	authority, _, _ = strings.Cut(authority, "?")
	authority, _, _ = strings.Cut(authority, "#")
	host := authority
	if h, _, err := net.SplitHostPort(authority); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return host, false
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return host, false
	}
	return host, true
}

// emailAddress reports whether s is one bare e-mail address, which SNS can
// subscribe: no display name, no list, a domain with a dot.
func emailAddress(s string) bool {
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s {
		return false
	}
	_, domain, _ := strings.Cut(s, "@")
	return strings.Contains(strings.Trim(domain, "."), ".")
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
	if err := grantablePrefix(s.Prefix); err != nil {
		errs = append(errs, fmt.Errorf("%s.prefix: %q %w", p, s.Prefix, err))
	}
	if strings.Contains(s.KeyTemplate, "..") || strings.HasPrefix(s.KeyTemplate, "/") || dotSegment(s.KeyTemplate) {
		errs = append(errs, fmt.Errorf("%s.key_template: %q must not start with '/', contain '..' or have a '.' segment", p, s.KeyTemplate))
	}
	return errs
}

func (t *TLS) validate(p string) []error {
	switch {
	case t.CAFile == "" && t.CAPEM == "":
		return []error{fmt.Errorf("%s: give ca_file (a PEM bundle's path) or ca_pem (the bundle)", p)}
	case t.CAFile != "" && t.CAPEM != "":
		return []error{fmt.Errorf("%s: give ca_file or ca_pem, not both", p)}
	case t.CAPEM != "" && !strings.Contains(t.CAPEM, "-----BEGIN CERTIFICATE-----"):
		return []error{fmt.Errorf("%s.ca_pem: holds no PEM certificate", p)}
	}
	return nil
}

// grantablePrefix refuses a key prefix that an IAM grant on "<prefix>*"
// would widen: one without a trailing '/' ("archive*" is also
// "archive-2/..."), or with a character IAM reads as a wildcard ('*', '?')
// or a policy variable ('$').
func grantablePrefix(prefix string) error {
	switch {
	case !strings.HasSuffix(prefix, "/"):
		return errors.New("must end with '/': a grant on <prefix>* would cover every key that starts like it")
	case strings.ContainsAny(prefix, "*?$"):
		return errors.New("must not contain '*', '?' or '$', which IAM reads as wildcards or variables")
	}
	return nil
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
	creds := ""
	if strings.Contains(s, "@") {
		creds = ", and must not contain credentials; use auth with a secret reference"
	}
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		if shown, ok := ShownURL(s); ok {
			return fmt.Errorf("%q must start with http:// or https://%s", shown, creds)
		}
		return fmt.Errorf("must start with http:// or https://%s (the value is not shown: it does not start with a scheme and \"://\")", creds)
	}
	if creds != "" {
		return errors.New("must not contain credentials; use auth with a secret reference")
	}
	return nil
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

// ShownURL is u as an error may quote it, and whether it may be quoted at
// all. Only a URL that starts with a scheme and "://" is quoted: without
// them, where its credentials end cannot be told. Of one that does, what
// follows its first '?' or '#' (a query or fragment, which may hold a key)
// is left out, and so is everything between "://" and its last '@'
// (credentials, in whatever form they were written: a password may hold a
// '/', '?' or '#'), which shows as "…". When the last '@' is past the
// first '?' or '#', only the scheme is shown.
func ShownURL(u string) (string, bool) {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok || !validScheme(scheme) {
		return "", false
	}
	end := len(rest)
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndexByte(rest, '@')
	switch {
	case at < 0:
		return scheme + "://" + rest[:end], true
	case at < end:
		return scheme + "://…@" + rest[at+1:end], true
	default:
		return scheme + "://…", true
	}
}

// validScheme reports whether s is an RFC 3986 scheme: a letter, then
// letters, digits, '+', '-' or '.'.
func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}
