package config

import (
	"strings"
	"time"
)

// Defaults of the settings a file leaves out.
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
	DefaultWriterTimeout    = 30 * time.Second
	DefaultLogRetentionDays = 30
	DefaultPollerMemoryMB   = 256
	DefaultWriterMemoryMB   = 512
	DefaultHTTPTimeout      = 10 * time.Second
	DefaultFloodThreshold   = 10000
	DefaultIdle             = IdleWatch
	// The defaults of an output's backpressure settings, which package
	// backpressure uses too. DefaultBackpressureMinIncrease keeps jitter
	// from counting as slow: an output with a 1 ms baseline that answers in
	// 2 to 3 ms is past the threshold of 2 but not struggling, and a rise
	// smaller than one SQS call (10-20 ms) is not worth fewer requests at
	// once.
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
	// changes; batches of 100 write two to three times the documents per
	// second of batches of 10 (make bench, pg-mapping).
	DefaultBatchSize = 100
	// DefaultSendConcurrency is how many SendMessageBatch requests the
	// poller keeps in flight, across outputs and chunks. A page of 500
	// changes is 50 requests per output, 150 to three outputs: at 15-20 ms a
	// request (in a region), 128 in flight queue the three outputs' requests
	// in two round trips where 64 take three.
	DefaultSendConcurrency = 128
	// DefaultSendDepth keeps one chunk in flight, so a failover replays at
	// most one batch.
	DefaultSendDepth = 1
	// DefaultMaxConcurrency is an output's concurrent writer invocations,
	// Lambda's minimum for an SQS event source.
	DefaultMaxConcurrency = 2
	// DefaultMaxConns is a PostgreSQL output's pool per writer instance.
	DefaultMaxConns = 4
)

// PollerStandbyAllowance is what a poller invocation's default timeout adds
// to two schedule periods: 10 s for the invocation to start after its tick
// (EventBridge delivers a tick within its minute, and the function may start
// cold) and the 5 s it keeps before its deadline to release the lease. See
// DefaultPollerTimeout.
const PollerStandbyAllowance = 15 * time.Second

// MaxPollerTimeout is the longest timeout Lambda allows a function.
const MaxPollerTimeout = 15 * time.Minute

// DefaultPollerTimeout is the poller timeout of a job with the given schedule
// when stack.poller_timeout is not set: two schedule periods plus
// PollerStandbyAllowance, at most MaxPollerTimeout. Every tick starts an
// invocation that stands by until the lease is free, and reads until its
// timeout; lasting two periods, it is still there when the tick after next
// starts the one that will follow it, so at every moment one invocation
// holds the lease and another stands by to take it over within the lease
// TTL of a crash. With a schedule over 7 minutes, Lambda's 15 minutes leave
// part of each period without a standby (File.StandbyGap).
func DefaultPollerTimeout(schedule time.Duration) time.Duration {
	return min(2*schedule+PollerStandbyAllowance, MaxPollerTimeout)
}

// PollerTimeout is the timeout of job j's poller function, the time budget
// of each of its invocations: stack.poller_timeout when set, else
// DefaultPollerTimeout of the job's schedule. The file must have its
// defaults set.
func (f *File) PollerTimeout(j *Job) time.Duration {
	if t := f.Stack.PollerTimeout.D(); t > 0 {
		return t
	}
	return DefaultPollerTimeout(j.Schedule.D())
}

// StandbyGap is how much of each schedule period job j's poller may spend
// without an invocation standing by beside the one holding the lease (so
// that a crash waits for the next tick): zero when its timeout is at least
// DefaultPollerTimeout of its schedule; the whole period when the
// invocations do not overlap.
func (f *File) StandbyGap(j *Job) time.Duration {
	s := j.Schedule.D()
	return min(max(2*s+PollerStandbyAllowance-f.PollerTimeout(j), 0), s)
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
	if f.Stack.WriterTimeout == 0 {
		f.Stack.WriterTimeout = Duration(DefaultWriterTimeout)
	}
	if f.Stack.LogRetentionDays == 0 {
		f.Stack.LogRetentionDays = DefaultLogRetentionDays
	}
	if f.Stack.PollerMemoryMB == 0 {
		f.Stack.PollerMemoryMB = DefaultPollerMemoryMB
	}
	if f.Stack.WriterMemoryMB == 0 {
		f.Stack.WriterMemoryMB = DefaultWriterMemoryMB
	}
	if f.Stack.Retain == nil {
		t := true
		f.Stack.Retain = &t
	}
	if f.Stack.Dashboards == nil {
		t := true
		f.Stack.Dashboards = &t
	}
	if f.Stack.DocIDs == "" {
		f.Stack.DocIDs = DocIDsPlain
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
			a.defaults(f.Stack.Bucket, f.Stack.Prefix, j.ID)
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
				o.MaxConcurrency = DefaultMaxConcurrency
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
					o.Postgres.MaxConns = DefaultMaxConns
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
				if o.S3.Prefix == "" {
					o.S3.Prefix = j.ID + "/" + o.ID + "/"
				}
				if o.S3.KeyTemplate == "" {
					o.S3.KeyTemplate = "{doc_id}.json"
				}
			}
		}
	}
	f.setDLQDefaults()
}
