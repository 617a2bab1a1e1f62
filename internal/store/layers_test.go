package store

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// plainLayer is a wrapper of a bucket, as a new one would be written: it
// has unwrap (kvWrapper) and none of the store's own methods of a bucket
// (no updateTTL, no leaderGet).
type plainLayer struct{ jetstream.KeyValue }

func (p plainLayer) unwrap() jetstream.KeyValue { return p.KeyValue }

// TestATTLdWriteReachesTheBucketThroughAnyWrapper: a settlement (UpdateTTL)
// through a wrapper that does not pass updateTTL on by hand (plainLayer)
// reaches the bucket under it with its TTL, wherever the wrapper sits among
// the store's own: over the bucket, over or under the fault seam (which
// still sees the write, as an OpKVUpdate with Write.TTL set), under the
// leader-read wrapper. Before, a wrapper without updateTTL failed every
// settlement through it ("the bucket is not a store's"), as leaderVia did
// before it was given a copy.
func TestATTLdWriteReachesTheBucketThroughAnyWrapper(t *testing.T) {
	st := provisioned(t, "layers")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var seen []Write
	faults := Faults{Before: func(_ context.Context, w Write) error {
		if w.Bucket == st.Runs.Bucket() {
			mu.Lock()
			seen = append(seen, w)
			mu.Unlock()
		}
		return nil
	}}
	plain := func(s *Store) *Store {
		c := *s
		c.Runs = plainLayer{c.Runs}
		return &c
	}
	leaderReads := func(s *Store) *Store {
		return s.WithLeaderReads([]string{"spawn"}, func(ctx context.Context, _, key string) ([]byte, uint64, bool, error) {
			return LeaderGet(ctx, st.Runs, key)
		})
	}
	cases := []struct {
		name string
		wrap func(*Store) *Store
		seam bool // the fault seam is among the layers: it sees the write
	}{
		{"over the bucket", plain, false},
		{"over the fault seam", func(s *Store) *Store { return plain(s.WithFaults(faults)) }, true},
		{"under the fault seam", func(s *Store) *Store { return plain(s).WithFaults(faults) }, true},
		{"under the leader reads, over the seam", func(s *Store) *Store { return leaderReads(plain(s.WithFaults(faults))) }, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mu.Lock()
			seen = nil
			mu.Unlock()
			rec := protocol.RunRecord{RunID: fmt.Sprintf("R%d", i), ChildID: "C", ParentSession: "P", Provider: "spawn",
				Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: 1}
			rev, err := st.CreateRun(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			won, err := c.wrap(st).SettleRun(ctx, Settled(rec, "spawn.H1", protocol.SubagentResult{StopReason: protocol.StopCompleted}), rev)
			if err != nil || !won {
				t.Fatalf("a settlement through the wrappers: won %v, %v", won, err)
			}
			key := RunStateKey(rec.Provider, rec.RunID)
			m, err := st.leaderLast(ctx, kvStreamPrefix+st.Runs.Bucket(), "$KV."+st.Runs.Bucket()+"."+key)
			var got protocol.RunRecord
			if err != nil || m.Sequence <= rev || protocol.Unmarshal(protocol.Msgpack, m.Data, &got) != nil || got.State != protocol.RunSettled {
				t.Fatalf("the state after the settlement: %+v, %v; want it settled after revision %d", m, err, rev)
			}
			if ttl := m.Header.Get(jetstream.MsgTTLHeader); ttl == "" {
				t.Fatalf("the settled state was written without a TTL (headers %v)", m.Header)
			}
			mu.Lock()
			defer mu.Unlock()
			if !c.seam {
				return
			}
			if len(seen) != 1 || seen[0].Op != OpKVUpdate || seen[0].Key != key || seen[0].Revision != rev || seen[0].TTL != st.RunsTTL() {
				t.Fatalf("the seam saw %+v; want one KV update of %s at revision %d with a TTL of %s", seen, key, rev, st.RunsTTL())
			}
		})
	}
}

// TestNoBucketHandleOutsideTheStore: no non-test Go file outside
// internal/store (and its sub-packages) names jetstream.KeyValue or reads a
// Store's bucket fields (Agents, Hosts, Runs): every read, watch and write
// of a bucket is an operation of this package (buckets.go; issue 31, item
// 3). The fields stay exported for the tests only. A file is parsed, not
// type-checked: a field is caught on an expression the package declares
// as a *store.Store (a field, parameter, result or variable of that type,
// or a variable given store.Open, Provision, Bind, BindLogs, WithFaults or
// WithLeaderReads), which is how every holder of one names it; an
// embedded or otherwise named store is caught by the type-checked twin,
// integration's TestNoBucketHandleOutsideTheStoreTyped.
func TestNoBucketHandleOutsideTheStore(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(root, "internal", "store")
	pkgs := map[string][]*ast.File{} // by directory
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path == own || (path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkgs[filepath.Dir(path)] = append(pkgs[filepath.Dir(path)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages under %s; the walk missed the repository", len(pkgs), root)
	}
	var found []string
	for _, files := range pkgs {
		found = append(found, bucketHandles(fset, files)...)
	}
	if len(found) > 0 {
		t.Fatalf("bucket handles outside internal/store (give the store an operation named for what it does; buckets.go):\n%s", strings.Join(found, "\n"))
	}
}

// bucketHandles lists the places files (one package's) name
// jetstream.KeyValue or a Store's bucket field (TestNoBucketHandleOutsideTheStore).
func bucketHandles(fset *token.FileSet, files []*ast.File) []string {
	const storePath, jsPath = `"github.com/brood-dev/brood/internal/store"`, `"github.com/nats-io/nats.go/jetstream"`
	local := func(f *ast.File, path, def string) string {
		for _, im := range f.Imports {
			if im.Path.Value == path {
				if im.Name != nil {
					return im.Name.Name
				}
				return def
			}
		}
		return ""
	}
	isPkgSel := func(e ast.Expr, pkg string, names ...string) bool {
		s, ok := e.(*ast.SelectorExpr)
		if !ok || pkg == "" {
			return false
		}
		x, ok := s.X.(*ast.Ident)
		return ok && x.Name == pkg && slices.Contains(names, s.Sel.Name)
	}
	isStoreType := func(e ast.Expr, pkg string) bool {
		if s, ok := e.(*ast.StarExpr); ok {
			e = s.X
		}
		return isPkgSel(e, pkg, "Store")
	}
	// Names of what holds a *store.Store, across the package's files.
	holders := map[string]bool{}
	for _, f := range files {
		pkg := local(f, storePath, "store")
		if pkg == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				if isStoreType(n.Type, pkg) {
					for _, id := range n.Names {
						holders[id.Name] = true
					}
				}
			case *ast.ValueSpec:
				if n.Type != nil && isStoreType(n.Type, pkg) {
					for _, id := range n.Names {
						holders[id.Name] = true
					}
				}
			case *ast.AssignStmt:
				if len(n.Rhs) != 1 {
					return true
				}
				c, ok := n.Rhs[0].(*ast.CallExpr)
				if !ok {
					return true
				}
				made := isPkgSel(c.Fun, pkg, "Open", "Provision", "Bind", "BindLogs")
				if s, ok := c.Fun.(*ast.SelectorExpr); ok && (s.Sel.Name == "WithFaults" || s.Sel.Name == "WithLeaderReads") {
					made = true
				}
				if id, ok := n.Lhs[0].(*ast.Ident); ok && made {
					holders[id.Name] = true
				}
			}
			return true
		})
	}
	var found []string
	for _, f := range files {
		js := local(f, jsPath, "jetstream")
		ast.Inspect(f, func(n ast.Node) bool {
			s, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch {
			case isPkgSel(s, js, "KeyValue"):
				found = append(found, fmt.Sprintf("%s: jetstream.KeyValue", fset.Position(s.Pos())))
			case slices.Contains([]string{"Agents", "Hosts", "Runs"}, s.Sel.Name):
				var holder string
				switch x := s.X.(type) {
				case *ast.Ident:
					holder = x.Name
				case *ast.SelectorExpr:
					holder = x.Sel.Name
				}
				if holders[holder] {
					found = append(found, fmt.Sprintf("%s: %s.%s, a store's bucket", fset.Position(s.Pos()), holder, s.Sel.Name))
				}
			}
			return true
		})
	}
	return found
}
