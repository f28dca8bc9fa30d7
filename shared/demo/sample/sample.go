// Package sample writes a reproducible data set of orders into a
// CouchDB-compatible database through its HTTP API: inserts, then updates and
// deletes of some of them, with ids that need escaping (unicode, '/'). The demo,
// the end-to-end tests and the benchmarks use it.
package sample

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
)

// Options shape the data set.
type Options struct {
	Docs        int // documents inserted
	UpdateEvery int // every n-th document is updated once more (0: none)
	DeleteEvery int // every n-th document is deleted afterwards (0: none)
	BodyBytes   int // approximate size of each body's padding (0: small)
	Seed        uint64
}

// Doc is one written document as the source holds it afterwards.
type Doc struct {
	ID      string
	Rev     string
	Deleted bool
}

// ID returns the id of the i-th document. Some ids contain '/', some
// non-ASCII letters, so every layer's escaping is exercised.
func ID(i int) string {
	switch i % 10 {
	case 3:
		return fmt.Sprintf("order/%06d", i)
	case 7:
		return fmt.Sprintf("commande-%06d-été-注文", i)
	default:
		return fmt.Sprintf("order-%06d", i)
	}
}

// Load writes the data set into db (a database URL) and returns the final
// state of every document by id.
func Load(ctx context.Context, client *http.Client, db string, o Options) (map[string]Doc, error) {
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	final := make(map[string]Doc, o.Docs)
	const chunk = 500
	for start := 0; start < o.Docs; start += chunk {
		var docs []map[string]any
		for i := start; i < min(start+chunk, o.Docs); i++ {
			docs = append(docs, Order(i, 1, o.BodyBytes, rng))
		}
		if err := bulk(ctx, client, db, docs, final); err != nil {
			return nil, err
		}
	}
	if o.UpdateEvery > 0 {
		var docs []map[string]any
		for i := 0; i < o.Docs; i += o.UpdateEvery {
			d := Order(i, 2, o.BodyBytes, rng)
			d["_rev"] = final[ID(i)].Rev
			docs = append(docs, d)
		}
		if err := bulkChunks(ctx, client, db, docs, final); err != nil {
			return nil, err
		}
	}
	if o.DeleteEvery > 0 {
		var docs []map[string]any
		for i := 1; i < o.Docs; i += o.DeleteEvery {
			docs = append(docs, map[string]any{"_id": ID(i), "_rev": final[ID(i)].Rev, "_deleted": true})
		}
		if err := bulkChunks(ctx, client, db, docs, final); err != nil {
			return nil, err
		}
	}
	return final, nil
}

// Order builds the body of document i at the given version.
func Order(i, version, padding int, rng *rand.Rand) map[string]any {
	d := map[string]any{
		"_id":      ID(i),
		"type":     "order",
		"number":   i,
		"version":  version,
		"customer": fmt.Sprintf("customer-%d", rng.IntN(1000)),
		"total":    float64(rng.IntN(100000)) / 100,
		"items": []map[string]any{
			{"sku": fmt.Sprintf("sku-%d", rng.IntN(50)), "qty": 1 + rng.IntN(5)},
			{"sku": fmt.Sprintf("sku-%d", rng.IntN(50)), "qty": 1 + rng.IntN(5)},
		},
	}
	if padding > 0 {
		d["notes"] = strings.Repeat("x", padding)
	}
	return d
}

func bulkChunks(ctx context.Context, client *http.Client, db string, docs []map[string]any, final map[string]Doc) error {
	for start := 0; start < len(docs); start += 500 {
		if err := bulk(ctx, client, db, docs[start:min(start+500, len(docs))], final); err != nil {
			return err
		}
	}
	return nil
}

// bulkAnswerMax bounds the answer to one _bulk_docs request of at most 500
// documents, about a hundred bytes each.
const bulkAnswerMax = 4 << 20

func bulk(ctx context.Context, client *http.Client, db string, docs []map[string]any, final map[string]Doc) error {
	body, err := json.Marshal(map[string]any{"docs": docs})
	if err != nil {
		return fmt.Errorf("encode bulk docs: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, db+"/_bulk_docs", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("bulk docs: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("bulk docs: %w", err)
	}
	defer resp.Body.Close()
	// An answer cut at the bound does not decode, and says so below.
	b, _ := io.ReadAll(io.LimitReader(resp.Body, bulkAnswerMax))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("bulk docs: status %d: %.200s", resp.StatusCode, b)
	}
	var res []struct {
		ID, Rev, Error, Reason string
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("bulk docs: decode answer: %w", err)
	}
	for i, r := range res {
		if r.Error != "" {
			return fmt.Errorf("bulk docs: %s: %s %s", r.ID, r.Error, r.Reason)
		}
		_, deleted := docs[i]["_deleted"]
		final[r.ID] = Doc{ID: r.ID, Rev: r.Rev, Deleted: deleted}
	}
	return nil
}

// CreateDB creates a database (an existing one is fine).
func CreateDB(ctx context.Context, client *http.Client, db string) error {
	status, err := database(ctx, client, http.MethodPut, db)
	if err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	if status != http.StatusCreated && status != http.StatusPreconditionFailed && status != http.StatusOK {
		return fmt.Errorf("create database: status %d", status)
	}
	return nil
}

// DeleteDB deletes a database (a missing one is fine).
func DeleteDB(ctx context.Context, client *http.Client, db string) error {
	if _, err := database(ctx, client, http.MethodDelete, db); err != nil {
		return fmt.Errorf("delete database: %w", err)
	}
	return nil
}

// database sends a body-less request to the database URL and returns the
// answer's status.
func database(ctx context.Context, client *http.Client, method, db string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, db, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
