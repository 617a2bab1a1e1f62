package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The writes of a worker that start a claimed run or epoch, as a Faults
// hook sees them.
func leaseTake(w store.Write) bool {
	return w.Op == store.OpKVCreate && strings.HasPrefix(w.Key, store.LeaseKey("spawn", ""))
}

func logAppend(logs string) func(store.Write) bool {
	return func(w store.Write) bool { return w.Op == store.OpPublish && strings.HasPrefix(w.Subject, logs) }
}

// claimHold matches the hold of a claim (store.HoldRun): an update of a
// run's state, still running and claimed, at a revision other than the one
// its claim was written at (the first update of the key).
func claimHold() func(store.Write) bool {
	claimedAt := map[string]uint64{}
	return func(w store.Write) bool {
		if w.Op != store.OpKVUpdate || !strings.HasPrefix(w.Key, store.RunStateKey("spawn", "")) {
			return false
		}
		var rec protocol.RunRecord
		if protocol.Unmarshal(protocol.Msgpack, w.Value, &rec) != nil || rec.State != protocol.RunRunning || rec.HostID == "" {
			return false
		}
		if rev, ok := claimedAt[w.Key]; !ok || rev == w.Revision {
			claimedAt[w.Key] = w.Revision
			return false
		}
		return true
	}
}

// TestAnElectionIsWaitedOutByTheWritesThatStartARun (issue 9; RELIABILITY.md:
// an election is never final): each write a worker makes to start a
// one-shot run it claimed (the session's lease, taken beside the claim, the
// first turn's opening in the log; a one-shot run's claim has no hold) and
// an epoch it claimed (the lease, the hold,
// the epoch's first record) is answered "no response from stream" for
// longer than the store's WriteBudget, then taken. The run completes and
// the epoch runs its prompt to a completed turn; before, the write gave up after 10 s and the
// run was settled never started, DURABILITY_FAILED ("log the first turn
// of ...: nats: no response from stream", "hold the claim of ...").
func TestAnElectionIsWaitedOutByTheWritesThatStartARun(t *testing.T) {
	if testing.Short() {
		t.Skip("each case waits out an injected election of 12 s")
	}
	type write func(logs string) func(store.Write) bool
	lease := func(string) func(store.Write) bool { return leaseTake }
	hold := func(string) func(store.Write) bool { return claimHold() }
	for _, tc := range []struct {
		name        string
		continuable bool
		write       write
	}{
		{"one-shot run, its lease", false, lease},
		{"one-shot run, its first turn's opening", false, logAppend},
		{"epoch, its lease", true, lease},
		{"epoch, its claim's hold", true, hold},
		{"epoch, its first record", true, logAppend},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := stack.New(t)
			s.AddCoordinator()
			e := &testutil.Election{}
			s.AddSpawnWorker(func(c *worker.InProcessConfig) {
				e.Match(tc.write(c.Store.Subj.Log("spawn", "")))
				c.Store = c.Store.WithFaults(e.Faults())
			})
			root := s.Root()
			if !tc.continuable {
				run, res, err := s.Run(root.Ref(), "spawn", "say ok", protocol.StartOptions{})
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				if res.StopReason != protocol.StopCompleted || res.ErrorCode != "" || protocol.PlainText(res.Output) != "ok" {
					t.Fatalf("result %+v, want completed with output ok", res)
				}
				e.Check(t)
				if rec := runRecord(t, s.Store, run.RunID); rec.NotStarted || rec.SettledBy == "" || rec.SettledBy != rec.HostID {
					t.Fatalf("run record %+v, want settled by the host that claimed it", rec)
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			child, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
				Provider: "spawn", Parent: root.Ref(), Label: "election", Prompt: protocol.Text("say started"),
			})
			if err != nil {
				t.Fatalf("continuable.start: %v", err)
			}
			var reasons []string
			testutil.Eventually(t, 60*time.Second, func() bool {
				_, evs := s.Log(child.ChildID)
				reasons = reasons[:0]
				for _, ev := range evs {
					var d protocol.TurnEndData
					if ev.Type == protocol.EvTurnEnd && ev.Decode(&d) == nil {
						reasons = append(reasons, d.Reason.Kind)
					}
				}
				return len(reasons) > 0
			}, "the epoch's first turn ends")
			e.Check(t)
			if len(reasons) != 1 || reasons[0] != protocol.TurnCompleted {
				t.Fatalf("turn ends %v, want one, completed", reasons)
			}
			// The epoch ends once its work is done: completed, never
			// DURABILITY_FAILED.
			for _, ev := range s.Lifecycle(root.SessionID) {
				if ev.Type == protocol.LifecycleEnd && ev.ID == child.ChildID && (ev.ErrorCode != "" || ev.StopReason != protocol.StopCompleted) {
					t.Fatalf("the epoch ended %+v, want completed", ev)
				}
			}
		})
	}
}
