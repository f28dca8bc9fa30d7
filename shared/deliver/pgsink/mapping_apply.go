package pgsink

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// mappedChange is a checked and mapped change awaiting the database.
type mappedChange struct {
	c   *change.Envelope
	doc *mappedDoc
}

// applyMapped is Apply in mapping mode. Each change is first mapped in
// memory; a document that cannot be mapped (invalid body, a value that cannot
// be coerced into a reject column, ...) fails permanently on its own, before
// the database is involved.
//
// The remaining changes go in one batch (one round trip, one transaction):
// lock the documents, then record the newer versions and replace those
// documents' rows. Of
// several changes of one document in a call only the newest goes in the
// batch: the older ones are not newer than what the output holds once it is
// committed. If the batch fails on a statement error, every change is
// applied again in a transaction of its own, in version order, so a bad
// document fails alone and its neighbours are applied.
func (s *Sink) applyMapped(ctx context.Context, changes []*change.Envelope) []error {
	errs := make([]error, len(changes))
	var todo []pending[*mappedChange]
	for i, c := range changes {
		if err := deliver.CheckChange(c); err != nil {
			errs[i] = err
			continue
		}
		doc, err := s.mapping.mapDoc(c)
		if err != nil {
			errs[i] = err
			continue
		}
		todo = append(todo, pending[*mappedChange]{i: i, c: c, item: &mappedChange{c: c, doc: doc}})
	}
	return applyNewest(ctx, s, errs, todo, s.writeMapped)
}

// writeMapped applies changes of distinct documents as one batch: a single
// transaction.
func (s *Sink) writeMapped(ctx context.Context, db batcher, changes []*mappedChange) error {
	m := s.mapping
	vc := newVersionColumns(len(changes))
	filtered := make([]bool, len(changes))
	records := 0
	for i, mc := range changes {
		vc.set(i, mc.c)
		filtered[i] = mc.doc.filtered
		records += len(mc.doc.records)
	}
	args := make([]any, 0, 17+len(m.tables)*8)
	args = append(args, vc.ids, vc.gens, vc.counters, vc.revs, vc.deleted, filtered, vc.seqs)
	write := m.writeSQL
	if records > 0 {
		write = m.writeQualitySQL
		args = append(args, s.qualityArgs(changes, records)...)
	}
	for ti, t := range m.tables {
		args = append(args, tableArgs(changes, ti, len(t.cols))...)
	}

	b := &pgx.Batch{}
	b.Queue(s.lockSQL, vc.ids, m.lockSeed)
	b.Queue(write, args...)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("apply changes to %s: %w", m.versions, err)
	}
	return nil
}

// qualityArgs returns the parameters $8-$17 of writeQualitySQL: the output
// id and the changes' data-quality records, records in all.
func (s *Sink) qualityArgs(changes []*mappedChange, records int) []any {
	strs := func() textArray { return make(textArray, 0, records) }
	docs, revs, cols, paths, originals, stored, reasons := strs(), strs(), strs(), strs(), strs(), strs(), strs()
	gens, counters := make([]int64, 0, records), make([]int64, 0, records)
	for _, mc := range changes {
		c := mc.c
		for _, r := range mc.doc.records {
			docs, revs = append(docs, text(c.DocID)), append(revs, text(c.Rev))
			gens, counters = append(gens, c.Generation), append(counters, c.Counter)
			cols, paths = append(cols, text(r.column)), append(paths, text(r.path))
			originals, stored, reasons = append(originals, text(r.original)), append(stored, r.stored), append(reasons, text(r.reason))
		}
	}
	return []any{s.output, docs, revs, gens, counters, cols, paths, originals, stored, reasons}
}

// tableArgs returns the parameters of table ti: the doc id of each of its
// rows, then one array per stored column (of ncols).
func tableArgs(changes []*mappedChange, ti, ncols int) []any {
	rows := 0
	for _, mc := range changes {
		if mc.doc.rows != nil {
			rows += len(mc.doc.rows[ti])
		}
	}
	docs := make(textArray, 0, rows)
	// The columns share one allocation.
	vals := make(textArray, rows*ncols)
	cols := make([]textArray, ncols)
	for j := range cols {
		cols[j], vals = vals[:0:rows], vals[rows:]
	}
	for _, mc := range changes {
		if mc.doc.rows == nil {
			continue // a tombstone or a filtered document
		}
		for _, r := range mc.doc.rows[ti] {
			docs = append(docs, text(mc.c.DocID))
			for j, v := range r.vals {
				cols[j] = append(cols[j], v)
			}
		}
	}
	args := make([]any, 0, 1+ncols)
	args = append(args, docs)
	for _, col := range cols {
		args = append(args, col)
	}
	return args
}
