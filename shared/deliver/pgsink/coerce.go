package pgsink

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/deliver"
)

// Coercion reasons, recorded in the data-quality table. A value that fits its
// column as it is has no reason and no record.
const (
	reasonParsedString   = "parsed_string"      // "42" → 42, "true" → true, "12.5" → 12.5
	reasonIntegralNumber = "integral_number"    // 42.0 or 4.2e1 → 42
	reasonNumberAsText   = "number_as_text"     // 42 → '42'
	reasonBooleanAsText  = "boolean_as_text"    // true → 'true'
	reasonJSONAsText     = "json_as_text"       // {"a":1} → '{"a":1}'
	reasonNumberAsBool   = "number_as_boolean"  // 0 → false, 1 → true
	reasonEpochSeconds   = "epoch_seconds"      // a number guessed to be seconds since 1970
	reasonEpochMillis    = "epoch_milliseconds" // a number guessed to be milliseconds since 1970
	reasonAssumedUTC     = "assumed_utc"        // an ISO-8601 time without offset
	reasonDateOnly       = "date_only"          // an ISO-8601 date: midnight UTC
	reasonRounded        = "rounded_to_microseconds"
	reasonNormalizedUUID = "normalized_uuid" // braces, urn:uuid: or no hyphens
	// A number PostgreSQL refuses as written but whose value it holds
	// ("0e-99999", "1.000…" past 16383 decimals): written out without
	// exponent or trailing zeros.
	reasonNormalizedNumber = "normalized_number"
	// A time whose UTC offset PostgreSQL cannot read (beyond ±15:59, or a
	// minute 60): the same instant in UTC.
	reasonOffsetToUTC = "offset_converted_to_utc"
	// A jsonb value PostgreSQL refuses as written: unpaired surrogates as
	// U+FFFD, numbers normalized.
	reasonNormalizedJSON = "normalized_json"
)

// Reasons a value cannot be coerced. With on_error null they are recorded
// with a NULL stored value; otherwise they fail the document.
const (
	failNotNumber    = "not_a_number"
	failNotInteger   = "not_an_integer"
	failOutOfRange   = "out_of_range"
	failNotBoolean   = "not_a_boolean"
	failNotTimestamp = "not_a_timestamp"
	failNotUUID      = "not_a_uuid"
	failNUL          = "nul_character" // PostgreSQL text and jsonb cannot hold U+0000
)

// coercion is the outcome of fitting one JSON value to a column: the text
// PostgreSQL parses into the column type, and why the value had to change
// ("" when it fits as it is); or, when fail is set, why it cannot fit.
type coercion struct {
	text   string
	reason string
	fail   string
}

// coerce fits v, a non-null value decoded with json.Number numbers, to a
// column of type typ. epoch is the column's epoch unit ("" to guess).
func coerce(v any, typ, epoch string) coercion {
	switch typ {
	case config.ColumnText:
		return toText(v)
	case config.ColumnInteger:
		return toInteger(v, 32)
	case config.ColumnBigint:
		return toInteger(v, 64)
	case config.ColumnNumeric:
		return toNumeric(v)
	case config.ColumnBoolean:
		return toBoolean(v)
	case config.ColumnTimestamptz:
		return toTimestamp(v, epoch)
	case config.ColumnJSONB:
		return toJSONB(v)
	case config.ColumnUUID:
		return toUUID(v)
	}
	// Validation admits no other type.
	return coercion{fail: "unknown_type"}
}

func toText(v any) coercion {
	switch v := v.(type) {
	case string:
		if strings.IndexByte(v, 0) >= 0 {
			return coercion{fail: failNUL}
		}
		return coercion{text: v}
	case json.Number:
		return coercion{text: string(v), reason: reasonNumberAsText}
	case bool:
		return coercion{text: strconv.FormatBool(v), reason: reasonBooleanAsText}
	case rawJSON:
		// As written; a NUL inside is escaped there.
		return coercion{text: string(v), reason: reasonJSONAsText}
	}
	return coercion{text: jsonText(v), reason: reasonJSONAsText}
}

// numberText returns the text of a number for the numeric coercions: a JSON
// number as written, a string trimmed with reason parsed_string; ok is false
// for any other value.
func numberText(v any) (s, reason string, ok bool) {
	switch v := v.(type) {
	case json.Number:
		return string(v), "", true
	case string:
		return strings.TrimSpace(v), reasonParsedString, true
	}
	return "", "", false
}

func toInteger(v any, bits int) coercion {
	s, reason, ok := numberText(v)
	if !ok {
		return coercion{fail: failNotNumber}
	}
	if _, err := strconv.ParseInt(s, 10, bits); err == nil && reason == "" {
		// A JSON integer in range, the common case: stored as written.
		return coercion{text: s}
	}
	d, ok := parseDecimal(s)
	if !ok {
		return coercion{fail: failNotNumber}
	}
	digits, integral, ok := d.integer()
	switch {
	case !integral:
		return coercion{fail: failNotInteger}
	case !ok:
		return coercion{fail: failOutOfRange}
	}
	n, err := strconv.ParseInt(digits, 10, bits)
	if err != nil {
		return coercion{fail: failOutOfRange}
	}
	if reason == "" && digits != s {
		reason = reasonIntegralNumber
	}
	return coercion{text: strconv.FormatInt(n, 10), reason: reason}
}

// PostgreSQL's numeric holds up to 131072 digits before the point and 16383
// after. Its input refuses a text whose scale as written (digits after the
// point minus the exponent) exceeds 16383, or whose exponent reaches 2^30,
// even when the value fits ("0e-99999", "1.000…").
const (
	maxNumericWeight   = 131072
	maxNumericScale    = 16383
	maxNumericExponent = 1<<30 - 1
)

func toNumeric(v any) coercion {
	s, reason, ok := numberText(v)
	if !ok {
		return coercion{fail: failNotNumber}
	}
	d, ok := parseDecimal(s)
	if !ok {
		return coercion{fail: failNotNumber}
	}
	text, status := pgNumeric(s, d)
	switch status {
	case numericOutOfRange:
		return coercion{fail: failOutOfRange}
	case numericRewritten:
		reason = reasonNormalizedNumber
	}
	return coercion{text: text, reason: reason}
}

// What pgNumeric made of a number.
const (
	numericAsWritten = iota
	numericRewritten
	numericOutOfRange
)

// pgNumeric returns the text PostgreSQL's numeric reads as the number s
// (parsed as d): s itself when PostgreSQL accepts it as written, otherwise
// d written out in positional notation without trailing zeros; or
// numericOutOfRange when no text can hold the value.
func pgNumeric(s string, d decimal) (string, int) {
	n := d.normalized()
	if n.digits != "" && (n.intLen() > maxNumericWeight || -n.exp > maxNumericScale) {
		return "", numericOutOfRange
	}
	if numericAsWrittenOK(s) {
		return s, numericAsWritten
	}
	return n.positional(), numericRewritten
}

// numericAsWrittenOK reports whether PostgreSQL's numeric input reads s
// (which parseDecimal accepted) as it is: its written scale is at most 16383
// and its exponent below 2^30. The value's range is checked separately.
func numericAsWrittenOK(s string) bool {
	frac, exp, expNeg := 0, 0, false
	i := strings.IndexAny(s, ".eE")
	if i < 0 {
		return true
	}
	if s[i] == '.' {
		for i++; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
			frac++
		}
	}
	if i < len(s) {
		i++ // e or E
		if s[i] == '+' || s[i] == '-' {
			expNeg = s[i] == '-'
			i++
		}
		for ; i < len(s); i++ {
			if exp = exp*10 + int(s[i]-'0'); exp > maxNumericExponent {
				return false
			}
		}
	}
	if expNeg {
		exp = -exp
	}
	return frac-exp <= maxNumericScale
}

// positional writes d (normalized) without exponent: "-12.5", "0.001", "0".
func (d decimal) positional() string {
	if d.digits == "" {
		return "0"
	}
	var b strings.Builder
	if d.neg {
		b.WriteByte('-')
	}
	switch point := len(d.digits) + d.exp; {
	case d.exp >= 0:
		b.WriteString(d.digits)
		b.WriteString(strings.Repeat("0", d.exp))
	case point > 0:
		b.WriteString(d.digits[:point])
		b.WriteByte('.')
		b.WriteString(d.digits[point:])
	default:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -point))
		b.WriteString(d.digits)
	}
	return b.String()
}

func toBoolean(v any) coercion {
	switch v := v.(type) {
	case bool:
		return coercion{text: strconv.FormatBool(v)}
	case string:
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "true":
			return coercion{text: "true", reason: reasonParsedString}
		case "false":
			return coercion{text: "false", reason: reasonParsedString}
		}
	case json.Number:
		switch v {
		case "1":
			return coercion{text: "true", reason: reasonNumberAsBool}
		case "0":
			return coercion{text: "false", reason: reasonNumberAsBool}
		}
	}
	return coercion{fail: failNotBoolean}
}

// epochMillisDigits separates guessed epoch units: numbers with fewer digits
// before the point (below 1e11) are seconds, up to the year 5138; longer ones
// are milliseconds, from March 1973 on.
const epochMillisDigits = 12

// The timestamps accepted: years 1 to 9999, whatever the unit.
var (
	minTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
)

const timestampLayout = "2006-01-02T15:04:05.999999Z07:00"

func toTimestamp(v any, epoch string) coercion {
	switch v := v.(type) {
	case json.Number:
		return fromEpoch(string(v), epoch, false)
	case string:
		s := strings.TrimSpace(v)
		if _, ok := parseDecimal(s); ok {
			return fromEpoch(s, epoch, true)
		}
		return fromISO(s)
	}
	return coercion{fail: failNotTimestamp}
}

// fromEpoch reads a number of seconds or milliseconds since 1970.
func fromEpoch(s, unit string, quoted bool) coercion {
	d, ok := parseDecimal(s)
	if !ok {
		return coercion{fail: failNotTimestamp}
	}
	reason := ""
	if unit == "" {
		unit, reason = config.EpochSeconds, reasonEpochSeconds
		if d.intLen() >= epochMillisDigits {
			unit, reason = config.EpochMillis, reasonEpochMillis
		}
	} else if quoted {
		reason = reasonParsedString
	}
	shift := 6 // seconds → microseconds
	if unit == config.EpochMillis {
		shift = 3
	}
	micros, exact, ok := d.shiftRound(shift)
	if !ok {
		return coercion{fail: failOutOfRange}
	}
	t := time.UnixMicro(micros).UTC()
	if t.Before(minTime) || t.After(maxTime) {
		return coercion{fail: failOutOfRange}
	}
	if !exact && reason == "" {
		reason = reasonRounded
	}
	return coercion{text: t.Format(timestampLayout), reason: reason}
}

// fromISO reads an ISO-8601 date and time (RFC 3339, also with a space
// instead of T, without seconds' fraction, or without offset), or a date.
func fromISO(s string) coercion {
	if len(s) > 10 && (s[10] == ' ' || s[10] == 't') {
		s = s[:10] + "T" + s[11:]
	}
	s = strings.Replace(s, "z", "Z", 1)
	reason := ""
	t, err := time.Parse(time.RFC3339Nano, s)
	// Go reads UTC offsets up to ±24:00 and a minute 60 ("+01:60");
	// PostgreSQL refuses both: such a time goes as the same instant in UTC.
	for _, layout := range []string{"2006-01-02T15:04:05.999999999Z0700", "2006-01-02T15:04:05.999999999Z07"} {
		if err != nil {
			t, err = time.Parse(layout, s)
		}
	}
	if err != nil {
		reason = reasonAssumedUTC
		t, err = time.Parse("2006-01-02T15:04:05.999999999", s)
	}
	if err != nil {
		t, err = time.Parse("2006-01-02T15:04", s)
	}
	if err != nil {
		reason = reasonDateOnly
		t, err = time.Parse("2006-01-02", s)
	}
	if err != nil {
		return coercion{fail: failNotTimestamp}
	}
	if _, off := t.Zone(); reason == "" && (off <= -16*3600 || off >= 16*3600 || strings.HasSuffix(s, "60")) {
		// Seconds of 60 do not parse, so a parsed time with an offset
		// ending in 60 has a minute 60 there.
		reason = reasonOffsetToUTC
	}
	rounded := t.Round(time.Microsecond)
	if !rounded.Equal(t) && reason == "" {
		reason = reasonRounded
	}
	t = rounded.UTC()
	if t.Before(minTime) || t.After(maxTime) {
		return coercion{fail: failOutOfRange}
	}
	if reason == "" && !strings.ContainsRune(s, ',') {
		// A time with offset and at most microseconds, its fraction after
		// a '.': PostgreSQL reads it as it is.
		return coercion{text: s}
	}
	return coercion{text: t.Format(timestampLayout), reason: reason}
}

func toUUID(v any) coercion {
	s, ok := v.(string)
	if !ok {
		return coercion{fail: failNotUUID}
	}
	canonical := len(s) == 36
	switch {
	case canonical:
		if s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
			return coercion{fail: failNotUUID}
		}
	case len(s) == 38 && s[0] == '{' && s[37] == '}':
		return withReason(toUUID(s[1:37]), reasonNormalizedUUID)
	case strings.HasPrefix(strings.ToLower(s), "urn:uuid:"):
		return withReason(toUUID(s[len("urn:uuid:"):]), reasonNormalizedUUID)
	case len(s) != 32:
		return coercion{fail: failNotUUID}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if canonical && (i == 8 || i == 13 || i == 18 || i == 23) {
			continue // a hyphen, checked above
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return coercion{fail: failNotUUID}
		}
	}
	if canonical {
		return coercion{text: strings.ToLower(s)} // no copy when already lowercase
	}
	h := strings.ToLower(s)
	return coercion{text: h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], reason: reasonNormalizedUUID}
}

// withReason gives a successful coercion the reason r unless it has one.
func withReason(c coercion, r string) coercion {
	if c.fail == "" && c.reason == "" {
		c.reason = r
	}
	return c
}

// jsonText encodes a decoded value as compact JSON, object keys sorted and
// without HTML escaping.
func jsonText(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Values decoded from JSON always encode.
		return "null"
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// toJSONB fits any JSON value to a jsonb column. jsonb cannot hold U+0000
// (a failure); PostgreSQL's JSON input refuses unpaired surrogate escapes
// and numbers its numeric cannot read as written, so such a value is written
// again (surrogates as U+FFFD, numbers in positional notation), or fails
// when one of its numbers is out of numeric's range.
func toJSONB(v any) coercion {
	r, ok := v.(rawJSON)
	if !ok {
		r = rawJSON(jsonText(v))
	}
	if mayHoldNUL(r) && hasNUL(rawValue(r)) {
		return coercion{fail: failNUL}
	}
	if jsonAsWrittenOK(string(r)) {
		return coercion{text: string(r)}
	}
	fixed, ok := pgJSONValue(rawValue(r), false)
	if !ok {
		return coercion{fail: failOutOfRange}
	}
	return coercion{text: jsonText(fixed), reason: reasonNormalizedJSON}
}

// jsonAsWrittenOK reports whether PostgreSQL's JSON input reads the valid
// JSON text r as it is: no unpaired surrogate escape, every number one its
// numeric reads as written and holds. A \u0000 escape is not its concern.
func jsonAsWrittenOK(r string) bool {
	if !strings.Contains(r, `\u`) && !strings.ContainsAny(r, ".eE") && len(r) < maxNumericWeight {
		return true // no escapes, and only integers shorter than numeric's limit
	}
	for i := 0; i < len(r); i++ {
		switch c := r[i]; {
		case c == '"':
			for i++; r[i] != '"'; i++ {
				if r[i] != '\\' {
					continue
				}
				u := u4(r[i:min(i+6, len(r))])
				i++ // the escaped character, or the u of \uXXXX
				if u < 0 {
					continue
				}
				i += 4
				switch {
				case u >= 0xDC00 && u <= 0xDFFF:
					return false // a low surrogate without a high one
				case u >= 0xD800 && u <= 0xDBFF:
					if lo := u4(r[i+1 : min(i+7, len(r))]); lo < 0xDC00 || lo > 0xDFFF {
						return false
					}
					i += 6
				}
			}
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(r) && strings.IndexByte("0123456789.eE+-", r[j]) >= 0 {
				j++
			}
			d, ok := parseDecimal(r[i:j])
			if !ok {
				return false
			}
			if _, status := pgNumeric(r[i:j], d); status != numericAsWritten {
				return false
			}
			i = j - 1
		}
	}
	return true
}

// pgJSONValue returns v (decoded with json.Number numbers; unpaired
// surrogates already read as U+FFFD) with every number written so that
// PostgreSQL's numeric reads it. A number out of numeric's range makes ok
// false, or, with keep, becomes a string of its text.
func pgJSONValue(v any, keep bool) (any, bool) {
	switch v := v.(type) {
	case json.Number:
		d, ok := parseDecimal(string(v))
		if !ok {
			return v, false
		}
		text, status := pgNumeric(string(v), d)
		switch {
		case status != numericOutOfRange:
			return json.Number(text), true
		case keep:
			return string(v), true
		}
		return v, false
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			f, ok := pgJSONValue(e, keep)
			if !ok {
				return nil, false
			}
			out[i] = f
		}
		return out, true
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			f, ok := pgJSONValue(e, keep)
			if !ok {
				return nil, false
			}
			out[k] = f
		}
		return out, true
	}
	return v, true
}

// hasNUL reports whether a string or key anywhere in v holds U+0000.
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.IndexByte(v, 0) >= 0
	case []any:
		for _, e := range v {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.IndexByte(k, 0) >= 0 || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

// recordedJSON is a value as written, for the data-quality table's jsonb
// column, made storable: U+0000 (which jsonb cannot hold) and unpaired
// surrogates replaced by U+FFFD, numbers numeric cannot read as written in
// positional notation, and numbers out of its range as strings.
func recordedJSON(r rawJSON) string {
	nul := mayHoldNUL(r) && hasNUL(rawValue(r))
	if !nul && jsonAsWrittenOK(string(r)) {
		return string(r)
	}
	v, _ := pgJSONValue(replaceNUL(rawValue(r)), true)
	return jsonText(v)
}

func replaceNUL(v any) any {
	switch v := v.(type) {
	case string:
		return strings.ReplaceAll(v, "\x00", "\uFFFD")
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = replaceNUL(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[strings.ReplaceAll(k, "\x00", "\uFFFD")] = replaceNUL(e)
		}
		return out
	}
	return v
}

// decimal is a number in decimal notation: (-1 if neg) × digits × 10^exp,
// digits without leading zeros ("" for zero).
type decimal struct {
	neg    bool
	digits string
	exp    int
}

// maxExponent bounds the exponents read, so that "1e999999999" cannot make
// the coercions allocate: any larger exponent is out of range for every type.
const maxExponent = 1 << 20

// parseDecimal reads [+-]digits[.digits][(e|E)[+-]digits], the JSON number
// syntax with a leading '+', leading zeros and a bare '.' side allowed.
func parseDecimal(s string) (decimal, bool) {
	var d decimal
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		d.neg = s[i] == '-'
		i++
	}
	intStart := i
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	intPart, frac := s[intStart:i], ""
	if i < len(s) && s[i] == '.' {
		i++
		fracStart := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		frac = s[fracStart:i]
	}
	if len(intPart)+len(frac) == 0 {
		return decimal{}, false
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		neg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			neg = s[i] == '-'
			i++
		}
		start := i
		for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
			if exp < maxExponent {
				exp = exp*10 + int(s[i]-'0')
			}
		}
		if i == start {
			return decimal{}, false
		}
		if neg {
			exp = -exp
		}
	}
	if i != len(s) {
		return decimal{}, false
	}
	// Only a fraction costs a copy.
	d.digits = strings.TrimLeft(intPart, "0")
	if frac != "" {
		d.digits = strings.TrimLeft(intPart+frac, "0")
	}
	d.exp = exp - len(frac)
	if d.digits == "" {
		d.neg, d.exp = false, 0
	}
	return d, true
}

// normalized strips trailing zeros, so equal values have equal decimals.
func (d decimal) normalized() decimal {
	n := len(d.digits)
	for n > 0 && d.digits[n-1] == '0' {
		n--
	}
	d.exp += len(d.digits) - n
	d.digits = d.digits[:n]
	return d
}

// integer returns the decimal digits of d (with a leading '-') when d is an
// integer; ok is false when it has more than 19 digits (no int64 has).
func (d decimal) integer() (s string, integral, ok bool) {
	d = d.normalized()
	if d.digits == "" {
		return "0", true, true
	}
	if d.exp < 0 {
		return "", false, false
	}
	if len(d.digits)+d.exp > 19 {
		return "", true, false
	}
	s = d.digits + strings.Repeat("0", d.exp)
	if d.neg {
		s = "-" + s
	}
	return s, true, true
}

// intLen returns the number of digits of d before the point.
func (d decimal) intLen() int {
	if d.digits == "" {
		return 0
	}
	return len(d.digits) + d.exp
}

// shiftRound returns d × 10^shift rounded half away from zero to an int64,
// whether no non-zero digit was dropped, and false when it does not fit.
func (d decimal) shiftRound(shift int) (n int64, exact, ok bool) {
	if d.digits == "" {
		return 0, true, true
	}
	e := d.exp + shift
	var whole string
	exact, roundUp := true, false
	if e >= 0 {
		if len(d.digits)+e > 18 {
			return 0, false, false
		}
		whole = d.digits + strings.Repeat("0", e)
	} else {
		cut := len(d.digits) + e
		var dropped string
		if cut <= 0 {
			whole, dropped = "0", strings.Repeat("0", -cut)+d.digits
		} else {
			whole, dropped = d.digits[:cut], d.digits[cut:]
		}
		if len(whole) > 18 {
			return 0, false, false
		}
		roundUp = dropped[0] >= '5'
		exact = strings.Trim(dropped, "0") == ""
	}
	n, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, false, false
	}
	if roundUp {
		n++
	}
	if d.neg {
		n = -n
	}
	return n, exact, true
}

// Equal reports whether d and e are the same number.
func (d decimal) Equal(e decimal) bool {
	return d.normalized() == e.normalized()
}

// jsonEqual reports whether two values decoded with json.Number numbers are
// equal as JSON: numbers by value (1, 1.0 and 1e0 are equal), objects
// regardless of key order.
func jsonEqual(a, b any) bool {
	return deliver.EqualJSON(a, b, func(a, b json.Number) bool {
		da, oka := parseDecimal(string(a))
		db, okb := parseDecimal(string(b))
		return oka && okb && da.Equal(db)
	})
}
