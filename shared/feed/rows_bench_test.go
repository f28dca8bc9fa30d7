package feed

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// benchDoc is a document body of about size bytes, shaped like application
// data: scalars, a nested object, a list of objects and text.
func benchDoc(id string, i, size int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"_id":%q,"_rev":"3-%032x","type":"order","n":%d,"total":%d.%02d,"paid":%t,`, id, i*7919, i, i*13, i%100, i%2 == 0)
	fmt.Fprintf(&b, `"customer":{"name":"Customer %d","email":"c%d@example.com","tags":["a","b\"q"]},"lines":[`, i, i)
	for n := 0; b.Len() < size-120; n++ {
		if n > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","qty":%d,"price":%d.5,"note":"line %d of order %d, packed"}`, n, n%9+1, n*3, n, i)
	}
	fmt.Fprintf(&b, `],"channels":["orders","region-%d"],"note":"plain text with \u00e9 and \\ escapes"}`, i%4)
	return b.String()
}

// benchPage is a _changes answer of rows rows with included documents of
// about docSize bytes, as Sync Gateway writes it.
func benchPage(rows, docSize int) []byte {
	var b strings.Builder
	b.WriteString(`{"results":[`)
	for i := range rows {
		if i > 0 {
			b.WriteString(",\n")
		}
		id := fmt.Sprintf("order::%06d", i)
		doc := benchDoc(id, i, docSize)
		var rev struct {
			Rev string `json:"_rev"`
		}
		if err := json.Unmarshal([]byte(doc), &rev); err != nil {
			panic(err)
		}
		fmt.Fprintf(&b, `{"seq":%d,"id":%q,"doc":%s,"changes":[{"rev":%q}]}`, 1000+i, id, doc, rev.Rev)
	}
	fmt.Fprintf(&b, "\n],\n"+`"last_seq":"%d"}`, 1000+rows)
	return []byte(b.String())
}

// BenchmarkPageRows reads a page of 500 rows with their documents included,
// small and large, as Changes reads an answer (reader=scanner), and as
// json.Decoder read it before (reader=decoder), side by side.
func BenchmarkPageRows(b *testing.B) {
	readers := []struct {
		name string
		read func(*pageReader, *stream) (*Batch, error)
	}{
		{"scanner", (*pageReader).read},
		{"decoder", decoderRead},
	}
	for _, size := range []int{250, 10 << 10} {
		body := benchPage(500, size)
		for _, r := range readers {
			b.Run(fmt.Sprintf("doc=%dB/reader=%s", size, r.name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					batch, err := r.read(&pageReader{limit: 500}, bytesStream(body, int64(len(body))+1))
					if err != nil || len(batch.Rows) != 500 || batch.Rows[499].Doc == nil {
						b.Fatalf("read: %v", err)
					}
				}
			})
		}
	}
}
