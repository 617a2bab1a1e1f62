package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// A citation of a section of the design document or the upstream study,
	// possibly broken across a comment line: "docs/design.md §7",
	// "docs/upstream-behaviour.md\n// §3.6".
	citation = regexp.MustCompile(`docs/(design|upstream-behaviour)\.md[\s/#*]*§\s?([0-9]+(?:\.[0-9]+)?)`)
	// A citation of those documents by their names outside the repository.
	outsideCitation = regexp.MustCompile(`(?:^|[^/\w.])(DESIGN\.md|DESIGN §|upstream-behaviour §|upstream §)`)
	sectionHeading  = regexp.MustCompile(`(?m)^#{2,3} ([0-9]+(?:\.[0-9]+)?)[. ]`)
)

// TestCitationsResolve: every "docs/design.md §N" and
// "docs/upstream-behaviour.md §N" citation in the repository's files names
// a section those documents have, and nothing cites the design document or
// the upstream study by a name outside the repository (issue 30, item 3).
func TestCitationsResolve(t *testing.T) {
	rootOut, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	root := strings.TrimSpace(string(rootOut))
	sections := map[string]map[string]bool{}
	for _, doc := range []string{"design", "upstream-behaviour"} {
		text, err := os.ReadFile(filepath.Join(root, "docs", doc+".md"))
		if err != nil {
			t.Fatal(err)
		}
		sections[doc] = map[string]bool{}
		for _, m := range sectionHeading.FindAllStringSubmatch(string(text), -1) {
			sections[doc][m[1]] = true
		}
	}
	files, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Fatal(err)
	}
	cited := 0
	for _, f := range strings.Fields(string(files)) {
		if f == "docs/design.md" || f == "docs/upstream-behaviour.md" || f == "integration/citations_test.go" ||
			strings.Contains(f, "node_modules/") || strings.Contains(f, "/testdata/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue // listed but absent in the work tree
		}
		text := string(data)
		for _, m := range citation.FindAllStringSubmatch(text, -1) {
			cited++
			if !sections[m[1]][m[2]] {
				t.Errorf("%s cites docs/%s.md §%s, which has no such section", f, m[1], m[2])
			}
		}
		for _, m := range outsideCitation.FindAllStringSubmatch(text, -1) {
			t.Errorf("%s cites %q: name docs/design.md or docs/upstream-behaviour.md", f, m[1])
		}
	}
	if cited < 200 {
		t.Fatalf("found only %d citations: the pattern no longer matches them", cited)
	}
}
