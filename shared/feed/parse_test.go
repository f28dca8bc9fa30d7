package feed

import (
	"bytes"
)

// parseBulkMultipart reads a whole multipart _bulk_get answer.
func parseBulkMultipart(body []byte, boundary string) ([]bulkAnswer, error) {
	var out []bulkAnswer
	err := readBulkMultipart(bytes.NewReader(body), boundary, func(a bulkAnswer) error {
		out = append(out, a)
		return nil
	})
	return out, err
}

// parseBulkJSON reads a whole JSON _bulk_get answer.
func parseBulkJSON(body []byte) ([]bulkAnswer, error) {
	var out []bulkAnswer
	err := readBulkJSON(bytes.NewReader(body), func(a bulkAnswer) error {
		out = append(out, a)
		return nil
	})
	return out, err
}
