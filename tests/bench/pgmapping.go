package main

// pg-mapping: writer documents/s of PostgreSQL mapping mode for a
// three-table mapping (orders, order_items from an array, order_totals from
// a nested object), next to a raw pgx batch writing the same rows with the
// same statements minus what mapping mode adds (versions lock and guard,
// coercion, data-quality records, JSON decoding). Both run side by side in
// alternating rounds: batches of 10 changes, as SQS hands them to the writer,
// from four concurrent workers (Lambda instances) on a pool of four
// connections. Each side's CPU time is measured too: this process's (the
// client: mapping, encoding, pgx) and that of the pool's four PostgreSQL
// backends (read from /proc, so only when PostgreSQL runs on this machine),
// per document. The rate depends on the machine's load; the CPU a document
// costs much less, and on two cores the ratio of the two sides' CPU is
// about the ratio of their rates.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver/pgsink"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

func init() {
	register("pg-mapping", pgMapping)
}

const (
	pgmRounds  = 9    // single rounds vary by ±30 % on a shared machine: medians of many
	pgmDocs    = 3000 // documents per round and side
	pgmBatch   = 10
	pgmWorkers = 4
)

// pgmMapping is the benchmark's mapping (the one of pgsink's golden test).
const pgmMapping = `{
  "filter": {"path": "type", "equals": "order"},
  "tables": [
    {"name": "orders", "primary_key": ["order_no"], "columns": [
      {"name": "order_no", "path": "order_no", "type": "bigint"},
      {"name": "status", "path": "status", "type": "text"},
      {"name": "customer_id", "path": "customer.id", "type": "uuid", "on_error": "reject"},
      {"name": "customer_name", "path": "customer.name", "type": "text"},
      {"name": "placed_at", "path": "placed_at", "type": "timestamptz"},
      {"name": "paid", "path": "paid", "type": "boolean"},
      {"name": "tags", "path": "tags", "type": "jsonb"}]},
    {"name": "order_items", "parent": "orders", "from": "items", "index_column": "line", "columns": [
      {"name": "sku", "path": "sku", "type": "text", "required": true},
      {"name": "qty", "path": "qty", "type": "integer", "on_error": "reject"},
      {"name": "unit_price", "path": "price", "type": "numeric"},
      {"name": "currency", "path": "$.totals.currency", "type": "text"}]},
    {"name": "order_totals", "columns": [
      {"name": "subtotal", "path": "totals.subtotal", "type": "numeric"},
      {"name": "tax", "path": "totals.tax", "type": "numeric"},
      {"name": "total", "path": "totals.total", "type": "numeric", "required": true},
      {"name": "currency", "path": "totals.currency", "type": "text"}]}
  ]
}`

// pgmDoc is one generated order: the change the sink applies and the rows
// (as text, in the tables' column order after doc_id) the raw batch writes.
type pgmDoc struct {
	change *change.Envelope
	order  []*string
	items  [][]*string
	totals []*string
}

func pgMapping(ctx context.Context, r *results) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(pgmMapping)))
	dec.DisallowUnknownFields()
	var m config.Mapping
	if err := dec.Decode(&m); err != nil {
		return fmt.Errorf("decode mapping: %w", err)
	}
	pool, err := coreOpenPool(ctx, pgmWorkers)
	if err != nil {
		return err
	}
	defer pool.Close()

	sinkSchema := strings.ReplaceAll(testenv.UniqueName("bench-pgmapping"), "-", "_")
	rawSchema := sinkSchema + "_raw"
	for _, s := range []string{sinkSchema, rawSchema} {
		if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{s}.Sanitize()); err != nil {
			return fmt.Errorf("create schema (start the local services with `make up`): %w", err)
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = pool.Exec(dctx, `DROP SCHEMA `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		}()
	}
	out := config.PostgresOutput{Schema: sinkSchema, Table: "bench", Mapping: &m}
	sink, err := pgsink.New(pool, out, "pg-mapping")
	if err != nil {
		return err
	}
	// The raw sides write to identical tables of their own.
	rawOut := out
	rawOut.Schema = rawSchema
	rawTables, err := pgsink.New(pool, rawOut, "pg-mapping")
	if err != nil {
		return err
	}
	for _, s := range []*pgsink.Sink{sink, rawTables} {
		if err := s.CreateTables(ctx); err != nil {
			return err
		}
	}
	raw := newPGMRaw(rawSchema)

	sides := []struct {
		name  string
		apply func(context.Context, []*pgmDoc) error
	}{
		{"mapping", func(ctx context.Context, batch []*pgmDoc) error {
			changes := make([]*change.Envelope, len(batch))
			for i, doc := range batch {
				changes[i] = doc.change
			}
			for i, err := range sink.Apply(ctx, changes) {
				if err != nil {
					return fmt.Errorf("apply %s: %w", changes[i].DocID, err)
				}
			}
			return nil
		}},
		{"raw", func(ctx context.Context, batch []*pgmDoc) error { return raw.write(ctx, pool, batch) }},
		{"raw+decode", func(ctx context.Context, batch []*pgmDoc) error {
			decoded := make([]*pgmDoc, len(batch))
			for i, doc := range batch {
				d, err := pgmDecode(doc.change)
				if err != nil {
					return err
				}
				decoded[i] = d
			}
			return raw.write(ctx, pool, decoded)
		}},
	}
	gen := mrand.New(mrand.NewPCG(5, 5))
	rates := make([][]float64, len(sides))
	// clientCPU[i] and serverCPU[i] are side i's CPU µs per document, by round.
	clientCPU := make([][]float64, len(sides))
	serverCPU := make([][]float64, len(sides))
	serverRead := true
	// Round 0 warms up: it fills the tables, then ANALYZE gives the planner
	// their statistics, as autovacuum soon does for a live output. Without
	// them, plans cached while the tables were empty keep scanning them
	// whole as they grow, and every round is slower than the one before.
	for round := range pgmRounds + 1 {
		if round == 1 {
			if err := pgmAnalyze(ctx, pool, out, rawOut); err != nil {
				return err
			}
		}
		// Each round starts with another side.
		for k := range sides {
			i := (round + k) % len(sides)
			docs := pgmGenerate(gen, round*len(sides)+i)
			backends, err := pgmBackends(ctx, pool)
			if err != nil {
				return err
			}
			// The generator's garbage is collected now, not on the side's time.
			runtime.GC()
			server0, ok := pgmBackendCPU(backends)
			client0 := coreCPUTime()
			d, err := pgmRun(ctx, docs, sides[i].apply)
			if err != nil {
				return fmt.Errorf("round %d %s: %w", round, sides[i].name, err)
			}
			client := coreCPUTime() - client0
			server1, ok1 := pgmBackendCPU(backends)
			serverRead = serverRead && ok && ok1
			if round > 0 {
				perDoc := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(len(docs)) }
				rates[i] = append(rates[i], float64(len(docs))/d.Seconds())
				clientCPU[i] = append(clientCPU[i], perDoc(client))
				serverCPU[i] = append(serverCPU[i], perDoc(server1-server0))
			}
		}
	}
	r.add("mapping rounds docs/s", pgmJoin(rates[0]), "")
	r.add("raw batch rounds docs/s", pgmJoin(rates[1]), "")
	r.add("raw batch + json decode rounds docs/s", pgmJoin(rates[2]), "")
	mm, rm, dm := median(rates[0]), median(rates[1]), median(rates[2])
	r.add("mapping docs/s (median)", mm, fmt.Sprintf("%d rounds of %d documents after a warm-up, batches of %d, %d workers", pgmRounds, pgmDocs, pgmBatch, pgmWorkers))
	r.add("raw batch docs/s (median)", rm, "the same rows and statements, values ready: no JSON, versions, coercion or records")
	r.add("raw batch + json decode docs/s (median)", dm, "as raw, values read from the documents with encoding/json")
	r.add("mapping / raw", mm/rm, "goal >= 0.8")
	r.add("mapping / (raw + json decode)", mm/dm, "")
	for i, side := range sides {
		r.add(side.name+" client CPU µs per doc", median(slices.Clone(clientCPU[i])), "this process: "+coreJoin(clientCPU[i], "%.1f"))
		if serverRead {
			r.add(side.name+" server CPU µs per doc", median(slices.Clone(serverCPU[i])), "the pool's PostgreSQL backends: "+coreJoin(serverCPU[i], "%.1f"))
		}
	}
	if serverRead {
		cpu := func(i int) float64 { return median(slices.Clone(clientCPU[i])) + median(slices.Clone(serverCPU[i])) }
		r.add("raw CPU / mapping CPU", cpu(1)/cpu(0), "client and server CPU per document, medians: what the rates' ratio comes to when CPU sets the pace")
	}
	return nil
}

// pgmBackends returns the process ids of the PostgreSQL backends of every
// connection pool can hold, opening them as needed.
func pgmBackends(ctx context.Context, pool *pgxpool.Pool) ([]uint32, error) {
	var pids []uint32
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("acquire connection: %w", err)
		}
		defer c.Release()
		pids = append(pids, c.Conn().PgConn().PID())
	}
	return pids, nil
}

// pgmBackendCPU returns the CPU time the backends pids have spent, from
// /proc/<pid>/schedstat; false when one cannot be read (PostgreSQL runs
// elsewhere).
func pgmBackendCPU(pids []uint32) (time.Duration, bool) {
	var sum time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
}

// pgmAnalyze updates the planner statistics of the outputs' tables.
func pgmAnalyze(ctx context.Context, pool *pgxpool.Pool, outs ...config.PostgresOutput) error {
	for _, out := range outs {
		_, versions, err := pgsink.Tables(out, "pg-mapping")
		if err != nil {
			return err
		}
		tables := []pgx.Identifier{versions, {out.Schema, out.Table + "_data_quality"}}
		for _, t := range out.Mapping.Tables {
			tables = append(tables, pgx.Identifier{out.Schema, t.Name})
		}
		for _, t := range tables {
			if _, err := pool.Exec(ctx, `ANALYZE `+t.Sanitize()); err != nil {
				return fmt.Errorf("analyze: %w", err)
			}
		}
	}
	return nil
}

// pgmRun applies docs in batches of pgmBatch from pgmWorkers workers and
// returns the time it took.
func pgmRun(ctx context.Context, docs []*pgmDoc, apply func(context.Context, []*pgmDoc) error) (time.Duration, error) {
	work := make(chan []*pgmDoc)
	errs := make(chan error, pgmWorkers)
	var wg sync.WaitGroup
	start := time.Now()
	for range pgmWorkers {
		wg.Go(func() {
			for batch := range work {
				if err := apply(ctx, batch); err != nil {
					errs <- err
					for range work {
					}
					return
				}
			}
		})
	}
	for i := 0; i < len(docs); i += pgmBatch {
		work <- docs[i:min(i+pgmBatch, len(docs))]
	}
	close(work)
	wg.Wait()
	d := time.Since(start)
	select {
	case err := <-errs:
		return 0, err
	default:
		return d, nil
	}
}

// pgmGenerate returns pgmDocs orders with ids and order numbers of their own
// (set), about one value in twenty needing a coercion.
func pgmGenerate(r *mrand.Rand, set int) []*pgmDoc {
	text := func(s string) *string { return &s }
	docs := make([]*pgmDoc, pgmDocs)
	for i := range docs {
		no := int64(set*pgmDocs + i + 1)
		id := fmt.Sprintf("order-%d", no)
		placed := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(r.IntN(365*24*3600)) * time.Second)
		customer := fmt.Sprintf("6f1c2a9e-3b4d-4e5f-8a7b-%012x", r.IntN(1<<40))
		body := map[string]any{
			"_id": id, "type": "order", "order_no": no, "status": "paid",
			"customer":  map[string]any{"id": customer, "name": fmt.Sprintf("Customer %d", r.IntN(10000))},
			"placed_at": placed.Format(time.RFC3339), "paid": true, "tags": []string{"web"},
		}
		d := &pgmDoc{order: []*string{text(strconv.FormatInt(no, 10)), text("paid"), text(customer),
			text(body["customer"].(map[string]any)["name"].(string)), text(placed.Format(time.RFC3339)), text("true"), text(`["web"]`)}}
		var items []any
		cents := 0
		for line := range 1 + r.IntN(5) {
			qty := 1 + r.IntN(5)
			price := 100 + r.IntN(10000)
			var q any = qty
			if r.IntN(20) == 0 {
				q = strconv.Itoa(qty) // a coercion, recorded
			}
			p := fmt.Sprintf("%d.%02d", price/100, price%100)
			items = append(items, map[string]any{"sku": fmt.Sprintf("SKU-%d", r.IntN(1000)), "qty": q, "price": json.Number(p)})
			d.items = append(d.items, []*string{text(strconv.FormatInt(no, 10)), text(strconv.Itoa(line)),
				text(items[line].(map[string]any)["sku"].(string)), text(strconv.Itoa(qty)), text(p), text("EUR")})
			cents += qty * price
		}
		body["items"] = items
		money := func(c int) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }
		body["totals"] = map[string]any{"subtotal": json.Number(money(cents)), "tax": json.Number(money(cents / 5)),
			"total": json.Number(money(cents + cents/5)), "currency": "EUR"}
		d.totals = []*string{text(money(cents)), text(money(cents / 5)), text(money(cents + cents/5)), text("EUR")}

		b, _ := json.Marshal(body)
		seq, _ := json.Marshal(strconv.FormatInt(no, 10))
		d.change = &change.Envelope{
			V: change.EnvelopeVersion, Job: "bench", Output: "pg-mapping", DocID: id, Rev: "1-a", Seq: seq,
			Version: change.Version{Generation: 1, Counter: no}, EnqueuedAt: time.Now(), Doc: b,
		}
		docs[i] = d
	}
	return docs
}

// pgmOrder is a generated order as a plain writer would decode it.
type pgmOrder struct {
	OrderNo  int64 `json:"order_no"`
	Status   string
	Customer struct{ ID, Name string }
	PlacedAt string `json:"placed_at"`
	Paid     bool
	Tags     json.RawMessage
	Items    []struct {
		SKU   string
		Qty   json.Number
		Price json.Number
	}
	Totals struct {
		Subtotal, Tax, Total json.Number
		Currency             string
	}
}

// pgmDecode reads the rows of a change from its document with
// encoding/json, as a writer without mapping mode would.
func pgmDecode(c *change.Envelope) (*pgmDoc, error) {
	var o pgmOrder
	if err := json.Unmarshal(c.Doc, &o); err != nil {
		return nil, fmt.Errorf("decode %s: %w", c.DocID, err)
	}
	text := func(s string) *string { return &s }
	no := strconv.FormatInt(o.OrderNo, 10)
	d := &pgmDoc{change: c, order: []*string{text(no), text(o.Status), text(o.Customer.ID), text(o.Customer.Name),
		text(o.PlacedAt), text(strconv.FormatBool(o.Paid)), text(string(o.Tags))}}
	for line, it := range o.Items {
		d.items = append(d.items, []*string{text(no), text(strconv.Itoa(line)), text(it.SKU), text(it.Qty.String()),
			text(it.Price.String()), text(o.Totals.Currency)})
	}
	d.totals = []*string{text(o.Totals.Subtotal.String()), text(o.Totals.Tax.String()), text(o.Totals.Total.String()), text(o.Totals.Currency)}
	return d, nil
}

// pgmRaw writes the rows of a batch the plain way: delete the documents'
// rows, insert the new ones, in one pgx batch (one transaction), with the
// statements mapping mode runs minus its version guard.
type pgmRaw struct {
	clearSQL, writeSQL string
}

func newPGMRaw(schema string) *pgmRaw {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return &pgmRaw{
		clearSQL: `WITH d0 AS (DELETE FROM ` + t("orders") + ` WHERE doc_id = ANY($1::text[])),
d1 AS (DELETE FROM ` + t("order_items") + ` WHERE doc_id = ANY($1::text[]))
DELETE FROM ` + t("order_totals") + ` WHERE doc_id = ANY($1::text[])`,
		writeSQL: `WITH t0 AS (
    INSERT INTO ` + t("orders") + ` (doc_id, order_no, status, customer_id, customer_name, placed_at, paid, tags)
    SELECT r.d, r.c0::bigint, r.c1, r.c2::uuid, r.c3, r.c4::timestamptz, r.c5::boolean, r.c6::jsonb
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[]) AS r(d, c0, c1, c2, c3, c4, c5, c6)
), t1 AS (
    INSERT INTO ` + t("order_items") + ` (doc_id, order_no, line, sku, qty, unit_price, currency)
    SELECT r.d, r.c0::bigint, r.c1::integer, r.c2, r.c3::integer, r.c4::numeric, r.c5
    FROM unnest($9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[]) AS r(d, c0, c1, c2, c3, c4, c5)
)
INSERT INTO ` + t("order_totals") + ` (doc_id, subtotal, tax, total, currency)
SELECT r.d, r.c0::numeric, r.c1::numeric, r.c2::numeric, r.c3
FROM unnest($16::text[], $17::text[], $18::text[], $19::text[], $20::text[]) AS r(d, c0, c1, c2, c3)`,
	}
}

func (w *pgmRaw) write(ctx context.Context, pool *pgxpool.Pool, batch []*pgmDoc) error {
	var ids []string
	orders := make([][]*string, 8)
	items := make([][]*string, 7)
	totals := make([][]*string, 5)
	add := func(cols [][]*string, id string, row []*string) {
		cols[0] = append(cols[0], &id)
		for i, v := range row {
			cols[i+1] = append(cols[i+1], v)
		}
	}
	for _, d := range batch {
		id := d.change.DocID
		ids = append(ids, id)
		add(orders, id, d.order)
		for _, it := range d.items {
			add(items, id, it)
		}
		add(totals, id, d.totals)
	}
	args := make([]any, 0, 20)
	for _, cols := range [][][]*string{orders, items, totals} {
		for _, c := range cols {
			args = append(args, c)
		}
	}
	b := &pgx.Batch{}
	b.Queue(w.clearSQL, ids)
	b.Queue(w.writeSQL, args...)
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("raw batch: %w", err)
	}
	return nil
}

func pgmJoin(xs []float64) string {
	var b bytes.Buffer
	for i, x := range xs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%.0f", x)
	}
	return b.String()
}
