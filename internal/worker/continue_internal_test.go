package worker

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestAContinuationUnderAnEndedAncestorClosesTheLostTurn (issue 31, item
// 2): a run whose host died with its turn open is continued here, but an
// ancestor of the child (a one-shot run) ended meanwhile, and its dispose
// reached no one, the run's host being dead. The turn is not continued (no
// model call for a tree that no longer exists): it is closed
// interrupted{host-lost}, as the coordinator closes a turn it does not
// continue, the log replays as balanced, and the run settles once with
// HOST_LOST.
//   - a continuable child's epoch (continueActivation; I7, chaos seed 3 on
//     d088198): before, the log ended at agent/takeover and the epoch
//     record said completed; it now settles aborted;
//   - a one-shot run (continueRun → execute): before, the turn ran to its
//     end; it now settles error, and the log holds nothing but the closing.
func TestAContinuationUnderAnEndedAncestorClosesTheLostTurn(t *testing.T) {
	const child, runID, deadHost = "C1", "R1", "H0"
	for _, tc := range []struct {
		name     string
		oneShot  bool
		lease    protocol.AgentRecord
		wantStop protocol.StopReason
	}{
		{name: "continuable epoch", lease: protocol.AgentRecord{Kind: protocol.AgentContinuable, Owner: "P1"}, wantStop: protocol.StopAborted},
		{name: "one-shot run", oneShot: true, wantStop: protocol.StopError,
			lease: protocol.AgentRecord{Kind: protocol.AgentOneShot, ParentSession: "P1", Ancestry: []string{"A1", "P1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, st, nc := testHost(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			header := protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, ParentSession: "P1", CreatedAt: store.NowMs(), Cwd: "/w", Provider: "spawn"}
			// The dead host's log: turn 1 opened, its first step begun,
			// then the coordinator's fence.
			var evs []protocol.SessionEvent
			if tc.oneShot {
				evs = append(evs, mustEvent(protocol.EvSubagentDescriptor, protocol.DescriptorData{}))
			}
			evs = append(evs,
				mustEvent(protocol.EvTurnStart, protocol.TurnData{Turn: 1}),
				mustEvent(protocol.EvUserMessage, protocol.UserMessageData{ID: "m1", Turn: 1, Content: protocol.Text("say done")}),
				mustEvent(protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}),
				mustEvent(protocol.EvAgentTakeover, protocol.TakeoverData{HostID: deadHost, By: "coord", Epoch: 1}))
			if _, err := st.NewLogWriter(header.Scope(), child, 0, 0).Append(ctx, evs...); err != nil {
				t.Fatal(err)
			}
			l := tc.lease
			l.SessionID, l.HostID, l.Epoch, l.Provider, l.RunID, l.TakenOverBy, l.CreatedAt = child, deadHost, 1, "spawn", runID, "coord", store.NowMs()
			lease, err := st.CreateLease(ctx, l)
			if err != nil {
				t.Fatal(err)
			}
			mode := protocol.ModeContinuable
			if tc.oneShot {
				mode = protocol.ModeOneShot
			}
			if _, err := st.CreateRun(ctx, protocol.RunRecord{
				RunID: runID, ChildID: child, ParentSession: "P1", Provider: "spawn", Mode: mode,
				State: protocol.RunRunning, HostID: deadHost, CreatedAt: store.NowMs(),
			}); err != nil {
				t.Fatal(err)
			}
			// The coordinators' ancestry read: the child's one-shot ancestor ended.
			asked := make(chan struct{}, 8)
			sub, err := nc.Subscribe(h.subj.Read("spawn", protocol.ReadAncestry, child), func(m *nats.Msg) {
				asked <- struct{}{}
				out, err := protocol.Marshal(protocol.Msgpack, protocol.AncestryReply{EndedAncestor: "A1"})
				if err == nil {
					_ = m.Respond(out)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()

			if _, err := h.continueRun(ctx, h.cfg.Providers[0], protocol.ProviderContinueRequest{
				RunID: runID, ChildID: child, Provider: "spawn", LeaseRevision: protocol.Seq(lease), Header: header,
				Deadline: time.Now().Add(time.Minute).UnixMilli(),
			}); err != nil {
				t.Fatalf("continue: %v", err)
			}
			var ended <-chan struct{}
			h.mu.Lock()
			if a := h.acts[child]; a != nil {
				ended = a.done
			}
			if r := h.runs[runID]; r != nil {
				ended = r.settled
			}
			h.mu.Unlock()
			if ended != nil {
				select {
				case <-ended:
				case <-ctx.Done():
					t.Fatal("the continued run did not end")
				}
			}
			select {
			case <-asked:
			default:
				t.Fatal("the continued run did not ask whether an ancestor ended")
			}
			var rec store.Record[protocol.RunRecord]
			testutil.Eventually(t, 10*time.Second, func() bool {
				rec, err = st.Run(ctx, runID)
				return err == nil && rec.Value.State == protocol.RunSettled
			}, "the run settled")
			if res := rec.Value.Result; res == nil || res.StopReason != tc.wantStop || res.ErrorCode != protocol.CodeHostLost ||
				rec.Value.SettledBy != h.id || rec.Value.Takeovers != 1 {
				t.Fatalf("run record %+v, result %+v; want it settled once by this host, %s with HOST_LOST, one takeover", rec.Value, res, tc.wantStop)
			}
			log, err := st.ReadLog(ctx, header.Scope(), child)
			if err != nil {
				t.Fatal(err)
			}
			if err := sessionlog.ValidateReplay(log.Events, false); err != nil {
				t.Fatalf("the log does not replay as balanced: %v (%d events)", err, len(log.Events))
			}
			end, ok := sessionlog.LastTurnEnd(log.Events)
			if !ok || end.Turn != 1 || end.Reason.Kind != protocol.TurnInterrupted || end.Reason.Cause != protocol.CauseHostLost {
				t.Fatalf("last turn/end %+v (%v); want turn 1 closed interrupted{host-lost}", end, ok)
			}
			if !tc.oneShot {
				return
			}
			closing, err := sessionlog.CloseOpenTurn(evs, end.Reason, store.NowMs())
			if err != nil {
				t.Fatal(err)
			}
			if n := len(log.Events); n != len(evs)+len(closing) {
				t.Fatalf("the log holds %d events, want the %d written and the %d of the closing only (the turn ran on)", n, len(evs), len(closing))
			}
		})
	}
}
