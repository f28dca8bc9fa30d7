// Package docs_test checks the documentation against the repository: every
// relative link resolves to a file (and a heading, when it names one), and
// every metric the code emits and every alarm the stack creates is
// described in docs/observability.md. It needs no service.
package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, seen from this package.
var root = filepath.Join("..", "..")

// skipDirs are directories whose markdown is not the project's.
var skipDirs = map[string]bool{".git": true, ".local": true, "node_modules": true, "cdk.out": true, "build": true}

// markdownFiles lists the project's markdown files, relative to root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skipDirs[d.Name()] {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list markdown files: %v", err)
	}
	return files
}

var (
	fence   = regexp.MustCompile("(?ms)^```.*?^```")
	code    = regexp.MustCompile("`[^`\n]*`")
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)
)

// prose returns the markdown without its code blocks and code spans, where
// brackets are not links.
func prose(md string) string {
	return code.ReplaceAllString(fence.ReplaceAllString(md, ""), "``")
}

// anchors returns the anchors of a markdown file's headings, as GitHub
// makes them: lowercase, punctuation dropped, spaces turned into hyphens,
// a repeated one numbered.
func anchors(md string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(md, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t)
	if !slices.Contains(files, "README.md") {
		t.Fatalf("README.md not found among %v", files)
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile(filepath.Join(root, file))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range link.FindAllStringSubmatch(prose(string(b)), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				resolved := filepath.Join(root, file)
				if path != "" {
					resolved = filepath.Join(root, filepath.Dir(file), path)
				}
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("link %s: no file %s", target, resolved)
					continue
				}
				if anchor == "" {
					continue
				}
				md, err := os.ReadFile(resolved)
				if err != nil {
					t.Errorf("link %s: %v", target, err)
					continue
				}
				if !anchors(string(md))[anchor] {
					t.Errorf("link %s: %s has no heading #%s", target, resolved, anchor)
				}
			}
		})
	}
}

// observability is docs/observability.md.
func observability(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEveryMetricIsDescribed checks that each metric name of
// shared/metrics that the code emits is in docs/observability.md.
func TestEveryMetricIsDescribed(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(root, "shared", "metrics", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{} // constant -> metric name
	for _, m := range regexp.MustCompile(`(?m)^\s*([A-Z]\w*)\s*=\s*"(\w+)"`).FindAllStringSubmatch(string(src), -1) {
		names[m[1]] = m[2]
	}
	delete(names, "Namespace")
	if len(names) == 0 {
		t.Fatal("no metric names found in shared/metrics/metrics.go")
	}
	used := map[string]bool{}
	selector := regexp.MustCompile(`\bmetrics\.([A-Z]\w*)`)
	for _, dir := range []string{"shared", "infra", "functions", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && skipDirs[d.Name()] {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range selector.FindAllStringSubmatch(string(b), -1) {
				used[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	doc := observability(t)
	for constant, name := range names {
		if used[constant] && !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("metric %s (metrics.%s) is emitted but docs/observability.md does not describe it", name, constant)
		}
	}
}

// TestEveryAlarmIsDescribed checks that each alarm infra/alarms.go
// creates is in docs/observability.md.
func TestEveryAlarmIsDescribed(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join(root, "infra", "alarms.go"))
	if err != nil {
		t.Fatal(err)
	}
	suffixes := regexp.MustCompile(`"(-[a-z][a-z-]*)"`).FindAllStringSubmatch(string(src), -1)
	if len(suffixes) == 0 {
		t.Fatal("no alarm names found in infra/alarms.go")
	}
	doc := observability(t)
	for _, m := range suffixes {
		if !strings.Contains(doc, m[1]+"`") {
			t.Errorf("alarm P-<job>…%s is created by infra/alarms.go but docs/observability.md does not describe it", m[1])
		}
	}
}
