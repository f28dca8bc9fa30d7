package feed

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Kinds of sequence, by what can be told of their order.
const (
	seqOpaque   = iota // nothing: compared with nothing
	seqInteger         // CouchDB 1.x, pouchdb-server, Sync Gateway's plain form
	seqCompound        // Sync Gateway "T:S", "L::S", "L:T:S"
	seqPrefixed        // CouchDB 2+ "N-g1AAAA...": opaque, see SeqBefore
)

// seqPos is a sequence read for comparing.
type seqPos struct {
	kind   int
	digits string // seqInteger: the number without leading zeros
	sg     sgSeq  // seqInteger (when it fits) and seqCompound
	sgOK   bool
}

// readSeq reads a sequence as a source writes it: a JSON number or string.
func readSeq(raw json.RawMessage) seqPos {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return seqPos{}
	}
	var s string
	if t[0] == '"' {
		if err := json.Unmarshal(t, &s); err != nil {
			return seqPos{}
		}
	} else {
		s = string(t)
	}
	p := seqPos{}
	p.sg, p.sgOK = parseSGSeq(raw)
	switch {
	case s != "" && allDigits(s):
		p.kind, p.digits = seqInteger, strings.TrimLeft(s, "0")
	case p.sgOK:
		p.kind = seqCompound
	default:
		if n, rest, ok := strings.Cut(s, "-"); ok && n != "" && rest != "" && allDigits(n) {
			p.kind = seqPrefixed
		}
	}
	return p
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// lessDigits compares two numbers written without leading zeros.
func lessDigits(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// SeqBefore reports whether sequence a comes before sequence b, where their
// format allows telling: two integers (numbers or numeric strings, of any
// size); Sync Gateway's forms ("S", "T:S", "L::S", "L:T:S") by Sync
// Gateway's own order. ok is false when the order cannot be told: other
// forms, forms that differ, and CouchDB 2+ sequences ("N-..."), which are
// opaque: N is the sum of the sequences of whichever shard copies answered,
// so another node of the cluster, or the same one after a shard moved or
// split, writes a lower N for a later position. Nil (the beginning) is
// before everything.
func SeqBefore(a, b json.RawMessage) (before, ok bool) {
	switch {
	case isNull(a) && isNull(b):
		return false, true
	case isNull(a):
		return true, true
	case isNull(b):
		return false, true
	}
	pa, pb := readSeq(a), readSeq(b)
	switch {
	case pa.kind == seqInteger && pb.kind == seqInteger:
		return lessDigits(pa.digits, pb.digits), true
	case (pa.kind == seqInteger || pa.kind == seqCompound) && (pb.kind == seqInteger || pb.kind == seqCompound) && pa.sgOK && pb.sgOK:
		return pa.sg.before(pb.sg), true
	}
	return false, false
}

// NotBefore returns seq, or floor when seq comes before it (see SeqBefore):
// a checkpoint never goes back where the format tells.
func NotBefore(seq, floor json.RawMessage) json.RawMessage {
	if before, ok := SeqBefore(seq, floor); ok && before {
		return floor
	}
	return seq
}
