package s3sink

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/changes-worker/changes-worker/shared/deliver"
)

// CompareContent compares each document's object with the document's
// source body, and returns, for each document that differs, what differs
// (never the values).
//
// The sink writes the body exactly as the change carries it, so the usual
// answer costs no transfer: one GET with If-None-Match set to the body's MD5,
// which S3 answers 304 Not Modified when the object's ETag (the MD5 of a
// single-part upload, as the sink writes) is that MD5. Otherwise the object
// is read and compared with the source body as JSON (objects as sets of
// members, numbers by value), since the source may send one revision with
// other spacing or member order through another request. At most
// Parallelism objects are read at once.
//
// CompareContent only reads, and is safe for concurrent use.
func (s *State) CompareContent(ctx context.Context, docs []deliver.SourceDoc) (map[string]string, error) {
	g, gctx := s.group(ctx)
	var mu sync.Mutex
	differs := map[string]string{}
	for _, d := range docs {
		g.Go(func() error {
			why, err := s.compareOne(gctx, d)
			if err != nil || why == "" {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			differs[d.ID] = why
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return differs, nil
}

// compareOne returns what differs between d's object and its source body,
// "" when nothing does.
func (s *State) compareOne(ctx context.Context, d deliver.SourceDoc) (string, error) {
	key := s.Key(d.ID)
	sum := md5.Sum(d.Body)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key), IfNoneMatch: aws.String(`"` + hex.EncodeToString(sum[:]) + `"`),
	})
	if err != nil {
		var nsk *types.NoSuchKey
		switch {
		case httpStatus(err) == 304:
			return "", nil
		case errors.As(err, &nsk) || httpStatus(err) == 404:
			return "no object", nil
		}
		return "", fmt.Errorf("get object %s: %w", key, err)
	}
	defer out.Body.Close()
	stored, err := io.ReadAll(out.Body)
	if err != nil {
		return "", fmt.Errorf("read object %s: %w", key, err)
	}
	if bytes.Equal(stored, d.Body) {
		return "", nil // an ETag that is not an MD5 (SSE-KMS, multipart)
	}
	same, err := sameJSON(stored, d.Body)
	if err != nil {
		return "", fmt.Errorf("compare object %s: %w", key, err)
	}
	if !same {
		return "the stored object differs from the source's body", nil
	}
	return "", nil
}

// sameJSON reports whether a (the stored object) and b (the source body)
// are the same JSON value: objects with the same members (the last of
// duplicate names counting, as decoders keep it), arrays with the same
// elements in order, numbers equal in value. A stored object that is not
// JSON differs; a source body that is not JSON is an error.
func sameJSON(a, b []byte) (bool, error) {
	vb, err := decodeJSON(b)
	if err != nil {
		return false, fmt.Errorf("decode source body: %w", err)
	}
	va, err := decodeJSON(a)
	if err != nil {
		return false, nil
	}
	return equalJSON(va, vb), nil
}

func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

func equalJSON(a, b any) bool {
	return deliver.EqualJSON(a, b, func(a, b json.Number) bool {
		return canonicalNumber(string(a)) == canonicalNumber(string(b))
	})
}

// canonicalNumber writes a JSON number so that numbers of equal value are
// written alike: sign, significant digits without leading or trailing
// zeros, and the decimal exponent ("-125e-2" for -1.250). Its cost is
// linear in the literal, whatever the exponent.
func canonicalNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expPart, hasExp := strings.Cut(strings.ToLower(s), "e")
	exp := int64(0)
	if hasExp {
		e, err := strconv.ParseInt(expPart, 10, 64)
		if err != nil {
			return s // an exponent beyond int64: compare as written
		}
		exp = e
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := whole + frac
	exp -= int64(len(frac))
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + trimmed + "e" + strconv.FormatInt(exp, 10)
}
