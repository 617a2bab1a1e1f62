package store_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A run record is created running, claimed once at its creation revision
// and settled once: every later claim or settlement at a revision that is
// no longer current loses (the settlement's compare-and-set, docs/design.md §7).
func TestRunRecordIsClaimedAndSettledOnce(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	rec := protocol.RunRecord{RunID: "R1", ChildID: "C1", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: 1}
	if _, err := st.CreateRun(ctx, protocol.RunRecord{RunID: "R0", State: protocol.RunSettled}); err == nil {
		t.Fatal("a run created settled was accepted")
	}
	created, err := st.CreateRun(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	other := rec
	other.ChildID = "C2"
	if _, err := st.CreateRun(ctx, other); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("another create of the same run id: %v, want ErrConflict", err)
	}
	claimed, claimRev, err := st.ClaimRun(ctx, rec, created, "H1")
	if err != nil || claimed.HostID != "H1" || claimed.StartedAt == 0 {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	if _, _, err := st.ClaimRun(ctx, rec, created, "H2"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second claim at the creation revision: %v, want ErrConflict", err)
	}
	if _, err := st.SettleRun(ctx, claimed, claimRev); err == nil {
		t.Fatal("a record that is not settled was written as a settlement")
	}
	res := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("ok")}
	// Two settlers at the claim's revision: exactly one wins.
	var wins, losses int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, by := range []string{"H1", "COORD"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			won, err := st.SettleRun(ctx, store.Settled(claimed, by, res), claimRev)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("settle by %s: %v", by, err)
			case won:
				wins++
			default:
				losses++
			}
		}()
	}
	wg.Wait()
	if wins != 1 || losses != 1 {
		t.Fatalf("%d settlements won and %d lost, want 1 and 1", wins, losses)
	}
	got, err := st.Run(ctx, "R1")
	if err != nil {
		t.Fatal(err)
	}
	if v := got.Value; v.State != protocol.RunSettled || v.Result == nil || v.Result.StopReason != protocol.StopCompleted || v.SettledAt == 0 || v.HostID != "H1" {
		t.Fatalf("settled record %+v", v)
	}
	// A coordinator giving up on the start at the creation revision loses too.
	if won, err := st.SettleRun(ctx, store.NotStarted(rec, "COORD", errors.New("late")), created); won || err != nil {
		t.Fatalf("a settlement at the creation revision after the claim: won %v, %v", won, err)
	}
}

// NotStarted settles a record as never started with the cause's code (a
// plain error is INTERNAL) and a diagnostic saying so.
func TestNotStarted(t *testing.T) {
	rec := protocol.RunRecord{RunID: "R1", State: protocol.RunRunning}
	for _, tc := range []struct {
		cause error
		code  protocol.Code
	}{
		{protocol.Errorf(protocol.CodeUnavailable, "no instance answered"), protocol.CodeUnavailable},
		{errors.New("boom"), protocol.CodeInternal},
	} {
		got := store.NotStarted(rec, "H1", tc.cause)
		if got.State != protocol.RunSettled || !got.NotStarted || got.SettledBy != "H1" || got.Result == nil ||
			got.Result.StopReason != protocol.StopError || got.Result.ErrorCode != tc.code || got.Result.Output == nil {
			t.Errorf("NotStarted(%v) = %+v", tc.cause, got)
		}
	}
	if rec.State != protocol.RunRunning {
		t.Error("NotStarted changed its argument")
	}
}

// Of the coordinators racing to take over a dead host's lease, exactly one
// wins; the lease then names it, its epoch is one higher, and the dead host
// can no longer release it at the revision it knew.
func TestTakeOverLeaseHasOneWinner(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	if err := st.PutHeader(ctx, protocol.SessionHeader{ID: "S1", ParentSession: "P1", Provider: "spawn"}); err != nil {
		t.Fatal(err)
	}
	lease := protocol.AgentRecord{SessionID: "S1", Kind: protocol.AgentOneShot, HostID: "DEAD", Epoch: 1, RunID: "R1", Provider: "spawn", ParentSession: "P1"}
	rev, err := st.CreateLease(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := st.Lease(ctx, "S1")
	if err != nil || cur.Revision != rev {
		t.Fatalf("read: %+v, %v", cur, err)
	}
	var mu sync.Mutex
	var winners []store.Record[protocol.AgentRecord]
	var wg sync.WaitGroup
	for _, by := range []string{"C1", "C2", "C3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			taken, err := st.TakeOverLease(ctx, cur, by)
			if errors.Is(err, store.ErrConflict) {
				return
			}
			if err != nil {
				t.Errorf("takeover by %s: %v", by, err)
				return
			}
			mu.Lock()
			winners = append(winners, taken)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d takeovers won, want 1", len(winners))
	}
	w := winners[0]
	if w.Value.HostID != w.Value.TakenOverBy || w.Value.Epoch != 2 {
		t.Fatalf("taken lease %+v", w.Value)
	}
	if again, err := st.TakeOverLease(ctx, w, w.Value.TakenOverBy); err != nil || again.Revision != w.Revision {
		t.Fatalf("a resumed takeover by the winner: %+v, %v", again, err)
	}
	if err := st.ReleaseLease(ctx, "S1", rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the dead host's release at its revision: %v, want ErrConflict", err)
	}
	if err := st.ReleaseLease(ctx, "S1", w.Revision); err != nil {
		t.Fatal(err)
	}
}

// A run one process created is read by another, as a worker or another
// coordinator reads a coordinator's run: through a second Store on its own
// connection, which has nothing of the run cached, RunSpec answers the spec
// as created, Run and RunLatest join it with its state at its revision, a
// claim made there is read back by the first, and a run with no spec is
// ErrNotFound.
func TestARunCreatedThroughOneStoreIsReadThroughAnother(t *testing.T) {
	s := testutil.Server(t)
	ctx := context.Background()
	creator := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	other, err := store.Open(ctx, testutil.Connect(t, s.ClientURL()), protocol.MustSubjects(""), store.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	spec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "fork", Mode: protocol.ModeOneShot,
		Notify: "_INBOX.client.n1", Structured: true, State: protocol.RunRunning, CreatedAt: 7}
	rev, err := creator.CreateRun(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.RunSpec(ctx, "R1"); err != nil || !reflect.DeepEqual(got, spec) {
		t.Fatalf("the spec read through another store: %+v, %v; want %+v", got, err, spec)
	}
	for name, read := range map[string]func(context.Context, string) (store.Record[protocol.RunRecord], error){"Run": other.Run, "RunLatest": other.RunLatest} {
		if got, err := read(ctx, "R1"); err != nil || !reflect.DeepEqual(got.Value, spec) || got.Revision != rev {
			t.Fatalf("%s through another store: %+v at %d, %v; want %+v at %d", name, got.Value, got.Revision, err, spec, rev)
		}
	}
	run, err := other.Run(ctx, "R1")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.ClaimRun(ctx, run.Value, run.Revision, "fork.H1"); err != nil {
		t.Fatalf("a claim through another store: %v", err)
	}
	if got, err := creator.RunLatest(ctx, "R1"); err != nil || got.Value.HostID != "fork.H1" || got.Value.ChildID != "C1" {
		t.Fatalf("the claimed run read by its creator: %+v, %v; want claimed by fork.H1", got.Value, err)
	}
	if _, err := other.RunSpec(ctx, "NOSPEC"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a run without a spec, through another store: %v, want ErrNotFound", err)
	}
}
