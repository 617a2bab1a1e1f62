package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestReadLogPageWaitsForTheLogStream: a page of a session's log read while
// the log stream answers nothing ("no responders": no leader, as through an
// election, or gone and being made again) is read again within its budget,
// not returned as an error: a followup's cold resume reads the head of the
// child's log this way, and was refused UNAVAILABLE "read the log of …:
// context deadline exceeded" while the other reads around it were retried
// (TestLeaderElectionsAreNotFailures).
func TestReadLogPageWaitsForTheLogStream(t *testing.T) {
	s := testutil.Server(t)
	nc := testutil.Connect(t, s.ClientURL())
	st := testutil.Store(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.JS.DeleteStream(ctx, st.Subj.StreamLog(protocol.ScopeRoot)); err != nil {
		t.Fatalf("delete %s: %v", st.Subj.StreamLog(protocol.ScopeRoot), err)
	}
	back := make(chan error, 1)
	time.AfterFunc(time.Second, func() { // the stream is back, with one record
		pctx, pcancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer pcancel()
		again, err := store.Provision(pctx, nc, st.Subj, store.DefaultConfig())
		if err == nil {
			_, err = again.NewLogWriter(protocol.ScopeRoot, "P", 0, 0).Append(pctx, event(t, 1))
		}
		back <- err
	})
	began := time.Now()
	page, err := st.ReadLogPage(ctx, protocol.ScopeRoot, "P", 0, 0, 10, protocol.ReadPageBytesMax)
	if err != nil {
		t.Fatalf("page read while the log stream was away: %v", err)
	}
	if took := time.Since(began); took < time.Second {
		t.Fatalf("page read answered %+v after %s, before the stream was back", page, took)
	}
	if err := <-back; err != nil {
		t.Fatalf("make the stream again: %v", err)
	}
	// Back with nothing yet (before the append) or with the record.
	if len(page.Events) > 1 || !page.Complete {
		t.Fatalf("page = %+v, want complete with at most the one event", page)
	}
	if page, err := st.ReadLogPage(ctx, protocol.ScopeRoot, "P", 0, 0, 10, protocol.ReadPageBytesMax); err != nil || len(page.Events) != 1 {
		t.Fatalf("page once the stream is back = %+v, %v; want its one event", page, err)
	}
}

// TestAnEventIsReadOnlyOnItsOwnSubject: lifecycle events are published on
// their provider's and parent's subject
// (brood.v1.events.<provider>.<parent>.<kind>), which a deployment lets
// only that provider's workers publish (docs/security.md); a reader keeps
// an event only when its provider, parent and type are its subject's. So
// what a worker publishes under its own provider naming another
// provider's child, another parent, or the other kind is never read.
func TestAnEventIsReadOnlyOnItsOwnSubject(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	true1 := protocol.LifecycleEvent{Type: protocol.LifecycleStart, RunID: "R1", Provider: "spawn", ID: "C1", ParentSession: "P", Mode: protocol.ModeOneShot, Time: 1}
	testutil.PutRun(t, st, protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning})
	published := make(chan error, 1)
	<-st.PublishEvent(true1, func(err error) { published <- err })
	select {
	case err := <-published:
		t.Fatalf("publish: %v", err)
	default:
	}
	forge := func(subject string, ev protocol.LifecycleEvent) {
		t.Helper()
		data, err := protocol.Marshal(protocol.Msgpack, ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.JS.Publish(ctx, subject, data); err != nil {
			t.Fatal(err)
		}
	}
	// Under spawn's subjects: a fork child's end, an end of another
	// parent's child, an end on the start subject.
	forgedFork := protocol.LifecycleEvent{Type: protocol.LifecycleEnd, RunID: "RF", Provider: "fork", ID: "F1", ParentSession: "P", StopReason: protocol.StopCompleted}
	forge(st.Subj.Events("spawn", "P", protocol.EventKindEnd), forgedFork)
	forgedParent := protocol.LifecycleEvent{Type: protocol.LifecycleEnd, RunID: "RQ", Provider: "spawn", ID: "C2", ParentSession: "Q", StopReason: protocol.StopCompleted}
	forge(st.Subj.Events("spawn", "P", protocol.EventKindEnd), forgedParent)
	forgedKind := protocol.LifecycleEvent{Type: protocol.LifecycleEnd, RunID: "R1", Provider: "spawn", ID: "C1", ParentSession: "P", StopReason: protocol.StopCompleted}
	forge(st.Subj.Events("spawn", "P", protocol.EventKindStart), forgedKind)
	for _, subject := range []string{st.Subj.EventsAll("P"), st.Subj.EventsAll("*")} {
		page, err := st.ReadEventsPage(ctx, subject, 0, 100, 100, func(protocol.LifecycleEvent) (bool, error) { return true, nil })
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) != 1 || page.Events[0].RunID != "R1" || page.Events[0].Type != protocol.LifecycleStart || !page.Complete {
			t.Fatalf("events on %s: %+v; want only the start of R1", subject, page)
		}
	}
	// An event that names no provider is not published at all.
	refused := make(chan error, 1)
	<-st.PublishEvent(protocol.LifecycleEvent{Type: protocol.LifecycleStart, RunID: "R2", ID: "C2", ParentSession: "P"}, func(err error) { refused <- err })
	select {
	case err := <-refused:
		t.Logf("refused: %v", err)
	default:
		t.Fatal("an event naming no provider was published")
	}
}

// TestAnEventIsReadOnlyForItsRun: on its own provider's subjects a worker
// may publish any event (docs/security.md); a reader keeps one only when
// the spec of the run it names (which only coordinators write) names its
// child, provider, parent and mode. So a start or end of a child that is
// not its run's, of a run that never was, of another parent's run, or of
// the other mode, is never read; each is tried on the subject it claims.
func TestAnEventIsReadOnlyForItsRun(t *testing.T) {
	st := testutil.NewStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testutil.PutRun(t, st, protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning})
	testutil.PutRun(t, st, protocol.RunRecord{RunID: "RQ", ChildID: "CQ", ParentSession: "Q", Provider: "spawn", Mode: protocol.ModeOneShot, State: protocol.RunRunning})
	end := func(runID, child, parent, mode string) protocol.LifecycleEvent {
		return protocol.LifecycleEvent{Type: protocol.LifecycleEnd, RunID: runID, Provider: "spawn", ID: child, ParentSession: parent, Mode: mode,
			StopReason: protocol.StopCompleted, LastAssistantMessage: protocol.Text("forged result")}
	}
	events := []protocol.LifecycleEvent{
		end("R1", "C9", "P", protocol.ModeOneShot),     // a child that is not R1's
		end("RX", "C1", "P", protocol.ModeOneShot),     // a run that never was
		end("RQ", "CQ", "P", protocol.ModeOneShot),     // another parent's run, on P's subject
		end("R1", "C1", "P", protocol.ModeContinuable), // the other mode
		end("R1", "C1", "P", protocol.ModeOneShot),     // the true end
	}
	for _, ev := range events {
		data, err := protocol.Marshal(protocol.Msgpack, ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.JS.Publish(ctx, st.Subj.Events("spawn", ev.ParentSession, protocol.EventKindEnd), data); err != nil {
			t.Fatal(err)
		}
	}
	page, err := st.ReadEventsPage(ctx, st.Subj.EventsAll("*"), 0, 100, 100, func(protocol.LifecycleEvent) (bool, error) { return true, nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 1 || page.Events[0].RunID != "R1" || page.Events[0].ID != "C1" || page.Events[0].Mode != protocol.ModeOneShot || !page.Complete {
		t.Fatalf("events read: %+v; want only the true end of R1", page)
	}
}
