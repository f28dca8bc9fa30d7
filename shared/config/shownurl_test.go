package config

import (
	"strings"
	"testing"
)

// TestURLErrorsHideUserinfo: a source or output URL that is refused is
// quoted without anything that may be credentials, however malformed.
func TestURLErrorsHideUserinfo(t *testing.T) {
	t.Parallel()
	urls := []string{
		"http:/admin:pw-456@couch:5984/db",
		"ftp://admin:pw/456@couch:5984/db",
		"ftp://admin:pw-4?56@couch:5984/db",
		"ftp://admin:pw-4#56@couch:5984/db",
		"http:\\\\admin:pw-456@couch:5984/db",
		"admin:pw-456@couch:5984/db",
		"ftp://couch:5984/db?u=admin&pw=pw-456",
	}
	for _, u := range urls {
		t.Run(u, func(t *testing.T) {
			t.Parallel()
			for _, doc := range []string{
				`{"jobs":[{"id":"a","source":{"type":"couchdb","url":` + quoteJSON(u) + `},"outputs":[{"id":"s","type":"s3","s3":{}}]}]}`,
				httpJob(`{"url":` + quoteJSON(u) + `}`),
			} {
				_, err := Parse([]byte(doc))
				if err == nil {
					t.Fatal("Parse accepted it")
				}
				for _, secret := range []string{"admin", "pw-4", "pw/", "456", "56@"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("error shows %q:\n%v", secret, err)
					}
				}
			}
		})
	}
}

func quoteJSON(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
