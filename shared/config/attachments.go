package config

import (
	"fmt"
	"strings"
	"time"
)

// Attachment policies for an attachment the source no longer serves.
const (
	OnMissingFail = "fail"
	OnMissingSkip = "skip"
)

// DefaultAttachmentMaxBytes is the largest attachment copied unless the job
// says otherwise: 100 MiB.
const DefaultAttachmentMaxBytes = 100 << 20

// Defaults of the attachment transfers: how long one may go without
// progress, the slowest average rate it may keep, and how many failed
// transfers of one attachment are made before it is given up.
const (
	DefaultAttachmentStallTimeout = 30 * time.Second
	DefaultAttachmentMinRate      = 256 << 10
	DefaultAttachmentAttempts     = 5
)

// Attachments copies every attachment of a delivered revision to S3 and
// replaces it in the document with a reference (s3_bucket, s3_key).
type Attachments struct {
	Enabled bool `json:"enabled"`
	// Bucket receives the attachments. Default: the stack bucket.
	Bucket string `json:"bucket,omitempty"`
	// Prefix starts every key; it ends with '/'. Default
	// "attachments/<stack prefix>/<job>/".
	Prefix string `json:"prefix,omitempty"`
	// KeyTemplate is the key after the prefix. Placeholders: {digest} (the
	// attachment's digest as "<algorithm>-<hex>", required, so that a key
	// never holds two different contents), {doc_id} and {name} (both
	// path-escaped). Default "{digest}".
	KeyTemplate string `json:"key_template,omitempty"`
	// MaxBytes is the largest attachment copied; a larger one is delivered
	// without a reference and marked "s3_skipped": "too_large".
	// Default 100 MiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// OnMissing is what happens when the source answers 404 for an
	// attachment of the revision: "fail" (default; the poller stops before
	// the document, the checkpoint stays) or "skip" (the entry is delivered
	// marked "s3_skipped": "missing").
	OnMissing string `json:"on_missing,omitempty"`
	// StallTimeout ends a transfer (the source's body and its upload to
	// S3) that makes no progress for this long. Default 30s.
	StallTimeout Duration `json:"stall_timeout,omitempty"`
	// MinBytesPerSecond is the slowest average rate a transfer may keep:
	// it has StallTimeout plus its size (the entry's length, else
	// MaxBytes) divided by this rate to finish. Default 262144 (256 KiB/s).
	MinBytesPerSecond int64 `json:"min_bytes_per_second,omitempty"`
	// Attempts is how many transfers of one attachment may fail (stalled,
	// too slow, cut off, an error answer from the source) before the
	// document is delivered without its copy, marked "s3_skipped":
	// "failed" and recorded in the job's quarantine. Default 3.
	Attempts int `json:"attempts,omitempty"`
}

func (a *Attachments) defaults(stackBucket, stackPrefix, job string) {
	if a.Bucket == "" {
		a.Bucket = stackBucket
	}
	if a.Prefix == "" {
		a.Prefix = "attachments/" + stackPrefix + "/" + job + "/"
	}
	if a.KeyTemplate == "" {
		a.KeyTemplate = "{digest}"
	}
	if a.MaxBytes == 0 {
		a.MaxBytes = DefaultAttachmentMaxBytes
	}
	if a.OnMissing == "" {
		a.OnMissing = OnMissingFail
	}
	if a.StallTimeout == 0 {
		a.StallTimeout = Duration(DefaultAttachmentStallTimeout)
	}
	if a.MinBytesPerSecond == 0 {
		a.MinBytesPerSecond = DefaultAttachmentMinRate
	}
	if a.Attempts == 0 {
		a.Attempts = DefaultAttachmentAttempts
	}
}

func (a *Attachments) validate(p string) []error {
	if !a.Enabled {
		return nil
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", p, field, fmt.Sprintf(format, args...)))
	}
	if a.Bucket == "" {
		bad("bucket", "is required when the stack has no bucket")
	}
	if strings.HasPrefix(a.Prefix, "/") {
		bad("prefix", "%q must not start with '/'", a.Prefix)
	}
	if err := grantablePrefix(a.Prefix); err != nil {
		bad("prefix", "%q %v", a.Prefix, err)
	}
	if !strings.Contains(a.KeyTemplate, "{digest}") {
		bad("key_template", "%q must contain {digest}", a.KeyTemplate)
	}
	rest := a.KeyTemplate
	for _, ph := range []string{"{digest}", "{doc_id}", "{name}"} {
		rest = strings.ReplaceAll(rest, ph, "")
	}
	if strings.ContainsAny(rest, "{}") {
		bad("key_template", "%q has a placeholder other than {digest}, {doc_id}, {name}", a.KeyTemplate)
	}
	if a.MaxBytes < 0 {
		bad("max_bytes", "%d must be positive", a.MaxBytes)
	}
	if t := a.StallTimeout; t == zeroGiven {
		bad("stall_timeout", zeroRefused, DefaultAttachmentStallTimeout)
	} else if t.D() < time.Second || t.D() > 5*time.Minute {
		bad("stall_timeout", "%s must be between 1s and 5m", t.D())
	}
	if a.MinBytesPerSecond < 1024 {
		bad("min_bytes_per_second", "%d must be at least 1024", a.MinBytesPerSecond)
	}
	if a.Attempts < 1 || a.Attempts > 100 {
		bad("attempts", "%d must be between 1 and 100", a.Attempts)
	}
	switch a.OnMissing {
	case OnMissingFail, OnMissingSkip:
	default:
		bad("on_missing", "%q is not one of fail, skip", a.OnMissing)
	}
	return errs
}
