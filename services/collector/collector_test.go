package collector_test

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/collector"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tree is what the test checks of one root's tree: its sessions (the root
// first) with their scopes.
type tree struct {
	name     string
	root     *client.Root
	sessions []store.TreeSession
}

// kept reports whether every record of t is still there: each header, each
// non-empty log, the root's child index.
func (tr tree) state(ctx context.Context, t *testing.T, st *store.Store) (headers, logs, children int) {
	t.Helper()
	for _, n := range tr.sessions {
		if _, err := st.GetHeader(ctx, n.ID); err == nil {
			headers++
		} else if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: header of %s: %v", tr.name, n.ID, err)
		}
		l, err := st.ReadLog(ctx, n.Scope, n.ID)
		if err != nil {
			t.Fatalf("%s: log of %s: %v", tr.name, n.ID, err)
		}
		if len(l.Events) > 0 {
			logs++
		}
	}
	idx, err := st.ChildIndex(ctx, tr.sessions[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return headers, logs, len(idx)
}

// TestClosedRootsAreCollectedAfterTheirRetention: a closed root's tree (its
// header, log and child index, its children's headers and logs, its
// closed marker) is removed once it has been idle for the retention, and
// not before; an open root's tree, a closed root with a pending inbox item
// and a closed root with a live child are kept (issue 17: 3,000 agents.open
// never closed were kept forever; nothing accepted may be lost). The
// pending root goes once its item is gone.
func TestClosedRootsAreCollectedAfterTheirRetention(t *testing.T) {
	const retention = time.Hour
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Each root's log gets a turn, as a trusted host's root writes it.
	rootTurn := func(r *client.Root) {
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Store.NewLogWriter(protocol.ScopeRoot, r.Ref().SessionID, 0, 0).Append(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	withChild := func(name string) tree {
		r := s.Root()
		rootTurn(r)
		run, _, err := s.Run(r.Ref(), "spawn", "say ok", protocol.StartOptions{})
		if err != nil {
			t.Fatalf("%s: run: %v", name, err)
		}
		testutil.Eventually(t, 30*time.Second, func() bool {
			_, err := s.Store.LeaseLatest(ctx, run.ChildID)
			return errors.Is(err, store.ErrNotFound)
		}, "%s: the child's lease released", name)
		return tree{name, r, []store.TreeSession{{ID: r.Ref().SessionID, Scope: protocol.ScopeRoot}, {ID: run.ChildID, Scope: "spawn"}}}
	}
	closed, open, pending, recent := withChild("closed"), withChild("open"), withChild("pending"), withChild("written since")
	live := s.Root()
	rootTurn(live)
	started, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: live.Ref(), Label: "slow", Prompt: protocol.Text("sleep 60s\nsay late")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := s.Store.LeaseLatest(ctx, started.ChildID)
		return err == nil
	}, "the continuable child's lease")
	liveTree := tree{"live child", live, []store.TreeSession{{ID: live.Ref().SessionID, Scope: protocol.ScopeRoot}, {ID: started.ChildID, Scope: "spawn"}}}
	for _, tr := range []tree{closed, pending, liveTree, recent} {
		if err := tr.root.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A tree closed long ago but written since (a continuable child's
	// followup) is kept while its last write is within the retention.
	if err := s.Store.PutClosedRoot(ctx, recent.sessions[0].ID, time.Now().Add(-2*retention).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	item := protocol.InboxItem{Content: protocol.Text("still to read")}
	if _, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, pending.sessions[0].ID), pending.sessions[0].ID, item, ""); err != nil {
		t.Fatal(err)
	}

	var skew atomic.Int64 // how far the collector's clock runs ahead
	c, err := collector.New(collector.Config{Store: s.Store, Retention: retention, Logger: testutil.Logger(t),
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	all := []tree{closed, open, pending, liveTree, recent}
	check := func(when string, gone ...tree) {
		t.Helper()
		for _, tr := range all {
			h, l, idx := tr.state(ctx, t, s.Store)
			_, merr := store.Get[protocol.ClosedRootRecord](ctx, s.Store.Agents, store.ClosedRootKey(tr.sessions[0].ID))
			marked := merr == nil
			wantGone := false
			for _, g := range gone {
				wantGone = wantGone || g.name == tr.name
			}
			switch {
			case wantGone && (h != 0 || l != 0 || idx != 0 || marked):
				t.Errorf("%s: %s: %d headers, %d logs, %d children indexed, marker %v left; want none", when, tr.name, h, l, idx, marked)
			case !wantGone && (h != 2 || l != 2 || idx != 1):
				t.Errorf("%s: %s: %d headers, %d logs, %d children indexed; want 2, 2, 1", when, tr.name, h, l, idx)
			case !wantGone && tr.name != "open" && !marked:
				t.Errorf("%s: %s: its closed marker is gone", when, tr.name)
			}
		}
	}

	st, err := c.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Collected != 0 || st.Examined != 1 {
		t.Fatalf("a sweep within the retention: %+v, want the tree written since examined, none collected", st)
	}
	check("within the retention")

	skew.Store(int64(retention + time.Minute))
	if st, err = c.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if st.Collected != 2 || st.Sessions != 4 || st.Kept != 2 {
		t.Errorf("the sweep after the retention: %+v, want 2 roots of 2 sessions each collected, 2 kept", st)
	}
	check("after the retention", closed, recent)

	// The pending item claimed (removed), its root goes at the next sweep.
	page, _, err := s.Store.ReadInboxPage(ctx, testutil.ScopeOf(t, s.Store, pending.sessions[0].ID), pending.sessions[0].ID, 0, 10, 1<<20)
	if err != nil || len(page) != 1 {
		t.Fatalf("the pending item: %v %v", page, err)
	}
	if _, err := s.Store.RemoveInboxItems(ctx, testutil.ScopeOf(t, s.Store, pending.sessions[0].ID), pending.sessions[0].ID, []protocol.Seq{page[0].Seq}); err != nil {
		t.Fatal(err)
	}
	if st, err = c.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if st.Collected != 1 || st.Kept != 1 {
		t.Errorf("the sweep after the item went: %+v, want 1 collected, 1 kept", st)
	}
	check("after the pending item went", closed, recent, pending)
}

// TestATreeWrittenToWhileCollectedIsKept: a message accepted into a tree
// after the collector's first reads (here: once its headers are removed)
// keeps the tree: its headers are put back as they were, and its logs,
// child index and marker stay (nothing accepted is lost).
func TestATreeWrittenToWhileCollectedIsKept(t *testing.T) {
	const retention = time.Hour
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := s.Root()
	run, _, err := s.Run(r.Ref(), "spawn", "say ok", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := s.Store.LeaseLatest(ctx, run.ChildID)
		return errors.Is(err, store.ErrNotFound)
	}, "the child's lease released")
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	root := r.Ref().SessionID
	headers := map[string]protocol.SessionHeader{}
	for _, id := range []string{root, run.ChildID} {
		h, err := s.Store.GetHeader(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		headers[id] = h
	}
	c, err := collector.New(collector.Config{Store: s.Store, Retention: retention, Logger: testutil.Logger(t),
		Now: func() time.Time { return time.Now().Add(2 * retention) }})
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	collector.OnHeadersRemoved(c, func(string) {
		removed++
		for id := range headers {
			if _, err := s.Store.GetHeader(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("the header of %s once the tree's headers were removed: %v", id, err)
			}
		}
		item := protocol.InboxItem{Content: protocol.Text("accepted meanwhile")}
		if _, _, err := s.Store.Enqueue(ctx, protocol.ScopeRoot, root, item, ""); err != nil {
			t.Error(err)
		}
	})
	st, err := c.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if removed != 1 || st.Collected != 0 || st.Kept != 1 {
		t.Fatalf("sweep: %+v, headers removed %d times; want the tree examined once and kept", st, removed)
	}
	tr := tree{"written meanwhile", r, []store.TreeSession{{ID: root, Scope: protocol.ScopeRoot}, {ID: run.ChildID, Scope: "spawn"}}}
	if h, l, idx := tr.state(ctx, t, s.Store); h != 2 || l != 1 || idx != 1 {
		t.Fatalf("the tree after the stopped collection: %d headers, %d logs, %d children indexed; want 2, 1, 1", h, l, idx)
	}
	for id, want := range headers {
		if got, err := s.Store.GetHeader(ctx, id); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("the header of %s put back: %+v, %v; want %+v", id, got, err, want)
		}
	}
	if _, err := store.Get[protocol.ClosedRootRecord](ctx, s.Store.Agents, store.ClosedRootKey(root)); err != nil {
		t.Errorf("the closed marker of the kept tree: %v", err)
	}
}

// TestBudgetLedgersAreCollectedWithTheirTree (issue 32): the ledgers of a
// closed root's tree — the root's budget and a child's own — are deleted
// with the tree's other records once it is idle for the retention; the
// ledger of an open root's tree is kept.
func TestBudgetLedgersAreCollectedWithTheirTree(t *testing.T) {
	const retention = time.Hour
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	budgeted := func() (*client.Root, string) {
		r, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{Tokens: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Store.NewLogWriter(protocol.ScopeRoot, r.SessionID, 0, 0).Append(ctx, ev); err != nil {
			t.Fatal(err)
		}
		run, _, err := s.Run(r.Ref(), "spawn", "say ok", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 100}})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, func() bool {
			_, err := s.Store.LeaseLatest(ctx, run.ChildID)
			return errors.Is(err, store.ErrNotFound)
		}, "the child's lease released")
		return r, run.ChildID
	}
	closedRoot, closedChild := budgeted()
	openRoot, openChild := budgeted()
	t.Cleanup(func() { _ = openRoot.Close(context.Background()) })
	if err := closedRoot.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ledgers := func() map[string]bool {
		kept := map[string]bool{}
		for _, id := range []string{closedRoot.SessionID, closedChild, openRoot.SessionID, openChild} {
			_, err := s.Store.Budget(ctx, id)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the ledger of %s: %v", id, err)
			}
			kept[id] = err == nil
		}
		return kept
	}
	if k := ledgers(); !k[closedRoot.SessionID] || !k[closedChild] {
		t.Fatalf("ledgers before the collection %v: every one should exist", k)
	}
	c, err := collector.New(collector.Config{Store: s.Store, Retention: retention, Logger: testutil.Logger(t),
		Now: func() time.Time { return time.Now().Add(retention + time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Collected != 1 {
		t.Fatalf("sweep %+v, want the closed root's tree collected", st)
	}
	k := ledgers()
	if k[closedRoot.SessionID] || k[closedChild] {
		t.Errorf("a collected tree's ledgers are left: root %v, child %v", k[closedRoot.SessionID], k[closedChild])
	}
	if !k[openRoot.SessionID] || !k[openChild] {
		t.Errorf("an open tree's ledgers are gone: root %v, child %v", k[openRoot.SessionID], k[openChild])
	}
}
