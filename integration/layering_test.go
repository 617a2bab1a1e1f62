package integration

import (
	"go/ast"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The layering of the module (cmd → services → internal → pkg; issue 13),
// checked on what the go tool resolves: a leaf package's tests build no
// service and no worker host (the test harness that runs a deployment is
// internal/testutil/stack, apart from internal/testutil), pkg/client talks
// to Brood over the wire only (no internal/ package), pkg/protocol,
// the wire contract, stands on nothing of Brood's, the provider SDK's
// session contract (pkg/provider/contract) on nothing but pkg/protocol, and
// the coordinator
// settles runs and keeps ownership through the store's operations, not
// internal/worker.
func TestLayering(t *testing.T) {
	const mod = "github.com/brood-dev/brood/"
	for _, tc := range []struct {
		pkg       string
		test      bool // with its tests' dependencies
		forbidden []string
	}{
		{"internal/store", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"internal/agent", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"internal/model", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"internal/sessionlog", true, []string{"services/", "internal/worker", "internal/store", "internal/testutil"}},
		{"internal/rpc", true, []string{"services/", "internal/worker", "internal/testutil/stack"}},
		{"pkg/protocol", false, []string{"services/", "internal/"}},
		{"pkg/protocol", true, []string{"services/", "internal/worker", "internal/store", "internal/testutil/stack"}},
		{"internal/testutil", false, []string{"services/", "internal/worker"}},
		{"pkg/client", false, []string{"internal/", "services/"}},
		// The provider SDK's session contract, which the host framework
		// aliases, stands on the wire contract alone (issue 30, item 2).
		{"pkg/provider/contract", false, []string{"internal/", "services/", "pkg/client", "pkg/chaos", "pkg/provider/examples"}},
		// Settlement, ownership, leases and heartbeats are store operations:
		// the coordinator builds on no worker host; the checks of a start's
		// options (tool filter, persona, output schema) are pkg/protocol's,
		// so it builds on no agent runtime either (issue 30, item 1).
		// The coordinator's packages: the main one and its parts under it
		// (docs/architecture.md §6).
		{"services/coordinator/...", false, []string{"internal/worker", "internal/agent"}},
	} {
		args := []string{"list", "-deps"}
		if tc.test {
			args = append(args, "-test")
		}
		out, err := exec.Command("go", append(args, mod+tc.pkg)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", tc.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			rel, ok := strings.CutPrefix(dep, mod)
			if !ok || strings.HasPrefix(rel, strings.TrimSuffix(tc.pkg, "/...")) {
				continue
			}
			for _, f := range tc.forbidden {
				if strings.HasPrefix(rel, f) {
					t.Errorf("%s (tests: %v) depends on %s", tc.pkg, tc.test, rel)
				}
			}
		}
	}
}

// The in-repo providers reach the host framework only through the public
// provider SDK (pkg/provider; issue 30, item 2), as a third party would:
//   - neither their code nor their tests import internal/worker, and each
//     imports pkg/provider;
//   - they name the session contract (pkg/provider/contract) as pkg/provider
//     does, never through the internal packages that alias it for the
//     module's own use (agent.Outcome, worker.Session, store.ErrFenced);
//   - the module's door to the SDK's Host for what only the module holds
//     (its opened store, the agent runtime: internal/providerhost) hands out
//     pkg/provider's Host and nothing of the host framework: none of its
//     exported functions returns a type of internal/worker.
//
// Checked on the packages' types (go/types, with the export data go list
// -export builds).
func TestProvidersUseTheSDK(t *testing.T) {
	const mod = "github.com/brood-dev/brood/"
	providers := []string{"services/spawn-worker", "services/fork-worker", "services/acp-bridge"}
	for _, pkg := range providers {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, mod+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		imports := strings.Fields(string(out))
		if slices.Contains(imports, mod+"internal/worker") {
			t.Errorf("%s imports internal/worker directly", pkg)
		}
		if !slices.Contains(imports, mod+"pkg/provider") {
			t.Errorf("%s does not import pkg/provider", pkg)
		}
	}

	pkgs := typeCheck(t, mod, append(providers, "internal/providerhost", "pkg/provider/contract")...)
	contract := pkgs[mod+"pkg/provider/contract"].types
	if len(contract.Scope().Names()) == 0 {
		t.Fatal("pkg/provider/contract declares nothing")
	}
	for _, pkg := range providers {
		p := pkgs[mod+pkg]
		for id, obj := range p.info.Uses {
			from := obj.Pkg()
			if from == nil || !strings.HasPrefix(from.Path(), mod+"internal/") || obj.Parent() != from.Scope() {
				continue // not a package-level name of an internal package
			}
			if namesContract(obj, contract) {
				t.Errorf("%s: %s names the session contract's %s as %s.%s, not through pkg/provider",
					pkg, p.fset.Position(id.Pos()), obj.Name(), from.Name(), obj.Name())
			}
		}
	}
	ph := pkgs[mod+"internal/providerhost"].types.Scope()
	for _, name := range ph.Names() {
		fn, ok := ph.Lookup(name).(*types.Func)
		if !ok || !fn.Exported() {
			continue
		}
		res := fn.Type().(*types.Signature).Results()
		for i := 0; i < res.Len(); i++ {
			w := apiWalker{mod: mod, seen: map[types.Type]bool{}}
			w.walk(name, res.At(i).Type())
			for _, bad := range w.bad {
				if strings.Contains(bad, mod+"internal/worker.") {
					t.Errorf("internal/providerhost.%s hands out the host framework's type: %s", name, bad)
				}
			}
		}
	}
}

// namesContract reports whether obj, a package-level name of an internal
// package, is one of the contract's names under another package: an alias
// of one of its types, or a variable of the contract's name that the
// internal package declares equal to it (ErrLeaseLost, ErrFenced: matched
// by name, as their type is only error).
func namesContract(obj types.Object, contract *types.Package) bool {
	switch obj := obj.(type) {
	case *types.TypeName:
		n, ok := types.Unalias(obj.Type()).(*types.Named)
		return ok && obj.IsAlias() && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == contract.Path()
	case *types.Var:
		_, isVar := contract.Scope().Lookup(obj.Name()).(*types.Var)
		return isVar
	}
	return false
}

// checked is a package type-checked from its source (non-test files) and
// its dependencies' export data.
type checked struct {
	fset  *token.FileSet
	types *types.Package
	info  *types.Info
}

// typeCheck type-checks the packages rel (paths relative to mod).
func typeCheck(t *testing.T, mod string, rel ...string) map[string]checked {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}\t{{.Dir}}"}
	for _, r := range rel {
		args = append(args, mod+r)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports, dirs := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Split(line, "\t"); len(f) == 3 {
			exports[f[0]], dirs[f[0]] = f[1], f[2]
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	res := map[string]checked{}
	for _, r := range rel {
		path := mod + r
		files, err := parseDir(fset, dirs[path])
		if err != nil {
			t.Fatal(err)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
		pkg, err := (&types.Config{Importer: imp}).Check(path, fset, files, info)
		if err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		res[path] = checked{fset: fset, types: pkg, info: info}
	}
	return res
}
