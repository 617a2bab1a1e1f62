package integration

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestPublicAPINamesNoInternalType: the packages under pkg/ are imported by
// other modules, which cannot name (nor build a value of) a type of this
// module's internal/ packages, so no exported function, method, type, field,
// variable or constant of pkg/... may have one in its type (issue 13: a
// public pkg/chaos.TakeSnapshot took an *internal/store.Store). The
// implementation may use internal packages. Checked on the packages' types
// (go/types, with the export data go list -export builds), through every
// exported declaration and the exported methods and fields of this
// module's own types it reaches. The provider SDK (pkg/provider) is held to
// it too: its session contract is declared in pkg/provider/contract, which
// internal/worker and internal/agent alias, and the module's own
// compositions build their hosts through internal/providerhost (issue 30,
// item 2).
func TestPublicAPINamesNoInternalType(t *testing.T) {
	const mod = "github.com/brood-dev/brood/"
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}\t{{.Dir}}\t{{.Standard}}", mod+"pkg/...").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports := map[string]string{}
	var public []string
	dirs := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 {
			continue
		}
		exports[f[0]] = f[1]
		if strings.HasPrefix(f[0], mod+"pkg/") {
			public = append(public, f[0])
			dirs[f[0]] = f[2]
		}
	}
	if len(public) == 0 {
		t.Fatal("go list found no package under pkg/")
	}
	sort.Strings(public)
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})
	for _, path := range public {
		files, err := parseDir(fset, dirs[path])
		if err != nil {
			t.Fatal(err)
		}
		pkg, err := (&types.Config{Importer: imp}).Check(path, fset, files, nil)
		if err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		w := apiWalker{mod: mod, seen: map[types.Type]bool{}}
		scope := pkg.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			w.walk(name, obj.Type())
		}
		for _, bad := range w.bad {
			t.Errorf("%s: %s", path, bad)
		}
	}
}

// parseDir parses the non-test Go files of dir that the default build
// includes.
func parseDir(fset *token.FileSet, dir string) ([]*ast.File, error) {
	out, err := exec.Command("go", "list", "-f", "{{join .GoFiles \"\\n\"}}", dir).Output()
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range strings.Fields(string(out)) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// apiWalker collects the places of a public API whose type names a type of
// an internal/ package of mod.
type apiWalker struct {
	mod  string
	seen map[types.Type]bool
	bad  []string
}

func (w *apiWalker) walk(where string, t types.Type) {
	if w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() == nil {
			return // error, comparable
		}
		path := obj.Pkg().Path()
		if strings.HasPrefix(path, w.mod) && strings.Contains(path+"/", "/internal/") {
			w.bad = append(w.bad, where+" names "+path+"."+obj.Name())
			return
		}
		if !strings.HasPrefix(path, w.mod) {
			return // another module's type: its API is its own
		}
		for i := 0; i < t.TypeArgs().Len(); i++ {
			w.walk(where, t.TypeArgs().At(i))
		}
		w.walk(where+" ("+obj.Name()+")", t.Underlying())
		for i := 0; i < t.NumMethods(); i++ {
			if m := t.Method(i); m.Exported() {
				w.walk(obj.Name()+"."+m.Name(), m.Type())
			}
		}
	case *types.Alias:
		w.walk(where, types.Unalias(t))
	case *types.Pointer:
		w.walk(where, t.Elem())
	case *types.Slice:
		w.walk(where, t.Elem())
	case *types.Array:
		w.walk(where, t.Elem())
	case *types.Map:
		w.walk(where, t.Key())
		w.walk(where, t.Elem())
	case *types.Chan:
		w.walk(where, t.Elem())
	case *types.Signature:
		if r := t.Recv(); r != nil {
			w.walk(where, r.Type())
		}
		for i := 0; i < t.Params().Len(); i++ {
			w.walk(where, t.Params().At(i).Type())
		}
		for i := 0; i < t.Results().Len(); i++ {
			w.walk(where, t.Results().At(i).Type())
		}
	case *types.Struct:
		for i := 0; i < t.NumFields(); i++ {
			if f := t.Field(i); f.Exported() || f.Embedded() {
				w.walk(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := 0; i < t.NumMethods(); i++ {
			w.walk(where+"."+t.Method(i).Name(), t.Method(i).Type())
		}
		for i := 0; i < t.NumEmbeddeds(); i++ {
			w.walk(where, t.EmbeddedType(i))
		}
	}
}
