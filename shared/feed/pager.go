package feed

import "sync"

// pager keeps the number of rows the client asks a page for. It starts at
// Options.Limit; a page cut by its byte budget sets it to the rows that fit,
// and a full page that used at most half the budget doubles it, up to
// Options.Limit again. So a run of large documents costs one cut page, not
// one per page, and the page grows back once the documents are small again.
// It also keeps the average body size seen, which sizes _bulk_get requests.
// Safe for concurrent use.
type pager struct {
	mu    sync.Mutex
	max   int // Options.Limit
	limit int // 0: max
	avg   int64
}

// size is the limit of the next page.
func (p *pager) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.limit == 0 {
		return p.max
	}
	return p.limit
}

// cut records a page cut after rows rows (kept or not, the rows read).
func (p *pager) cut(rows int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit = min(max(rows, 1), p.max)
}

// done records a page that was not cut, whether it was full and the bytes
// of bodies it held, with budget the page's budget.
func (p *pager) done(full bool, bytes, budget int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.limit == 0 || !full || bytes > budget/2 {
		return
	}
	p.limit = min(2*p.limit, p.max)
	if p.limit == p.max {
		p.limit = 0
	}
}

// observe records n bodies of total bytes.
func (p *pager) observe(n int, bytes int64) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	got := bytes / int64(n)
	if p.avg == 0 {
		p.avg = got
		return
	}
	p.avg = (p.avg + got) / 2
}

// average is the average body size seen so far, 0 before any.
func (p *pager) average() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.avg
}
