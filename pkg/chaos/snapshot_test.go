package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/chaos"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestTakeSnapshotOverAConnection: TakeSnapshot, called as another module
// calls it (a NATS connection and the deployment's subjects, no type of
// Brood's internal packages), reads the run records, the leases and the
// pending inbox items the stores hold.
func TestTakeSnapshotOverAConnection(t *testing.T) {
	s := testutil.Server(t)
	st := testutil.Store(t, testutil.Connect(t, s.ClientURL()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := protocol.RunRecord{RunID: "R1", ChildID: "C1", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: store.NowMs()}
	if _, err := st.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	lease := protocol.AgentRecord{SessionID: "C1", Kind: protocol.AgentOneShot, HostID: "spawn.h1", Epoch: 1, RunID: "R1", Provider: "spawn", CreatedAt: store.NowMs()}
	if _, err := st.CreateLease(ctx, lease); err != nil {
		t.Fatal(err)
	}
	mid, _, err := st.Enqueue(ctx, "spawn", "C1", store.InboxItem{Content: protocol.Text("say one"), Source: protocol.MessageSource{Kind: protocol.SourceUser}}, "")
	if err != nil {
		t.Fatal(err)
	}

	snap, err := chaos.TakeSnapshot(ctx, testutil.Connect(t, s.ClientURL()), protocol.MustSubjects(""))
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Runs["R1"]; got.ChildID != "C1" || got.State != protocol.RunRunning {
		t.Errorf("run R1 in the snapshot = %+v, want child C1 running", got)
	}
	if got := snap.Agents["C1"]; got.HostID != "spawn.h1" || got.RunID != "R1" {
		t.Errorf("lease of C1 in the snapshot = %+v, want held by spawn.h1 for R1", got)
	}
	if got := snap.Inbox["C1"]; len(got) != 1 || got[0].MessageID != mid || got[0].Text != "say one" {
		t.Errorf("inbox of C1 in the snapshot = %+v, want the one item %s", got, mid)
	}
}
