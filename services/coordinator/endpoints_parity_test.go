package coordinator

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The lists of coordinator endpoints that must not drift (issue 30, item 4):
// what the coordinator serves, what the Go client (pkg/client) and the
// TypeScript client (clients/typescript) call, and the endpoint sections of
// docs/protocol.md §5.
const (
	listCoordinator = "the coordinator (endpoints())"
	listGoClient    = "the Go client (pkg/client)"
	listTSClient    = "the TypeScript client (clients/typescript/src)"
	listDoc         = "docs/protocol.md §5"
)

// endpointListExclusions are the endpoints one list may lack on purpose,
// each with its reason. None today: every endpoint the coordinator serves
// is documented and has a method in both clients.
var endpointListExclusions = map[string]map[string]string{
	// listTSClient: {"some.endpoint": "why the TypeScript client has no method for it"},
}

// TestEndpointListsAgree fails when one list gains an endpoint another
// lacks, unless endpointListExclusions says why.
func TestEndpointListsAgree(t *testing.T) {
	root := filepath.Join("..", "..")
	lists := map[string][]string{listCoordinator: nil}
	for _, e := range (&Coordinator{}).endpoints() {
		lists[listCoordinator] = append(lists[listCoordinator], e.subject)
	}
	var err error
	if lists[listGoClient], err = goClientEndpoints(root); err != nil {
		t.Fatal(err)
	}
	if lists[listTSClient], err = tsClientEndpoints(root); err != nil {
		t.Fatal(err)
	}
	if lists[listDoc], err = docEndpoints(root); err != nil {
		t.Fatal(err)
	}
	for name, l := range lists {
		if len(l) < 20 {
			t.Fatalf("%s lists only %d endpoints (%v): the parser no longer finds them", name, len(l), l)
		}
	}
	for _, d := range endpointListDifferences(lists, endpointListExclusions) {
		t.Error(d)
	}
}

// endpointListDifferences names every endpoint some list has and another
// lacks without an exclusion, and every exclusion no longer needed.
func endpointListDifferences(lists map[string][]string, exclusions map[string]map[string]string) []string {
	all := map[string]bool{}
	for _, l := range lists {
		for _, e := range l {
			all[e] = true
		}
	}
	names := make([]string, 0, len(lists))
	for n := range lists {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		for e := range all {
			has, excused := slices.Contains(lists[n], e), exclusions[n][e] != ""
			switch {
			case !has && !excused:
				out = append(out, fmt.Sprintf("%s lacks %s, which %s", n, e, holders(lists, e)))
			case has && excused:
				out = append(out, fmt.Sprintf("%s has %s now: remove its exclusion", n, e))
			}
		}
	}
	sort.Strings(out)
	return out
}

func holders(lists map[string][]string, e string) string {
	var hs []string
	for n, l := range lists {
		if slices.Contains(l, e) {
			hs = append(hs, n)
		}
	}
	sort.Strings(hs)
	return strings.Join(hs, " and ") + " list"
}

func TestEndpointListDifferences(t *testing.T) {
	three := []string{"a.x", "b.y", "c.z"}
	for _, tt := range []struct {
		name       string
		lists      map[string][]string
		exclusions map[string]map[string]string
		want       []string
	}{
		{"equal", map[string][]string{"go": three, "ts": three}, nil, nil},
		{"one gains an endpoint", map[string][]string{"go": append(slices.Clone(three), "d.w"), "ts": three}, nil,
			[]string{"ts lacks d.w, which go list"}},
		{"excused", map[string][]string{"go": append(slices.Clone(three), "d.w"), "ts": three},
			map[string]map[string]string{"ts": {"d.w": "internal"}}, nil},
		{"stale exclusion", map[string][]string{"go": three, "ts": three},
			map[string]map[string]string{"ts": {"a.x": "gone"}}, []string{"ts has a.x now: remove its exclusion"}},
	} {
		if got := endpointListDifferences(tt.lists, tt.exclusions); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// goClientEndpoints returns the endpoints pkg/client's code names
// (protocol.Ep… constants, resolved from pkg/protocol's declarations).
func goClientEndpoints(root string) ([]string, error) {
	values := map[string]string{}
	if err := eachGoFile(filepath.Join(root, "pkg", "protocol"), func(f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Ep") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					values[name.Name], _ = strconv.Unquote(lit.Value)
				}
			}
			return true
		})
	}); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	err := eachGoFile(filepath.Join(root, "pkg", "client"), func(f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "protocol" {
				if v, ok := values[sel.Sel.Name]; ok && !seen[v] {
					seen[v] = true
					out = append(out, v)
				}
			}
			return true
		})
	})
	return out, err
}

// eachGoFile parses every non-test Go file of dir.
func eachGoFile(dir string, fn func(*ast.File)) error {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		fn(f)
	}
	return nil
}

var (
	tsEndpointsBlock = regexp.MustCompile(`(?s)export const Endpoints = \{(.*?)\} as const;`)
	tsEndpointEntry  = regexp.MustCompile(`(\w+):\s*"([a-z]+\.[a-z]+)"`)
	tsEndpointUse    = regexp.MustCompile(`Endpoints\.(\w+)`)
)

// tsClientEndpoints returns the endpoints the TypeScript client's code
// calls: the Endpoints entries (src/protocol.ts) some other source file
// uses. An entry no method uses is not a method of the client.
func tsClientEndpoints(root string) ([]string, error) {
	src := filepath.Join(root, "clients", "typescript", "src")
	proto, err := os.ReadFile(filepath.Join(src, "protocol.ts"))
	if err != nil {
		return nil, err
	}
	block := tsEndpointsBlock.FindSubmatch(proto)
	if block == nil {
		return nil, fmt.Errorf("no `export const Endpoints = {…} as const;` in %s", filepath.Join(src, "protocol.ts"))
	}
	values := map[string]string{}
	for _, m := range tsEndpointEntry.FindAllSubmatch(block[1], -1) {
		values[string(m[1])] = string(m[2])
	}
	files, err := filepath.Glob(filepath.Join(src, "*.ts"))
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		if filepath.Base(f) == "protocol.ts" {
			continue
		}
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range tsEndpointUse.FindAllSubmatch(text, -1) {
			if v, ok := values[string(m[1])]; ok && !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	return out, nil
}

var (
	docSection5 = regexp.MustCompile(`(?s)\n## 5\. [^\n]*\n(.*?)\n## 6\. `)
	docHeading  = regexp.MustCompile("(?m)^### 5\\.[0-9a-z]+ (.*)$")
	docEndpoint = regexp.MustCompile("`([a-z]+\\.[a-z]+)`")
)

// docEndpoints returns the endpoints docs/protocol.md §5 has a section for
// (the backquoted names in its ### headings).
func docEndpoints(root string) ([]string, error) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "protocol.md"))
	if err != nil {
		return nil, err
	}
	sec := docSection5.FindSubmatch(doc)
	if sec == nil {
		return nil, fmt.Errorf("docs/protocol.md has no section 5 followed by a section 6")
	}
	var out []string
	for _, h := range docHeading.FindAllSubmatch(sec[1], -1) {
		for _, m := range docEndpoint.FindAllSubmatch(h[1], -1) {
			out = append(out, string(m[1]))
		}
	}
	return out, nil
}
