package coordinator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The coordinator's parts stay small enough to read (issue 30; the rooms
// are docs/architecture.md §6): no file of the coordinator's packages (this
// one and those under it; tests aside) over fileLinesMax lines, no function
// over funcLinesMax lines (from its func keyword to its closing brace), and
// no function of the takeover and the settlement (settlementFiles) over
// settlementComplexityMax, counted as gocyclo v0.6.0 counts (1, plus one
// per if, for, range, non-default case and comm clause, && and ||).
const (
	fileLinesMax            = 600
	funcLinesMax            = 80
	settlementComplexityMax = 15
)

// settlementFiles hold the takeover of a dead host's sessions and the
// settlement of the runs left behind (docs/architecture.md §6, liveness).
var settlementFiles = []string{"takeover.go", "orphans.go"}

// coordinatorSources parses every non-test Go file of the coordinator's
// packages, by path relative to this directory.
func coordinatorSources(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), "_") || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir // what go build ignores
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files[path] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no source files found")
	}
	return fset, files
}

func TestLayoutFileAndFunctionSizes(t *testing.T) {
	fset, files := coordinatorSources(t)
	for path, f := range files {
		if n := fset.File(f.Pos()).LineCount(); n > fileLinesMax {
			t.Errorf("%s has %d lines; a part of the coordinator has at most %d (split it by what it holds)", path, n, fileLinesMax)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > funcLinesMax {
				t.Errorf("%s: %s has %d lines; at most %d", path, funcName(fn), n, funcLinesMax)
			}
		}
	}
}

func TestLayoutSettlementComplexity(t *testing.T) {
	_, files := coordinatorSources(t)
	for _, name := range settlementFiles {
		f, ok := files[name]
		if !ok {
			t.Errorf("%s is gone: name the files of the takeover and the settlement in settlementFiles", name)
			continue
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok {
				if n := cyclomatic(fn); n > settlementComplexityMax {
					t.Errorf("%s: %s has cyclomatic complexity %d; at most %d", name, funcName(fn), n, settlementComplexityMax)
				}
			}
		}
	}
}

// TestLayoutCountsAsGocyclo pins the counting rules on small functions, so
// the limits above mean what gocyclo prints.
func TestLayoutCountsAsGocyclo(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want int
	}{
		{"straight", `func f() { g() }`, 1},
		{"if and else if", `func f(a, b bool) { if a { } else if b { } }`, 3},
		{"for and range", `func f(s []int) { for { break }; for range s { } }`, 3},
		{"switch without default", `func f(a int) { switch a { case 1: case 2, 3: default: } }`, 3},
		{"select", `func f(c chan int) { select { case <-c: default: } }`, 2},
		{"boolean operators", `func f(a, b, c bool) bool { return a && b || c }`, 3},
		{"closure counts", `func f(a bool) { g := func() { if a { } }; g() }`, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parser.ParseFile(token.NewFileSet(), "x.go", "package x\n"+tt.src, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := cyclomatic(f.Decls[0].(*ast.FuncDecl)); got != tt.want {
				t.Errorf("cyclomatic = %d, want %d", got, tt.want)
			}
		})
	}
}

// cyclomatic is fn's cyclomatic complexity as github.com/fzipp/gocyclo
// v0.6.0 counts it.
func cyclomatic(fn *ast.FuncDecl) int {
	n := 1
	ast.Inspect(fn, func(node ast.Node) bool {
		switch node := node.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			n++
		case *ast.CaseClause:
			if node.List != nil {
				n++
			}
		case *ast.CommClause:
			if node.Comm != nil {
				n++
			}
		case *ast.BinaryExpr:
			if node.Op == token.LAND || node.Op == token.LOR {
				n++
			}
		}
		return true
	})
	return n
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
