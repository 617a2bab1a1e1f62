package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A host's request for a run's notice (store.RequestRunNotice, an empty
// message on <p>.v1.notice.<provider>.<runId>) makes a coordinator publish
// the RunNotice the run's records hold to its spec's notify subject. A
// request naming another provider than the spec's, for a run still
// running, or for no run publishes nothing, and a state written under
// another provider's prefix is never what is published: a worker, which
// may publish on no client's inbox, can have only the true notice of its
// own provider's settled runs sent (docs/security.md).
func TestACoordinatorPublishesTheNoticeARunsRecordsHold(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	notices := testutil.Subscribe(t, s.NC, "test.notices.>")
	root := s.Root()
	run := func(id string, settled bool) protocol.RunRecord {
		t.Helper()
		rec := protocol.RunRecord{RunID: id, ChildID: id, ParentSession: root.SessionID, Provider: "spawn", Mode: protocol.ModeOneShot,
			Notify: "test.notices." + id, State: protocol.RunRunning, CreatedAt: store.NowMs()}
		if settled {
			rec = store.Settled(rec, "spawn.H1", protocol.SubagentResult{Output: protocol.Text("done " + id), StopReason: protocol.StopCompleted})
		}
		putRun(t, s, rec)
		return rec
	}
	ask := func(provider, runID string) {
		t.Helper()
		if err := s.NC.Publish(s.Store.Subj.Notice(provider, runID), nil); err != nil {
			t.Fatal(err)
		}
	}
	// receive waits for the notice of run id, the only one expected next.
	receive := func(id string) {
		t.Helper()
		select {
		case m := <-notices:
			var n protocol.RunNotice
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &n); err != nil {
				t.Fatalf("decode the notice on %s: %v", m.Subject, err)
			}
			if m.Subject != "test.notices."+id || n.RunID != id || n.Result.StopReason != protocol.StopCompleted || protocol.PlainText(n.Result.Output) != "done "+id {
				t.Fatalf("notice on %s: %+v, want run %s's settled result on test.notices.%s", m.Subject, n, id, id)
			}
		case <-ctx.Done():
			t.Fatalf("no notice of run %s", id)
		}
	}

	run("settled", true)
	ask("spawn", "settled")
	receive("settled")

	// Each refused request is followed by a valid one for a run of its
	// own: the next notice must be that run's.
	running := run("running", false)
	// A settled state with a forged result under fork's prefix, which a
	// fork worker may write: never read for a spawn run.
	forged := store.Settled(running, "fork.forger", protocol.SubagentResult{Output: protocol.Text("forged"), StopReason: protocol.StopCompleted})
	if _, err := store.Create(ctx, s.Store.Runs, store.RunStateKey("fork", "running"), forged); err != nil {
		t.Fatal(err)
	}
	for i, req := range []struct{ provider, runID string }{
		{"fork", "settled"},  // another provider than the spec's
		{"spawn", "running"}, // not settled
		{"fork", "running"},  // its forged state under fork's prefix
		{"spawn", "no-run"},  // no such run
		{"root", "settled"},  // a scope that is no provider
	} {
		ask(req.provider, req.runID)
		id := "valid" + string(rune('a'+i))
		run(id, true)
		ask("spawn", id)
		receive(id)
	}
	if err := s.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-notices:
		t.Fatalf("a notice on %s nobody should have published", m.Subject)
	default:
	}
}
