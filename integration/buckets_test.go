package integration

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoBucketHandleOutsideTheStoreTyped: no non-test Go file of the module
// outside internal/store (and its sub-packages) uses jetstream.KeyValue or
// a store.Store's bucket fields (Agents, Hosts, Runs): every read, watch
// and write of a bucket is an operation of the store (issue 31, item 3;
// internal/store/buckets.go). Checked on the packages' types (go/types,
// with the export data go list -export builds), so a renamed or embedded
// store is caught too; internal/store's TestNoBucketHandleOutsideTheStore
// is the quick syntactic check of the same rule.
func TestNoBucketHandleOutsideTheStoreTyped(t *testing.T) {
	const mod = "github.com/brood-dev/brood"
	const storePkg, jsPkg = mod + "/internal/store", "github.com/nats-io/nats.go/jetstream"
	out, err := exec.Command("go", "list", "-export", "-deps", "-f",
		"{{.ImportPath}}\t{{.Export}}\t{{.Dir}}\t{{join .GoFiles \" \"}}", mod+"/...").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	type pkgInfo struct{ dir, files string }
	exports, pkgs := map[string]string{}, map[string]pkgInfo{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			continue
		}
		exports[f[0]] = f[1]
		if (f[0] == mod || strings.HasPrefix(f[0], mod+"/")) && f[0] != storePkg && !strings.HasPrefix(f[0], storePkg+"/") {
			pkgs[f[0]] = pkgInfo{f[2], f[3]}
		}
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages of the module outside the store", len(pkgs))
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	sp, err := imp.Import(storePkg)
	if err != nil {
		t.Fatal(err)
	}
	buckets := map[types.Object]bool{} // store.Store's bucket fields
	st := sp.Scope().Lookup("Store").Type().Underlying().(*types.Struct)
	for i := range st.NumFields() {
		if f := st.Field(i); f.Name() == "Agents" || f.Name() == "Hosts" || f.Name() == "Runs" {
			buckets[f] = true
		}
	}
	if len(buckets) != 3 {
		t.Fatalf("store.Store has %d of the bucket fields Agents, Hosts and Runs", len(buckets))
	}
	for path, p := range pkgs {
		var files []*ast.File
		for _, name := range strings.Fields(p.files) {
			f, err := parser.ParseFile(fset, filepath.Join(p.dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
		if _, err := (&types.Config{Importer: imp}).Check(path, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		for id, obj := range info.Uses {
			if obj.Pkg() == nil {
				continue
			}
			if tn, ok := obj.(*types.TypeName); ok && tn.Pkg().Path() == jsPkg && tn.Name() == "KeyValue" {
				t.Errorf("%s: uses jetstream.KeyValue; give internal/store an operation named for what it does", fset.Position(id.Pos()))
			}
		}
		for sel, s := range info.Selections {
			if buckets[s.Obj()] {
				t.Errorf("%s: reads the store's bucket field %s; give internal/store an operation named for what it does", fset.Position(sel.Pos()), s.Obj().Name())
			}
		}
	}
}
