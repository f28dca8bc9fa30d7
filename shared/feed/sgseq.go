package feed

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// sgSeq is a Sync Gateway sequence: "S", "T:S" (S sent because of the
// principal change T, such as a grant or a revocation), "L::S" or "L:T:S"
// (L: the lowest sequence not yet stable).
type sgSeq struct {
	low, triggeredBy, seq uint64
}

// parseSGSeq reads a sequence as Sync Gateway writes it, a JSON string or
// number; ok is false for anything else.
func parseSGSeq(raw json.RawMessage) (sgSeq, bool) {
	t := bytes.TrimSpace(raw)
	var s string
	if len(t) > 0 && t[0] == '"' {
		if err := json.Unmarshal(t, &s); err != nil {
			return sgSeq{}, false
		}
	} else {
		s = string(t)
	}
	parts := strings.Split(s, ":")
	num := func(p string) (uint64, bool) {
		if p == "" {
			return 0, true
		}
		n, err := strconv.ParseUint(p, 10, 64)
		return n, err == nil
	}
	var q sgSeq
	var ok1, ok2, ok3 bool
	switch len(parts) {
	case 1:
		q.seq, ok1 = num(parts[0])
		return q, ok1 && parts[0] != ""
	case 2:
		q.triggeredBy, ok1 = num(parts[0])
		q.seq, ok2 = num(parts[1])
		return q, ok1 && ok2 && parts[1] != ""
	case 3:
		q.low, ok1 = num(parts[0])
		q.triggeredBy, ok2 = num(parts[1])
		q.seq, ok3 = num(parts[2])
		return q, ok1 && ok2 && ok3 && parts[2] != ""
	}
	return sgSeq{}, false
}

// safe is the sequence a comparison uses: the low sequence when it is set.
func (s sgSeq) safe() uint64 {
	if s.low > 0 && s.low < s.seq {
		return s.low
	}
	return s.seq
}

// before is Sync Gateway's own order of sequences.
func (s sgSeq) before(o sgSeq) bool {
	switch {
	case s.triggeredBy == o.triggeredBy:
		if s.safe() == o.safe() {
			return s.seq < o.seq
		}
		return s.safe() < o.safe()
	case s.triggeredBy == 0:
		return s.safe() < o.triggeredBy
	case o.triggeredBy == 0:
		return s.triggeredBy <= o.safe()
	default:
		return s.triggeredBy < o.triggeredBy
	}
}
