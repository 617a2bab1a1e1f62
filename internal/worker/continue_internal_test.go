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

// TestAContinuedEpochUnderAnEndedAncestorClosesItsTurnInterrupted (I7,
// chaos seed 3 on d088198): a continuable child's epoch whose host died
// with a turn open is continued here (continueActivation), but an ancestor
// of the child (a one-shot run) has ended meanwhile, so the epoch starts no
// work (endIfOrphaned). The turn its host lost is not left open: it is
// closed interrupted{host-lost}, the log replays as balanced, and the
// epoch settles once, aborted with HOST_LOST, not completed (before: the
// log ended at agent/takeover and the record said completed).
func TestAContinuedEpochUnderAnEndedAncestorClosesItsTurnInterrupted(t *testing.T) {
	h, st, nc := testHost(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const child, runID, deadHost = "C1", "R1", "H0"
	header := protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, ParentSession: "P1", CreatedAt: store.NowMs(), Cwd: "/w", Provider: "spawn"}
	// The dead host's log: turn 1 opened, its first step begun, then the
	// coordinator's fence.
	var evs []protocol.SessionEvent
	for _, e := range []struct {
		typ  string
		data any
	}{
		{protocol.EvTurnStart, protocol.TurnData{Turn: 1}},
		{protocol.EvUserMessage, protocol.UserMessageData{ID: "m1", Turn: 1, Content: protocol.Text("say done")}},
		{protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}},
		{protocol.EvAgentTakeover, protocol.TakeoverData{HostID: deadHost, By: "coord", Epoch: 1}},
	} {
		evs = append(evs, mustEvent(e.typ, e.data))
	}
	if _, err := st.NewLogWriter(header.Scope(), child, 0, 0).Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	lease, err := st.CreateLease(ctx, protocol.AgentRecord{
		SessionID: child, Kind: protocol.AgentContinuable, HostID: deadHost, Epoch: 1, Provider: "spawn",
		RunID: runID, Owner: "P1", TakenOverBy: "coord", CreatedAt: store.NowMs(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateRun(ctx, protocol.RunRecord{
		RunID: runID, ChildID: child, ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeContinuable,
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
	h.mu.Lock()
	a := h.acts[child]
	h.mu.Unlock()
	if a != nil {
		select {
		case <-a.done:
		case <-ctx.Done():
			t.Fatal("the continued epoch did not end")
		}
	}
	select {
	case <-asked:
	default:
		t.Fatal("the continued epoch did not ask whether an ancestor ended")
	}
	var rec store.Record[protocol.RunRecord]
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec, err = st.Run(ctx, runID)
		return err == nil && rec.Value.State == protocol.RunSettled
	}, "the epoch settled")
	if res := rec.Value.Result; res == nil || res.StopReason != protocol.StopAborted || res.ErrorCode != protocol.CodeHostLost ||
		rec.Value.SettledBy != h.id || rec.Value.Takeovers != 1 {
		t.Fatalf("epoch record %+v, result %+v; want it settled once by this host, aborted with HOST_LOST, one takeover", rec.Value, res)
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
}

// TestAContinuedRunUnderAnEndedAncestorIsNotContinued (issue 31, item 2):
// a one-shot run whose host died with its turn open is continued here
// (continueRun), but an ancestor of the child (a one-shot run) ended
// meanwhile, and its dispose reached no one, the run's host being dead.
// The turn is not continued (no model call for a tree that no longer
// exists): it is closed interrupted{host-lost}, as the coordinator closes a
// turn it does not continue, the log replays as balanced, and the run
// settles once, error with HOST_LOST (before: the turn ran to its end).
func TestAContinuedRunUnderAnEndedAncestorIsNotContinued(t *testing.T) {
	h, st, nc := testHost(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const child, runID, deadHost = "C1", "R1", "H0"
	header := protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, ParentSession: "P1", CreatedAt: store.NowMs(), Cwd: "/w", Provider: "spawn"}
	var evs []protocol.SessionEvent
	for _, e := range []struct {
		typ  string
		data any
	}{
		{protocol.EvSubagentDescriptor, protocol.DescriptorData{}},
		{protocol.EvTurnStart, protocol.TurnData{Turn: 1}},
		{protocol.EvUserMessage, protocol.UserMessageData{ID: "m1", Turn: 1, Content: protocol.Text("say done")}},
		{protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}},
		{protocol.EvAgentTakeover, protocol.TakeoverData{HostID: deadHost, By: "coord", Epoch: 1}},
	} {
		evs = append(evs, mustEvent(e.typ, e.data))
	}
	if _, err := st.NewLogWriter(header.Scope(), child, 0, 0).Append(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	lease, err := st.CreateLease(ctx, protocol.AgentRecord{
		SessionID: child, Kind: protocol.AgentOneShot, HostID: deadHost, Epoch: 1, Provider: "spawn",
		RunID: runID, ParentSession: "P1", Ancestry: []string{"A1", "P1"}, TakenOverBy: "coord", CreatedAt: store.NowMs(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateRun(ctx, protocol.RunRecord{
		RunID: runID, ChildID: child, ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeOneShot,
		State: protocol.RunRunning, HostID: deadHost, CreatedAt: store.NowMs(),
	}); err != nil {
		t.Fatal(err)
	}
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
	h.mu.Lock()
	r := h.runs[runID]
	h.mu.Unlock()
	if r != nil {
		select {
		case <-r.settled:
		case <-ctx.Done():
			t.Fatal("the continued run did not settle")
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
	if res := rec.Value.Result; res == nil || res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeHostLost ||
		rec.Value.SettledBy != h.id || rec.Value.Takeovers != 1 {
		t.Fatalf("run record %+v, result %+v; want it settled once by this host, error with HOST_LOST, one takeover", rec.Value, res)
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
	closing, err := sessionlog.CloseOpenTurn(evs, end.Reason, store.NowMs())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(log.Events); n != len(evs)+len(closing) {
		t.Fatalf("the log holds %d events, want the %d written and the %d of the closing only (the turn ran on)", n, len(evs), len(closing))
	}
}
