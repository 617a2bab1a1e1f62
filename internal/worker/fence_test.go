package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestAgentFencedUnderItsOwnLeaseEndsItsRun (RELIABILITY.md, open finding
// 1 of the short chaos seed): another party writes the log of a child
// mid-turn (as a takeover that lost its lease while it stalled did:
// turn/end interrupted, fenced on the log's last record) while the child's
// worker still holds the lease. The worker's next append is refused; it
// reads the lease again and, finding it still its own, ends the run: the
// record settles by the worker (HOST_LOST, as the takeover's closing of
// the turn would have settled it), its end is published once (one
// subagent/end; a continuable child's parent gets one settlement notice, a
// one-shot run's caller its notice), the lease is released, and a
// continuable child's followup still pending runs on a next epoch. Before,
// the worker took the fence for a lost lease and stopped without settling,
// publishing or releasing: the lease kept the child resident and its
// messages pending for good.
func TestAgentFencedUnderItsOwnLeaseEndsItsRun(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	interrupted := protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}
	for _, continuable := range []bool{true, false} {
		name := map[bool]string{true: "an epoch, with a followup pending", false: "a one-shot run"}[continuable]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const prompt, notify = "sleep 3s\nsay first", "test.notify.fenced"
			notices := testutil.Subscribe(t, s.NC, notify)
			var child string
			if continuable {
				start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
					Provider: "spawn", Parent: root.Ref(), Label: "fenced", Prompt: protocol.Text(prompt),
				})
				if err != nil {
					t.Fatalf("continuable.start: %v", err)
				}
				child = start.ChildID
			} else {
				var reply protocol.RunStartReply
				if err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
					Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(prompt), Notify: notify,
				}, &reply); err != nil {
					t.Fatalf("runs.start: %v", err)
				}
				child = reply.ChildID
			}
			var lease store.Record[protocol.AgentRecord]
			testutil.Eventually(t, 30*time.Second, func() bool {
				var err error
				lease, err = store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", child))
				_, evs := s.Log(child)
				closing, cerr := sessionlog.CloseOpenTurn(evs, interrupted, store.NowMs())
				return err == nil && cerr == nil && len(closing) > 0
			}, "the child's lease is taken and its first turn is open (its model sleeps)")
			runID := lease.Value.RunID
			if continuable {
				if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: child,
					Authority: protocol.Authority{Parent: ptr(root.Ref())}, Message: protocol.Text("say second")}); err != nil {
					t.Fatalf("followup: %v", err)
				}
			}

			// The foreign write: the open turn closed as interrupted,
			// fenced on the log's last record; the lease stays the worker's.
			for attempt := 0; ; attempt++ {
				log, err := s.Store.ReadLog(ctx, "spawn", child)
				if err != nil {
					t.Fatal(err)
				}
				closing, err := sessionlog.CloseOpenTurn(log.Events, interrupted, store.NowMs())
				if err != nil || len(closing) == 0 {
					t.Fatalf("no open turn to close (%v): %+v", err, log.Events)
				}
				_, err = s.Store.NewLogWriter("spawn", child, log.LastSubjSeq, int64(len(log.Events))).Append(ctx, closing...)
				if err == nil {
					break
				}
				if !errors.Is(err, store.ErrFenced) || attempt == 10 {
					t.Fatalf("the foreign append: %v", err)
				}
			}

			testutil.Eventually(t, 45*time.Second, func() bool {
				return runRecord(t, s.Store, runID).State == protocol.RunSettled && s.Ends(root.SessionID, runID) == 1
			}, "the fenced run settles and its end is published")
			// As a takeover's closing would: an epoch aborted, a one-shot
			// run error, HOST_LOST.
			want := map[bool]protocol.StopReason{true: protocol.StopAborted, false: protocol.StopError}[continuable]
			if r := runRecord(t, s.Store, runID); r.SettledBy != host.ID() || r.Result == nil || r.Result.StopReason != want ||
				r.Result.ErrorCode != protocol.CodeHostLost {
				t.Fatalf("the fenced run's record %+v (result %+v), want settled %s/HOST_LOST by its worker %s", r, r.Result, want, host.ID())
			}
			if continuable {
				testutil.Eventually(t, 45*time.Second, func() bool {
					items, err := testutil.InboxOf(t, s.Store, child).Pending(ctx, 0)
					if err != nil || len(items) > 0 {
						return false
					}
					_, evs := s.Log(child)
					for i := len(evs) - 1; i >= 0; i-- {
						var d protocol.TurnEndData
						if evs[i].Type == protocol.EvTurnEnd && evs[i].Decode(&d) == nil {
							return d.Reason.Kind == protocol.TurnCompleted
						}
					}
					return false
				}, "the pending followup runs on a next epoch, to its end")
			} else {
				testutil.Eventually(t, 30*time.Second, func() bool { return !leaseHeld(ctx, t, s, child) }, "the lease is released")
				testutil.Eventually(t, 30*time.Second, func() bool { return len(notices) == 1 }, "the caller's notice")
			}
			_, evs := s.Log(child)
			if ends := interruptedTurnEnds(evs); ends != 1 {
				t.Fatalf("%d interrupted turn ends in the log, want the foreign one only", ends)
			}
		})
	}
}

// leaseHeld reports whether the lease of spawn child id exists (read from
// the leader).
func leaseHeld(ctx context.Context, t *testing.T, s *stack.Stack, id string) bool {
	t.Helper()
	_, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", id))
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func ptr[T any](v T) *T { return &v }
