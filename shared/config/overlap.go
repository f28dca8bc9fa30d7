package config

import (
	"fmt"
	"strings"
)

// objectArea is a part of a bucket that one owner writes: an S3 output,
// a job's attachments, the claim checks, the DLQ archive.
type objectArea struct {
	owner          string // as an error names it
	bucket, prefix string
}

// checkObjectAreas refuses two S3 outputs, or an S3 output and a job's
// attachments, the claim checks or the DLQ archive, whose keys may meet:
// same bucket, one prefix starting the other. An output would read,
// overwrite or delete the other's objects (its writer is granted <prefix>*,
// verify scans the prefix and repairs what it finds there), what lies under
// claim-check/ expires, and what lies under dlq-archive/ is redriven. Jobs' attachments may share a prefix: their keys hold the
// content's digest, so one key never holds two contents. Each problem
// names both owners.
func (f *File) checkObjectAreas() []error {
	claims := objectArea{owner: "the claim checks (stack.bucket)", bucket: f.Stack.Bucket, prefix: ClaimCheckPrefix}
	archive := objectArea{owner: "the DLQ archive (stack.bucket)", bucket: f.Stack.Bucket, prefix: ArchivePrefix}
	var outputs, attachments []objectArea
	for _, j := range f.Jobs {
		if j == nil {
			continue
		}
		if a := j.Attachments; a != nil && a.Enabled {
			attachments = append(attachments, objectArea{owner: fmt.Sprintf("jobs[%s].attachments", j.ID), bucket: a.Bucket, prefix: a.Prefix})
		}
		for _, o := range j.Outputs {
			if o != nil && o.Type == OutputS3 && o.S3 != nil {
				outputs = append(outputs, objectArea{owner: fmt.Sprintf("jobs[%s].outputs[%s].s3", j.ID, o.ID), bucket: o.S3.Bucket, prefix: o.S3.Prefix})
			}
		}
	}
	var errs []error
	overlap := func(a, b objectArea) {
		if a.bucket == b.bucket && (strings.HasPrefix(a.prefix, b.prefix) || strings.HasPrefix(b.prefix, a.prefix)) {
			errs = append(errs, fmt.Errorf("%s: s3://%s/%s overlaps s3://%s/%s, where %s writes: give each a prefix that does not start the other", a.owner, a.bucket, a.prefix, b.bucket, b.prefix, b.owner))
		}
	}
	for i, a := range outputs {
		for _, b := range outputs[:i] {
			overlap(a, b)
		}
		for _, b := range attachments {
			overlap(a, b)
		}
		overlap(a, claims)
		overlap(a, archive)
	}
	for _, a := range attachments {
		overlap(a, claims)
		overlap(a, archive)
	}
	return errs
}

// Suffixes of the tables a PostgreSQL output names after its table setting
// (pgsink names them so): its versions table and, in mapping mode, its
// data-quality table.
const (
	versionsSuffix = "_versions"
	qualitySuffix  = "_data_quality"
)

// tables returns the tables the output writes, in its schema.
func (pg *PostgresOutput) tables() []string {
	m := pg.Mapping
	if m == nil {
		return []string{pg.Table, pg.Table + versionsSuffix}
	}
	var names []string
	for _, t := range m.Tables {
		if t != nil {
			names = append(names, t.Name)
		}
	}
	versions, quality := m.VersionsTable, m.QualityTable
	if versions == "" {
		versions = pg.Table + versionsSuffix
	}
	if quality == "" {
		quality = pg.Table + qualitySuffix
	}
	return append(names, versions, quality)
}

// checkPostgresTables refuses two PostgreSQL outputs that write one table
// of one database: each would replace, delete and verify the other's rows
// as its own. The database is the dsn as the configuration holds it (the
// same reference); two references to one database cannot be told apart
// here. Each problem names both outputs.
func (f *File) checkPostgresTables() []error {
	type table struct {
		dsn           SecretRef
		schema, table string
	}
	owners := map[table]string{}
	var errs []error
	for _, j := range f.Jobs {
		if j == nil {
			continue
		}
		for _, o := range j.Outputs {
			if o == nil || o.Type != OutputPostgres || o.Postgres == nil {
				continue
			}
			label := fmt.Sprintf("jobs[%s].outputs[%s].postgres", j.ID, o.ID)
			reported := map[string]bool{}
			for _, name := range o.Postgres.tables() {
				k := table{dsn: o.Postgres.DSN, schema: o.Postgres.Schema, table: name}
				other, taken := owners[k]
				switch {
				case !taken:
					owners[k] = label
				case other != label && !reported[other]:
					reported[other] = true
					errs = append(errs, fmt.Errorf("%s: writes table %s.%s on the same dsn as %s: give one of them another table or schema", label, k.schema, k.table, other))
				}
			}
		}
	}
	return errs
}
