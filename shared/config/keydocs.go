package config

import (
	"fmt"
	"strings"
)

// keyDocs documents every key of the file, by its whole key ("[]" for a
// list's elements; "auth." and "secret reference." for the objects found
// in several places). A test requires an entry for every key and no other.
// (A function, so that only what writes the reference builds the map.)
func keyDocs() map[string]keyDoc {
	return map[string]keyDoc{
		"stack": {meaning: "settings every job shares"},
		"jobs":  {def: "required", allowed: "at least one", meaning: "the pipelines, one source each"},

		"stack.prefix":                 {def: "`" + DefaultPrefix + "`", allowed: "1–30 of `a`–`z`, `0`–`9` and `-`, starting with a letter or digit", meaning: "starts the name of every resource: table `<prefix>-state`, queues `<prefix>-<job>-<output>`"},
		"stack.bucket":                 {def: "deployed: a bucket the stack creates, with a generated name; `changesctl bootstrap`: `<prefix>-data`", meaning: "claim-check payloads and S3 outputs that name no bucket; set, an existing bucket the deploy leaves as it is"},
		"stack.max_message_bytes":      {allowed: fmt.Sprintf("1024–%d", MaxMessageBytes), meaning: "largest message body put on a queue; a larger envelope travels as an S3 pointer (claim check). The top leaves room, in SQS's 1 MiB, for the attributes the writer adds to a message it holds back or moves to the DLQ"},
		"stack.alarm_email":            {meaning: "an address subscribed to the alarm topic"},
		"stack.poller_timeout":         {def: "per job: twice its `schedule` plus 15s (2m15s with the default `schedule`), at most 15m", allowed: "10s–15m", meaning: "the poller's time budget per invocation (its Lambda timeout), for every job; the default keeps an invocation standing by beside the active one at every moment, a shorter one leaves part of each `schedule` period without (a warning at synth)"},
		"stack.writer_timeout":         {allowed: "1s–15m", meaning: "the writer's Lambda timeout; the work queues' visibility timeout is 6 times this"},
		"stack.doc_ids":                {allowed: oneOfCode(DocIDsPlain, DocIDsHash, DocIDsOff), meaning: "how document ids appear in the functions' logs, the failure attributes of DLQ messages and the halt and quarantine records: as they are, as `sha256:` and 16 hex digits of their SHA-256 (`changesctl docid hash ID` gives it), or not at all ([security.md](security.md))"},
		"stack.log_retention_days":     {allowed: intList(logRetentionDays), meaning: "how long the functions' CloudWatch logs are kept"},
		"stack.poller_memory_mb":       {allowed: fmt.Sprintf("%d–%d", MinMemoryMB, MaxMemoryMB), meaning: "the poller function's memory in MB, which its share of CPU follows (1769 is one vCPU): more speeds up a large backfill, 128 halves what an idle job's poller costs ([scale.md](scale.md))"},
		"stack.writer_memory_mb":       {allowed: fmt.Sprintf("%d–%d", MinMemoryMB, MaxMemoryMB), meaning: "the writer function's memory in MB, which its share of CPU follows"},
		"stack.retain":                 {meaning: "keeps the table, the buckets, the secrets and the log groups when the stack is deleted (not when its first deploy fails)"},
		"stack.dashboards":             {meaning: "gives each job a CloudWatch dashboard `<prefix>-<job>-<region>`"},
		"stack.vpc.id":                 {allowed: "with `subnet_ids` and `security_group_ids`", meaning: "a VPC the functions run in, to reach a private database"},
		"stack.vpc.subnet_ids":         {allowed: "at least one, with `vpc.id`", meaning: "the subnets the functions run in"},
		"stack.vpc.security_group_ids": {allowed: "at least one, with `vpc.id`", meaning: "the security groups of the functions"},
		"stack.dlq.retention":          {def: "14 days (`336h`)", allowed: "whole seconds, 1m–336h", meaning: "how long every DLQ keeps a message, from when it was queued (in a standard DLQ, its time in the work queue counts); lower it only to see the archive at work"},
		"stack.dlq.archive_after":      {def: "`retention` less 2 days, or less half of it when shorter; less twice (`schedule` + 15m) when longer, for a job whose invocations do not overlap", allowed: fmt.Sprintf("1s to `retention` less %s, leaving twice the longest a job's DLQs go unswept: a quarter of what is left (5s–15m), plus the job's `schedule` when its invocations do not overlap (idle `sleep`, or `poller_timeout` under `schedule` + 15s)", MinArchiveMargin), meaning: "how long after it was queued a DLQ message is moved by the job's poller to `s3://<bucket>/dlq-archive/<prefix>/<job>/<output>/`, where it stays until `changesctl dlq redrive` or `purge`"},
		"stack.dlq.alarm_after":        {def: "1 day (`24h`)", allowed: "at least 1m", meaning: "how long a failed change may wait in a DLQ or its archive before the alarms `<prefix>-<job>-<output>-dlq-waiting` and `-dlq-archived` fire"},

		"jobs[].id":                                 {def: "required", allowed: "1–32 of `a`–`z`, `0`–`9` and `-`, starting with a letter or digit; unique", meaning: "names the job in its resources, metrics and commands"},
		"jobs[].source.type":                        {def: "required", allowed: oneOfCode(SourceCouchDB, SourceSyncGateway, SourceAppServices, SourceEdgeServer), meaning: "the kind of database followed"},
		"jobs[].source.url":                         {def: "required", allowed: "`http://` or `https://`, no credentials", meaning: "the database (CouchDB) or keyspace (Sync Gateway: `db` or `db.scope.collection`)"},
		"jobs[].source.auth":                        {meaning: "how the poller signs in to the source"},
		"jobs[].source.tls.ca_file":                 {allowed: "one of `ca_file`, `ca_pem`; an `https` source", meaning: "the path, where the poller runs, of a PEM bundle of certificate authorities trusted besides the system's"},
		"jobs[].source.tls.ca_pem":                  {allowed: "one of `ca_file`, `ca_pem`; an `https` source", meaning: "that PEM bundle itself (certificates are public)"},
		"jobs[].source.allow_cleartext_credentials": {meaning: "lets `source.auth` travel unencrypted to an `http://` URL whose host is not `localhost` or a loopback address, which is refused otherwise"},
		"jobs[].feed.limit":                         {allowed: "1–10000", meaning: "rows of one `_changes` request"},
		"jobs[].feed.timeout":                       {allowed: "more than 0, at most 5m", meaning: "the long-poll timeout sent to the source"},
		"jobs[].feed.fetch":                         {allowed: oneOfCode(FetchIncludeDocs, FetchBulkGet), meaning: "how bodies are read: in the feed, or by `_bulk_get` (one GET each on Edge Server)"},
		"jobs[].feed.active_only":                   {meaning: "skips deleted and removed documents: at the source on the Sync Gateway family, in the poller on CouchDB"},
		"jobs[].feed.channels":                      {allowed: "not empty, no comma; not for `couchdb`", meaning: "restricts the feed to these channels (Sync Gateway family)"},
		"jobs[].feed.max_answer_bytes":              {allowed: "1048576–134217728", meaning: "the most the poller reads of any one answer of the source"},
		"jobs[].feed.page_bytes":                    {def: "16777216 (16 MiB), at most `max_answer_bytes`", allowed: "65536 to `max_answer_bytes`", meaning: "budget of one page's bodies: the page ends at the row that reaches it, the next asks for fewer rows"},
		"jobs[].feed.quarantine_after":              {allowed: "1–100", meaning: "reads of a row that names no document (or a page that cannot be read) before it is recorded in the job's quarantine"},
		"jobs[].feed.mode":                          {allowed: "`longpoll`, `continuous`; `websocket` (`sync_gateway`, `app_services`); `sse` (`edge_server`); `eventsource` (`couchdb`)", meaning: "how the `_changes` feed is read: a request per page, or a stream after catching up"},
		"jobs[].feed.flood_threshold":               {allowed: "at least 1", meaning: "changes one poller invocation may read before it counts as a flood (metric `FloodBatches`)"},
		"jobs[].processing.ignore_delete":           {meaning: "deletions are not forwarded"},
		"jobs[].processing.ignore_remove":           {meaning: "removals are not forwarded: documents that left the user's channels or whose access was revoked"},
		"jobs[].lease.ttl":                          {allowed: "1s–10m", meaning: "how long the job's lease lasts without renewal; a failover takes about this long"},
		"jobs[].schedule":                           {allowed: "whole minutes, 1m–24h", meaning: "how often the poller is invoked"},
		"jobs[].latency_objective":                  {allowed: "at least 1s", meaning: "the age of a queued change that fires an alarm; with `idle: sleep`, how late a change made while idle may arrive"},
		"jobs[].idle":                               {allowed: oneOfCode(IdleWatch, IdleSleep), meaning: "while the feed has nothing new: read it all the time, a standby beside it, or end the invocation until the next tick"},
		"jobs[].send_concurrency":                   {allowed: fmt.Sprintf("1–%d", MaxSendConcurrency), meaning: "SQS requests (and claim-check puts) the poller keeps in flight, across the outputs"},
		"jobs[].send_depth":                         {allowed: fmt.Sprintf("1–%d", MaxSendDepth), meaning: "chunks a poller catching up keeps in flight; above 1, pages read ahead merge into chunks of up to 1,000 changes"},
		"jobs[].outputs":                            {def: "required", allowed: "at least one", meaning: "where the job's changes go"},
		"jobs[].attachments":                        {def: "off", meaning: "copies the documents' attachments to S3 and delivers references to them"},

		"jobs[].outputs[].id":                             {def: "required", allowed: "1–32 of `a`–`z`, `0`–`9` and `-`, starting with a letter or digit; unique in the job", meaning: "names the output's queues, alarms and metrics: `<prefix>-<job>-<output>`, which must differ from every other output's"},
		"jobs[].outputs[].type":                           {def: "required", allowed: oneOfCode(OutputPostgres, OutputHTTP, OutputS3), meaning: "the kind of output, whose settings block of the same name it takes"},
		"jobs[].outputs[].ordering":                       {def: "`per_document` for http, `none` otherwise", allowed: oneOfCode(OrderingPerDocument, OrderingTotal, OrderingNone), meaning: "a FIFO queue with a message group per document, a FIFO queue with one group, or a standard queue"},
		"jobs[].outputs[].on_failure":                     {allowed: "`dlq`; `halt` with ordering `per_document` or `total`", meaning: "a change that cannot be delivered goes to the DLQ, or stops its message group until an operator acts"},
		"jobs[].outputs[].max_receive_count":              {allowed: fmt.Sprintf("1–1000; at most %d with ordering `per_document` or `total`", MaxFIFOReceiveCount), meaning: "deliveries of a message before a failure of its own sends it to the DLQ (or, with `halt`, halts the output)"},
		"jobs[].outputs[].batch_size":                     {def: fmt.Sprintf("%d for postgres on a standard queue, %d otherwise", DefaultBatchSize, MaxFIFOBatchSize), allowed: fmt.Sprintf("1–%d on a FIFO queue, 1–%d on a standard one", MaxFIFOBatchSize, MaxBatchSize), meaning: "messages one writer invocation takes; a PostgreSQL batch is one transaction"},
		"jobs[].outputs[].max_concurrency":                {allowed: "2–1000", meaning: "concurrent writer invocations for this output"},
		"jobs[].outputs[].backpressure.threshold":         {allowed: "above 1, at most 100", meaning: "ratio of the rolling average request time to the baseline above which the writer slows down; it speeds up again under halfway between 1 and this"},
		"jobs[].outputs[].backpressure.baseline_requests": {allowed: "1–100000", meaning: "first successful requests of a writer instance that make the baseline"},
		"jobs[].outputs[].backpressure.window":            {allowed: "1–10000", meaning: "latest requests the rolling average covers"},
		"jobs[].outputs[].backpressure.min_increase":      {allowed: "more than 0, at most 1m", meaning: "how far above the baseline the average must also be for the output to count as slow"},
		"jobs[].outputs[].outage.retry":                   {allowed: "1s–15m", meaning: "first wait before an output that is down is tried again, doubled (with jitter) after each failed try"},
		"jobs[].outputs[].outage.max_retry":               {allowed: "`outage.retry` to 15m", meaning: "the longest such wait: a recovered output, or a corrected secret, is tried within it"},
		"jobs[].outputs[].outage.max_hold":                {def: "no bound", allowed: "more than 0", meaning: "how long after it was queued a change is held for an output that is down; an older one's failures count toward the DLQ"},
		"jobs[].outputs[].postgres":                       {allowed: "with `type: postgres` only", meaning: "writes documents to PostgreSQL"},
		"jobs[].outputs[].http":                           {allowed: "with `type: http` only", meaning: "sends documents to an HTTP endpoint"},
		"jobs[].outputs[].s3":                             {allowed: "with `type: s3` only", meaning: "writes one JSON object per document to S3"},

		"jobs[].outputs[].postgres.dsn":           {def: "required", allowed: "`sslmode` `verify-full`, `verify-ca`, `require` or `disable`", meaning: "the connection string (behind RDS Proxy, add `default_query_exec_mode=exec`); without `sslmode`, or with `prefer` or `allow`, the writer refuses it, since a connection could fall back to clear text"},
		"jobs[].outputs[].postgres.tls.ca_file":   {allowed: "one of `ca_file`, `ca_pem`", meaning: "the path, where the writer runs, of a PEM bundle of the certificate authorities that verify the server (`sslrootcert`), such as the RDS CA bundle"},
		"jobs[].outputs[].postgres.tls.ca_pem":    {allowed: "one of `ca_file`, `ca_pem`", meaning: "that PEM bundle itself (certificates are public)"},
		"jobs[].outputs[].postgres.table":         {def: "the output id, `-` as `_`", allowed: "a lowercase SQL identifier", meaning: "the table of documents in document mode; the mapping's default table names start with it"},
		"jobs[].outputs[].postgres.schema":        {allowed: "a lowercase SQL identifier", meaning: "the PostgreSQL schema"},
		"jobs[].outputs[].postgres.create_tables": {meaning: "creates missing tables when the writer starts"},
		"jobs[].outputs[].postgres.max_conns":     {allowed: "1–100", meaning: "connections per writer instance"},
		"jobs[].outputs[].postgres.mapping":       {def: "document mode", meaning: "maps documents to relational tables instead of one `jsonb` row each"},

		"jobs[].outputs[].postgres.mapping.tables":         {def: "required", allowed: "at least one; a parent before its children", meaning: "the mapped tables"},
		"jobs[].outputs[].postgres.mapping.filter.path":    {allowed: "a path", meaning: "with `filter.equals`, selects the documents to map; one that does not match is removed from the mapped tables"},
		"jobs[].outputs[].postgres.mapping.filter.equals":  {def: "required with `filter.path`", meaning: "the JSON value at `filter.path` of a mapped document"},
		"jobs[].outputs[].postgres.mapping.versions_table": {def: "`<table>_versions`", allowed: "a lowercase SQL identifier", meaning: "holds the version applied per document"},
		"jobs[].outputs[].postgres.mapping.quality_table":  {def: "`<table>_data_quality`", allowed: "a lowercase SQL identifier", meaning: "records every coerced or nulled value"},

		"jobs[].outputs[].postgres.mapping.tables[].name":         {def: "required", allowed: fmt.Sprintf("a lowercase SQL identifier of at most %d bytes; unique", maxMappedTable), meaning: "the table, which also gets a `doc_id` column"},
		"jobs[].outputs[].postgres.mapping.tables[].parent":       {allowed: "a table listed before this one", meaning: "makes this a child table: one row per element of the array at `from` in each parent row"},
		"jobs[].outputs[].postgres.mapping.tables[].from":         {def: "required with `parent`", allowed: "a path", meaning: "the array a child table maps"},
		"jobs[].outputs[].postgres.mapping.tables[].index_column": {def: "`" + DefaultIndexColumn + "` in a child table", allowed: "a lowercase SQL identifier; child tables only", meaning: "holds the element's position in its array, from 0"},
		"jobs[].outputs[].postgres.mapping.tables[].columns":      {def: "required", allowed: "at least one", meaning: "the columns filled from the document"},
		"jobs[].outputs[].postgres.mapping.tables[].primary_key":  {def: "`doc_id` in a root table; the parent's key and `index_column` in a child", allowed: "columns of this table", meaning: "the table's primary key"},

		"jobs[].outputs[].postgres.mapping.tables[].columns[].name":     {def: "required", allowed: "a lowercase SQL identifier, unique in the table, not `doc_id`", meaning: "the column"},
		"jobs[].outputs[].postgres.mapping.tables[].columns[].path":     {def: "required", allowed: "a path", meaning: "where the value is, in the document or the array element"},
		"jobs[].outputs[].postgres.mapping.tables[].columns[].type":     {def: "required", allowed: oneOfCode(columnTypes...), meaning: "the column's PostgreSQL type, which the value is coerced to"},
		"jobs[].outputs[].postgres.mapping.tables[].columns[].required": {meaning: "NOT NULL: a missing, null or uncoercible value fails the document"},
		"jobs[].outputs[].postgres.mapping.tables[].columns[].on_error": {def: "`null`; `reject` for a required or key column", allowed: oneOfCode(OnErrorNull, OnErrorReject), meaning: "a value that cannot be coerced is stored as NULL and recorded, or fails the document (to the DLQ)"},
		"jobs[].outputs[].postgres.mapping.tables[].columns[].epoch":    {def: "guessed from the magnitude, and recorded", allowed: oneOfCode(EpochSeconds, EpochMillis) + "; `timestamptz` only", meaning: "the unit of numbers in a `timestamptz` column"},

		"jobs[].outputs[].http.url":                         {def: "required", allowed: "`http://` or `https://`, no credentials; `{doc_id}` and `{secret}` in the path or query only", meaning: "the URL template: `{doc_id}` becomes the path-escaped id, `{secret}` the value of `url_secret`"},
		"jobs[].outputs[].http.url_secret":                  {allowed: "exactly when `url` holds `{secret}`", meaning: "the credential in the URL (a webhook token)"},
		"jobs[].outputs[].http.method":                      {allowed: "`PUT`, `POST`, `PATCH`", meaning: "the method of writes; deletions are sent as `DELETE`"},
		"jobs[].outputs[].http.headers":                     {allowed: "a name that looks like a credential (`auth`, `key`, `token`, …) only by reference; no `Authorization`", meaning: "headers sent with every request"},
		"jobs[].outputs[].http.auth":                        {allowed: "type `basic` or `bearer`", meaning: "how requests authenticate"},
		"jobs[].outputs[].http.timeout":                     {allowed: "more than 0, at most 5m", meaning: "the time one request may take"},
		"jobs[].outputs[].http.follow_redirects":            {meaning: "follows 307 and 308 to the same scheme, host and port; any other redirect sends the change to the DLQ"},
		"jobs[].outputs[].http.allow_cleartext_credentials": {meaning: "lets `auth`, `url_secret` and the headers given by reference travel unencrypted to an `http://` URL whose host is not `localhost` or a loopback address, which is refused otherwise"},

		"jobs[].outputs[].s3.bucket":       {def: "`stack.bucket`", meaning: "the bucket written"},
		"jobs[].outputs[].s3.prefix":       {def: "`<job>/<output>/`", allowed: "ends with `/`; no leading `/`, no `..`, no `.` segment, no `*`, `?` or `$`; neither starts nor is started by another S3 output's prefix, `claim-check/` or a job's attachments prefix in the same bucket", meaning: "starts every key; no key can leave it"},
		"jobs[].outputs[].s3.key_template": {allowed: "holds `{doc_id}`; no leading `/`, no `..`, no `.` segment", meaning: "the key below the prefix; `{doc_id}` is the escaped document id"},

		"jobs[].attachments.enabled":              {meaning: "turns the copy on"},
		"jobs[].attachments.bucket":               {def: "`stack.bucket`", meaning: "where the attachments go"},
		"jobs[].attachments.prefix":               {def: "`attachments/<stack.prefix>/<job>/`", allowed: "ends with `/`; no leading `/`, no `*`, `?` or `$`; neither starts nor is started by `claim-check/` or an S3 output's prefix in the same bucket", meaning: "starts every key"},
		"jobs[].attachments.key_template":         {allowed: "holds `{digest}`; may add `{doc_id}`, `{name}`", meaning: "the key after the prefix; `{digest}` is the attachment's digest, so a key never holds two contents"},
		"jobs[].attachments.max_bytes":            {allowed: "positive", meaning: "largest attachment copied; a larger one is delivered marked `\"s3_skipped\": \"too_large\"`"},
		"jobs[].attachments.on_missing":           {allowed: oneOfCode(OnMissingFail, OnMissingSkip), meaning: "when the source answers 404 for an attachment: the poller stops before the document, or delivers it marked `\"s3_skipped\": \"missing\"`"},
		"jobs[].attachments.stall_timeout":        {allowed: "1s–5m", meaning: "a transfer (the source's body, its upload to S3) that makes no progress for this long fails"},
		"jobs[].attachments.min_bytes_per_second": {allowed: "at least 1024", meaning: "the slowest average rate a transfer may keep: it has `stall_timeout` plus its size (`length`, else `max_bytes`) divided by this to finish, and never more than the invocation has left"},
		"jobs[].attachments.attempts":             {allowed: "1–100", meaning: "failed transfers of one attachment (stalled, too slow, cut off, an error answer from the source), counted at most once per `stall_timeout`, before its document is delivered marked `\"s3_skipped\": \"failed\"` and recorded in the quarantine"},

		"auth.type":     {def: "required", allowed: "`basic`, `bearer`; `session` for a `sync_gateway` or `app_services` source", meaning: "how to sign in; `session` posts to `{db}/_session` and sends the cookie instead of the password"},
		"auth.username": {allowed: "required for `basic` and `session`", meaning: "the user"},
		"auth.password": {allowed: "required for `basic` and `session`", meaning: "the user's password"},
		"auth.token":    {allowed: "required for `bearer`", meaning: "the bearer token"},

		"secret reference.env":      {allowed: "one of `env`, `secret`", meaning: "an environment variable holding the value; deployed, the Secrets Manager secret `<prefix>/NAME` the stack creates"},
		"secret reference.secret":   {allowed: "a secret's name, or its Secrets Manager ARN (complete or partial)", meaning: "a Secrets Manager secret holding the value"},
		"secret reference.json_key": {allowed: "with `secret` only", meaning: "the key of a JSON secret's value that holds the value"},
	}
}

// oneOfCode lists values as code: "`a`, `b`, `c`".
func oneOfCode(values ...string) string {
	return "`" + strings.Join(values, "`, `") + "`"
}

// intList lists numbers: "1, 3, 5".
func intList(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
