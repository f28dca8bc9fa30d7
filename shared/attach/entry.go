package attach

import (
	"crypto/md5"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"mime"
	"strings"
)

// digests are the digest algorithms an entry may name, with their hash and
// its size: CouchDB and pouchdb-server write md5, Sync Gateway sha1.
var digests = map[string]struct {
	newHash func() hash.Hash
	size    int
}{
	"md5":  {md5.New, md5.Size},
	"sha1": {sha1.New, sha1.Size},
}

// parseEntry reads one _attachments entry. An error says what makes the
// entry impossible to copy: a field of the wrong type, a negative length,
// data that is not base64, or a digest that is not "md5-" or "sha1-"
// followed by the base64 of a sum of that algorithm's size (the digest
// becomes part of the object key, and the bytes are checked against it). A
// content_type that is not a media type is dropped, not an error: the
// object then has none.
func parseEntry(id, rev, name string, e map[string]json.RawMessage) (*attachment, error) {
	a := &attachment{docID: id, rev: rev, name: name, length: -1}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("attachment %q of %q rev %s: %s", name, id, rev, fmt.Sprintf(format, args...))
	}
	str := func(field string) (string, error) {
		raw, ok := e[field]
		if !ok || string(raw) == "null" {
			return "", nil
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return "", bad("%s is not a string", field)
		}
		return v, nil
	}
	ct, err := str("content_type")
	if err != nil {
		return nil, err
	}
	a.contentType = mediaType(ct)
	if a.digest, err = str("digest"); err != nil {
		return nil, err
	}
	if raw, ok := e["length"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &a.length); err != nil || a.length < 0 {
			return nil, bad("length %s is not a length", truncate(raw))
		}
	}
	data, err := str("data")
	if err != nil {
		return nil, err
	}
	if data != "" {
		if a.data, err = base64.StdEncoding.DecodeString(data); err != nil {
			return nil, bad("data is not base64")
		}
		if a.length < 0 {
			a.length = int64(len(a.data))
		}
	}
	algo, b64, _ := strings.Cut(a.digest, "-")
	d, known := digests[algo]
	sum, err := base64.StdEncoding.DecodeString(b64)
	if !known || err != nil || len(sum) != d.size {
		return nil, bad("digest %q is not md5-<base64 of 16 bytes> or sha1-<base64 of 20 bytes>", truncate([]byte(a.digest)))
	}
	a.algo, a.sum = algo, sum
	a.keyDigest = algo + "-" + hex.EncodeToString(sum)
	return a, nil
}

// mediaType returns ct when it is a media type S3 can be given as a
// Content-Type header (RFC 2045 syntax, printable ASCII), else "".
func mediaType(ct string) string {
	for i := 0; i < len(ct); i++ {
		if c := ct[i]; c < 0x20 || c > 0x7e {
			return ""
		}
	}
	if _, _, err := mime.ParseMediaType(ct); err != nil {
		return ""
	}
	return ct
}

// truncate shortens what an error quotes from the entry.
func truncate(b []byte) string {
	const max = 100
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
