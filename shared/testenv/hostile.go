package testenv

import "strings"

// HostileIDs returns document ids that break URL paths, S3 keys and parsers
// that are not careful: dot segments and escapes that decode to them, path
// traversal, both Unicode normalisation forms of one accented id (NFC
// "café", NFD "cafe" + U+0301), U+0000, invalid UTF-8 and a 5,000-character
// id. Fuzz targets seed their corpora with them, so their seeds run as
// ordinary tests.
func HostileIDs() []string {
	return []string{
		"..", ".", "...", "%2e%2e/", "%2E%2E%2F", "a/../../b", "../../etc/passwd", "./a", "a/.", "a/..",
		"/leading", "trailing/", "a//b", "_design/..", "_local/.", "_tombstones/x",
		"caf\u00e9", "cafe\u0301",
		"\u0000", "a\u0000b", "\xff\xfe", "tab\tnl\n", "+ ?#%&=;", `back\slash`, "\u202egnp.exe",
		strings.Repeat("x", 5000), strings.Repeat("é", 2500),
	}
}
