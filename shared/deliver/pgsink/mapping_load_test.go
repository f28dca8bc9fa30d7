package pgsink

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/changes-worker/changes-worker/shared/change"
	"github.com/changes-worker/changes-worker/shared/deliver"
	"github.com/changes-worker/changes-worker/shared/deliver/delivertest"
)

// The rows the orders mapping of testdata/orders_mapping.json must leave,
// as the generator computes them from the values it puts in the documents.
type (
	orderRow struct {
		DocID        string
		OrderNo      int64
		Status       *string
		CustomerID   *string
		CustomerName *string
		PlacedAt     *time.Time
		Paid         *bool
		Tags         *string // jsonb as PostgreSQL renders it
	}
	itemRow struct {
		DocID     string
		OrderNo   int64
		Line      int32
		SKU       string
		Qty       *int32
		UnitPrice *string // numeric as text
		Currency  *string
	}
	totalRow struct {
		DocID         string
		Subtotal, Tax *string
		Total         string
		Currency      *string
	}
	loadVersionRow struct {
		DocID               string
		Generation, Counter int64
		Rev                 string
		Deleted, Filtered   bool
	}
)

// docState is one version of a generated document: its body and the rows it
// maps to (none for a tombstone or a document that is not an order).
type docState struct {
	deleted bool
	order   bool
	body    map[string]any
	row     orderRow
	items   []itemRow
	total   totalRow
}

// generator builds random orders whose every value is rendered in one of the
// forms the mapping accepts (exact, coerced, or uncoercible into an on_error
// null column), remembering the value each form must store.
type generator struct{ r *rand.Rand }

func ptr[T any](v T) *T { return &v }

func (g generator) pick(n int) int { return g.r.IntN(n) }

func (g generator) order(id string, orderNo int64) docState {
	r := g.r
	st := docState{order: true}
	body := map[string]any{"_id": id, "type": "order", "order_no": json.Number(strconv.FormatInt(orderNo, 10))}
	if g.pick(4) == 0 {
		body["order_no"] = strconv.FormatInt(orderNo, 10) // coerced from a string
	}
	o := orderRow{DocID: id, OrderNo: orderNo}

	if g.pick(5) > 0 {
		s := []string{"open", "paid", "shipped", "cancelled"}[g.pick(4)]
		body["status"], o.Status = s, &s
	}
	customer := map[string]any{}
	if g.pick(5) > 0 {
		u := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, r.Uint32()&0xfff, r.Uint64()&0xffffffffffff)
		o.CustomerID = ptr(u)
		switch g.pick(3) {
		case 0:
			customer["id"] = u
		case 1:
			customer["id"] = strings.ToUpper(u)
		default:
			customer["id"] = "{" + u + "}"
		}
	}
	switch g.pick(4) {
	case 0:
	case 1:
		n := json.Number(strconv.Itoa(g.pick(1000)))
		customer["name"], o.CustomerName = n, ptr(string(n))
	default:
		name := fmt.Sprintf("Customer \"%d\" <ünïcode>", g.pick(1000))
		customer["name"], o.CustomerName = name, &name
	}
	if len(customer) > 0 || g.pick(2) == 0 {
		body["customer"] = customer
	}

	at := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(r.Int64N(5*365*24*3600*1000)) * time.Millisecond)
	switch g.pick(6) {
	case 0:
		body["placed_at"], o.PlacedAt = at.Format(time.RFC3339Nano), &at
	case 1:
		body["placed_at"], o.PlacedAt = json.Number(strconv.FormatInt(at.UnixMilli(), 10)), &at
	case 2:
		body["placed_at"], o.PlacedAt = json.Number(strconv.FormatInt(at.Unix(), 10)), ptr(at.Truncate(time.Second))
	case 3:
		body["placed_at"], o.PlacedAt = at.Format("2006-01-02T15:04:05.000"), &at
	case 4:
		body["placed_at"] = "soon" // stored as NULL, recorded
	}
	switch g.pick(5) {
	case 0:
		body["paid"], o.Paid = true, ptr(true)
	case 1:
		body["paid"], o.Paid = false, ptr(false)
	case 2:
		body["paid"], o.Paid = "TRUE", ptr(true)
	case 3:
		body["paid"] = "maybe"
	}
	if g.pick(2) == 0 {
		tags := []any{}
		var quoted []string
		for i := range g.pick(3) {
			tag := fmt.Sprintf("t%d", i+g.pick(9))
			tags = append(tags, tag)
			quoted = append(quoted, strconv.Quote(tag))
		}
		body["tags"], o.Tags = tags, ptr("["+strings.Join(quoted, ", ")+"]")
	}

	currency := []string{"EUR", "USD", "GBP"}[g.pick(3)]
	var items []any
	subtotal := 0
	for line := range g.pick(5) {
		it := map[string]any{"sku": fmt.Sprintf("SKU-%d", g.pick(500))}
		row := itemRow{DocID: id, OrderNo: orderNo, Line: int32(line), SKU: it["sku"].(string), Currency: &currency}
		qty := 1 + g.pick(9)
		switch g.pick(4) {
		case 0:
			it["qty"] = strconv.Itoa(qty)
		case 1:
			it["qty"] = json.Number(strconv.Itoa(qty) + ".0")
		default:
			it["qty"] = json.Number(strconv.Itoa(qty))
		}
		row.Qty = ptr(int32(qty))
		cents := 1 + g.pick(10000)
		price := fmt.Sprintf("%d.%02d", cents/100, cents%100)
		switch g.pick(4) {
		case 0:
			it["price"], row.UnitPrice = price, ptr(price)
		case 1:
			it["price"] = "n/a" // stored as NULL, recorded
		default:
			it["price"], row.UnitPrice = json.Number(price), ptr(price)
		}
		subtotal += qty * cents
		items = append(items, it)
		st.items = append(st.items, row)
	}
	if len(items) > 0 || g.pick(2) == 0 {
		body["items"] = items
	}
	tax := subtotal / 5
	money := func(cents int) string { return fmt.Sprintf("%d.%02d", cents/100, cents%100) }
	totals := map[string]any{"total": json.Number(money(subtotal + tax)), "currency": currency}
	st.total = totalRow{DocID: id, Total: money(subtotal + tax), Currency: &currency}
	if g.pick(2) == 0 {
		totals["subtotal"], st.total.Subtotal = money(subtotal), ptr(money(subtotal))
		totals["tax"], st.total.Tax = json.Number(money(tax)), ptr(money(tax))
	}
	body["totals"] = totals
	st.body, st.row = body, o
	return st
}

// TestMappingTenThousandDocuments applies the histories of 10,000 generated
// documents (updates, deletions, documents leaving the filter, duplicates)
// in shuffled batches of 10 from four concurrent writers, as Lambda drains a
// standard queue, and compares every row of every table with the rows
// computed from each document's last version.
func TestMappingTenThousandDocuments(t *testing.T) {
	t.Parallel()
	const docs = 10000
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	g := generator{r: rand.New(rand.NewPCG(seed, seed>>7))}

	s, pool, _ := newMappedSink(t, nil, loadMapping(t, "testdata/orders_mapping.json"))

	// Histories: every document gets one to three versions, observed in
	// rounds; the last round is a takeover (generation 2).
	final := make([]docState, docs)
	finalChange := make([]*change.Envelope, docs)
	var all []*change.Envelope
	counter := int64(0)
	for round := range 3 {
		gen := int64(1)
		if round == 2 {
			gen, counter = 2, 0
		}
		for d := range docs {
			if round > 0 && g.pick(2) == 0 {
				continue
			}
			id := fmt.Sprintf("order-%05d", d)
			counter++
			rev := fmt.Sprintf("%d-%x", round+1, g.r.Uint32())
			var st docState
			var c *change.Envelope
			switch k := g.pick(20); {
			case round > 0 && k < 2:
				st = docState{deleted: true}
				c = delivertest.Deleted(id, rev, v(gen, counter))
			case k < 3:
				st = docState{body: map[string]any{"_id": id, "type": "quote", "order_no": d}}
			default:
				st = g.order(id, int64(100000+d))
			}
			if c == nil {
				body, err := json.Marshal(st.body)
				if err != nil {
					t.Fatal(err)
				}
				c = delivertest.Live(id, rev, v(gen, counter))
				c.Doc = body
			}
			all = append(all, c)
			final[d], finalChange[d] = st, c
		}
	}
	// SQS delivers at least once, in any order.
	for _, c := range all {
		if g.pick(20) == 0 {
			all = append(all, c)
		}
	}
	g.r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	t.Logf("%d documents, %d deliveries", docs, len(all))

	work := make(chan []*change.Envelope)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 4 {
		wg.Go(func() {
			for batch := range work {
				for attempt := 1; len(batch) > 0; attempt++ {
					var again []*change.Envelope
					for i, err := range s.Apply(t.Context(), batch) {
						if err == nil {
							continue
						}
						if deliver.Classify(err).Class != deliver.Transient || attempt == 10 {
							t.Errorf("writer %d: %s %s: %v", w, batch[i].DocID, batch[i].Version, err)
							continue
						}
						again = append(again, batch[i])
					}
					batch = again
				}
			}
		})
	}
	for i := 0; i < len(all); i += 10 {
		work <- all[i:min(i+10, len(all))]
	}
	close(work)
	wg.Wait()
	t.Logf("applied in %s", time.Since(start).Round(time.Millisecond))

	var wantOrders []orderRow
	var wantItems []itemRow
	var wantTotals []totalRow
	var wantVersions []loadVersionRow
	for d, st := range final {
		c := finalChange[d]
		wantVersions = append(wantVersions, loadVersionRow{DocID: c.DocID, Generation: c.Generation, Counter: c.Counter,
			Rev: c.Rev, Deleted: st.deleted, Filtered: !st.deleted && !st.order})
		if !st.order {
			continue
		}
		wantOrders = append(wantOrders, st.row)
		wantItems = append(wantItems, st.items...)
		wantTotals = append(wantTotals, st.total)
	}

	tables := s.mapping.tables
	compare(t, "orders", wantOrders, readRows(t, pool, `SELECT doc_id, order_no, status, customer_id::text, customer_name, placed_at, paid, tags::text
		FROM `+tables[0].ident+` ORDER BY order_no`, func(r pgx.Rows) (orderRow, error) {
		var o orderRow
		err := r.Scan(&o.DocID, &o.OrderNo, &o.Status, &o.CustomerID, &o.CustomerName, &o.PlacedAt, &o.Paid, &o.Tags)
		return o, err
	}))
	compare(t, "order_items", wantItems, readRows(t, pool, `SELECT doc_id, order_no, line, sku, qty, unit_price::text, currency
		FROM `+tables[1].ident+` ORDER BY order_no, line`, func(r pgx.Rows) (itemRow, error) {
		var it itemRow
		err := r.Scan(&it.DocID, &it.OrderNo, &it.Line, &it.SKU, &it.Qty, &it.UnitPrice, &it.Currency)
		return it, err
	}))
	compare(t, "order_totals", wantTotals, readRows(t, pool, `SELECT doc_id, subtotal::text, tax::text, total::text, currency
		FROM `+tables[2].ident+` ORDER BY doc_id`, func(r pgx.Rows) (totalRow, error) {
		var tr totalRow
		err := r.Scan(&tr.DocID, &tr.Subtotal, &tr.Tax, &tr.Total, &tr.Currency)
		return tr, err
	}))
	compare(t, "versions", wantVersions, readRows(t, pool, `SELECT doc_id, generation, counter, rev, deleted, filtered
		FROM `+s.mapping.versions+` ORDER BY doc_id`, func(r pgx.Rows) (loadVersionRow, error) {
		var vr loadVersionRow
		err := r.Scan(&vr.DocID, &vr.Generation, &vr.Counter, &vr.Rev, &vr.Deleted, &vr.Filtered)
		return vr, err
	}))
}

func readRows[T any](t *testing.T, pool *pgxpool.Pool, query string, scan func(pgx.Rows) (T, error)) []T {
	t.Helper()
	rows, err := pool.Query(t.Context(), query)
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r.(pgx.Rows)) })
	if err != nil {
		t.Fatalf("read rows: %v", err)
	}
	return got
}

// compare reports the first differing rows of a table, row by row.
func compare[T any](t *testing.T, table string, want, got []T) {
	t.Helper()
	if len(want) != len(got) {
		t.Errorf("%s: %d rows, want %d", table, len(got), len(want))
	}
	shown := 0
	for i := range min(len(want), len(got)) {
		if diff := cmp.Diff(want[i], got[i]); diff != "" {
			t.Errorf("%s row %d (-want +got):\n%s", table, i, diff)
			if shown++; shown == 5 {
				t.Errorf("%s: more rows differ", table)
				return
			}
		}
	}
}
