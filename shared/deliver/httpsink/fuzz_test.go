package httpsink

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/changes-worker/changes-worker/shared/config"
	"github.com/changes-worker/changes-worker/shared/testenv"
)

// FuzzURL: for any template New accepts, any document id and any
// url_secret, the URL builds or, for an id made of dots only, is refused
// (ErrDotSegment); its escaped path has no "." or ".." segment
// (so it never holds "/../" nor ends in "/.."); the id adds no segment and
// reads back from its segment; errors name the template, not the URL.
func FuzzURL(f *testing.F) {
	templates := []string{"/docs/{doc_id}", "/{doc_id}", "/a/{doc_id}/b?id={doc_id}", "/hooks/{secret}/{doc_id}", "/x/{doc_id}.json?t={secret}", "/a%2F../{doc_id}"}
	for _, tmpl := range templates {
		for _, id := range testenv.HostileIDs() {
			f.Add(tmpl, id, "T0/B0")
		}
	}
	f.Add("/docs/{doc_id}", "..", "..")
	f.Add("/{secret}/{doc_id}", "a", "../x")
	f.Add("/{secret}/{doc_id}", "a", "%zz")
	f.Fuzz(func(t *testing.T, tmpl, id, secret string) {
		out := config.HTTPOutput{URL: "https://example.com" + tmpl}
		var creds Credentials
		if strings.Contains(tmpl, "{secret}") {
			out.URLSecret = &config.SecretRef{Env: "S"}
			creds.URLSecret = secret
		}
		s, err := New(out, creds, nil)
		if err != nil {
			if len(secret) >= 4 && strings.Contains(err.Error(), secret) && !strings.Contains(tmpl, secret) {
				t.Fatalf("New error shows the secret: %v", err)
			}
			return
		}
		u, err := s.URL(id)
		if errors.Is(err, ErrDotSegment) {
			if strings.Trim(id, ".") != "" {
				t.Fatalf("URL(%q) of %q: %v, but the id is not made of dots", id, tmpl, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("URL(%q) of accepted template %q: %v", id, tmpl, err)
		}
		p := u.EscapedPath()
		if strings.Contains(p+"/", "/../") || strings.Contains(p+"/", "/./") {
			t.Fatalf("URL(%q) of %q has a dot segment: %s", id, tmpl, p)
		}
		if p != u.RawPath && u.RawPath != "" {
			t.Fatalf("URL(%q): escaped path %s, raw path %s", id, p, u.RawPath)
		}
		tsegs, psegs := strings.Split(s.path, "/"), strings.Split(p, "/")
		if len(tsegs) != len(psegs) {
			t.Fatalf("URL(%q) of %q: path %s has %d segments, the template %d", id, tmpl, p, len(psegs), len(tsegs))
		}
		for i, ts := range tsegs {
			switch {
			case ts == "{doc_id}":
				if back, err := url.PathUnescape(psegs[i]); err != nil || back != id {
					t.Fatalf("URL(%q): id segment %s reads back as %q, %v", id, psegs[i], back, err)
				}
			case !strings.Contains(ts, "{doc_id}") && ts != psegs[i]:
				t.Fatalf("URL(%q): template segment %s became %s", id, ts, psegs[i])
			}
		}
		if want, _, _ := strings.Cut(out.URL, "?"); s.display != want && s.display != want+"/" {
			t.Fatalf("errors name %q, want the template without its query %q", s.display, want)
		}
	})
}
