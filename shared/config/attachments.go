package config

import (
	"fmt"
	"strings"
)

// Attachment policies for an attachment the source no longer serves.
const (
	OnMissingFail = "fail"
	OnMissingSkip = "skip"
)

// DefaultAttachmentMaxBytes is the largest attachment copied unless the job
// says otherwise: 100 MiB.
const DefaultAttachmentMaxBytes = 100 << 20

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
	switch a.OnMissing {
	case OnMissingFail, OnMissingSkip:
	default:
		bad("on_missing", "%q is not one of fail, skip", a.OnMissing)
	}
	return errs
}
