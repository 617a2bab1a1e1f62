package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// histBuilder makes small histories by hand: a root, continuable children
// with logs, one-shot runs, and the ops that made them.
type histBuilder struct {
	t   *testing.T
	h   *History
	now int64
}

const (
	tRoot  = "ROOT"
	tOther = "OTHER"
)

func newHist(t *testing.T) *histBuilder {
	b := &histBuilder{t: t, now: 1_000_000}
	b.h = &History{
		Seed: 7, Start: b.now,
		Bounds: Bounds{HostExpiry: 3 * time.Second, Grace: 10 * time.Second, Cascade: 30 * time.Second, Process: 60 * time.Second},
		Limits: Limits{LiveChildrenMax: 2, DepthMax: 3},
		Snapshot: &Snapshot{
			Headers: map[string]protocol.SessionHeader{}, Logs: map[string][]Event{}, Runs: map[string]protocol.RunRecord{},
			Agents: map[string]protocol.AgentRecord{}, Inbox: map[string][]InboxEntry{},
		},
	}
	b.header(tRoot, "", 0)
	b.header(tOther, "", 0)
	return b
}

func (b *histBuilder) tick() int64 { b.now += 100; return b.now }

func (b *histBuilder) header(id, parent string, depth int64) {
	b.h.Snapshot.Headers[id] = protocol.SessionHeader{Version: 1, ID: id, ParentSession: parent, DelegationDepth: depth, CreatedAt: b.now}
}

func (b *histBuilder) op(op *Op) *Op {
	op.ID = int64(len(b.h.Ops)) + 1
	op.Invoke = b.tick()
	if op.Complete == 0 {
		op.Complete = b.tick()
	}
	if op.Outcome == "" {
		op.Outcome = OutcomeOK
	}
	b.h.Ops = append(b.h.Ops, op)
	return op
}

func (b *histBuilder) event(id, typ string, data any) {
	ev, err := protocol.NewEvent(typ, b.tick(), data)
	if err != nil {
		b.t.Fatal(err)
	}
	log := b.h.Snapshot.Logs[id]
	log = append(log, Event{Seq: int64(len(log)), Type: typ, Time: ev.Time, Data: ev.Data})
	b.h.Snapshot.Logs[id] = log
}

// turn logs one whole turn of child that claims message mid with text.
func (b *histBuilder) turn(child, mid, text string) {
	n := int64(0)
	for _, ev := range b.h.Snapshot.Logs[child] {
		if ev.Type == protocol.EvTurnStart {
			n++
		}
	}
	n++
	b.event(child, protocol.EvTurnStart, protocol.TurnData{Turn: n})
	b.event(child, protocol.EvInboxDequeue, protocol.InboxDequeueData{MessageID: mid, Turn: n})
	b.event(child, protocol.EvUserMessage, protocol.UserMessageData{ID: mid, Turn: n, Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser}})
	b.event(child, protocol.EvStepStart, protocol.StepData{Turn: n, Step: 1})
	b.event(child, protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: n, Step: 1, Message: protocol.AssistantMessage{Content: protocol.Text("ok")}})
	b.event(child, protocol.EvStepEnd, protocol.StepData{Turn: n, Step: 1})
	b.event(child, protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
}

// epoch records a settled run (or epoch) of child with its lifecycle events.
func (b *histBuilder) epoch(child, runID, mode string, from, to int64) {
	parent := b.h.Snapshot.Headers[child].ParentSession
	b.h.Snapshot.Runs[runID] = protocol.RunRecord{RunID: runID, ChildID: child, ParentSession: parent, Mode: mode,
		State: protocol.RunSettled, CreatedAt: from, SettledAt: to, Result: &protocol.SubagentResult{StopReason: protocol.StopCompleted}}
	b.h.Snapshot.Lifecycle = append(b.h.Snapshot.Lifecycle,
		protocol.LifecycleEvent{Type: protocol.LifecycleStart, RunID: runID, ID: child, ParentSession: parent, Time: from},
		protocol.LifecycleEvent{Type: protocol.LifecycleEnd, RunID: runID, ID: child, ParentSession: parent, Time: to})
}

// child starts continuable child id of the root with its prompt processed,
// then n followups from the root, each processed.
func (b *histBuilder) child(id string, n int) []*Op {
	b.header(id, tRoot, 1)
	from := b.now
	start := b.op(&Op{Kind: OpStart, Root: tRoot, Parent: tRoot, Sender: tRoot, Child: id, MessageID: id + "-m0"})
	start.Marker = Marker(start.ID)
	b.event(id, protocol.EvSubagentDescriptor, protocol.DescriptorData{Version: 2, Mode: protocol.ModeContinuable, Provider: "spawn"})
	b.turn(id, start.MessageID, "say "+start.Marker)
	ops := []*Op{start}
	for i := 1; i <= n; i++ {
		f := b.op(&Op{Kind: OpFollowup, Root: tRoot, Parent: tRoot, Sender: tRoot, Child: id, MessageID: id + "-m" + string(rune('0'+i))})
		f.Marker = Marker(f.ID)
		b.turn(id, f.MessageID, "say "+f.Marker)
		ops = append(ops, f)
	}
	b.epoch(id, id+"-e1", protocol.ModeContinuable, from, b.tick())
	return ops
}

func (b *histBuilder) check() *Report {
	b.h.Snapshot.TakenAt = b.tick() + 120_000
	return Check(b.h)
}

// expect checks that exactly the named invariants are violated, each with
// an example containing its text.
func expect(t *testing.T, r *Report, want map[string]string) {
	t.Helper()
	for _, v := range r.Verdicts {
		text, bad := want[v.Name]
		switch {
		case bad && v.Holds():
			t.Errorf("%s holds; want it violated (%s)", v.Name, text)
		case !bad && !v.Holds():
			t.Errorf("%s violated: %v", v.Name, v.Examples)
		case bad && !strings.Contains(strings.Join(v.Examples, "\n"), text):
			t.Errorf("%s examples %v do not mention %q", v.Name, v.Examples, text)
		}
	}
	if t.Failed() {
		for _, l := range r.Lines() {
			t.Log(l)
		}
	}
}

func TestCheckerGoodHistory(t *testing.T) {
	b := newHist(t)
	b.child("A", 3)
	b.child("B", 1)
	r := b.check()
	expect(t, r, nil)
	if s := r.Summary; s.Messages != 6 || s.Lost+s.Duplicated+s.Stuck+s.LimitBreaches != 0 {
		t.Fatalf("summary %+v", s)
	}
	for _, name := range []string{"I1", "I3", "I6", "I7", "I8", "L1"} {
		if r.Verdict(name).Checked == 0 {
			t.Errorf("%s checked nothing", name)
		}
	}
}

// Each case breaks one invariant the way a broken build would, and the
// checker must name it.
func TestCheckerCatchesBrokenHistories(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(b *histBuilder)
		want   map[string]string
	}{
		{"an inbox item deleted before its claim was logged: a lost message", func(b *histBuilder) {
			b.child("A", 2)
			log := b.h.Snapshot.Logs["A"]
			b.h.Snapshot.Logs["A"] = log[:len(log)-7] // the turn that claimed the last one never logged
		}, map[string]string{"I1": "A-m2 accepted at"}},
		{"an accepted message dropped unrun though no ancestor ended", func(b *histBuilder) {
			b.child("A", 0)
			f := b.op(&Op{Kind: OpFollowup, Sender: tRoot, Child: "A", MessageID: "dropped"})
			f.Marker = Marker(f.ID)
			b.event("A", protocol.EvInboxDiscard, protocol.InboxDiscardData{MessageID: "dropped", Reason: "cancelled"})
		}, map[string]string{"I1": "discarded unrun (cancelled)"}},
		{"a message claimed twice: two turns", func(b *histBuilder) {
			ops := b.child("A", 1)
			b.turn("A", ops[1].MessageID, "say "+ops[1].Marker)
		}, map[string]string{"I2": "claimed 2 times"}},
		{"a settlement without its compare-and-set: two notices", func(b *histBuilder) {
			b.header("R1", tRoot, 1)
			op := b.op(&Op{Kind: OpRun, Root: tRoot, Parent: tRoot, RunID: "R1", Child: "R1"})
			op.Notices = []Notice{{At: b.tick(), StopReason: "completed"}, {At: b.tick(), StopReason: "error", ErrorCode: "HOST_LOST"}}
			b.epoch("R1", "R1", protocol.ModeOneShot, op.Invoke, b.tick())
		}, map[string]string{"I2": "announced settled 2 times with 2 results"}},
		{"a notice delivered again is no second settlement", func(b *histBuilder) {
			b.header("R1", tRoot, 1)
			op := b.op(&Op{Kind: OpRun, Root: tRoot, Parent: tRoot, RunID: "R1", Child: "R1"})
			op.Notices = []Notice{{At: b.tick(), StopReason: "completed"}, {At: b.tick(), StopReason: "completed"}}
			b.epoch("R1", "R1", protocol.ModeOneShot, op.Invoke, b.tick())
		}, nil},
		{"a retried followup stored twice", func(b *histBuilder) {
			ops := b.child("A", 1)
			b.turn("A", "another-id", "say "+ops[1].Marker)
		}, map[string]string{"I2": "accepted 2 times"}},
		{"one sender's messages claimed out of order", func(b *histBuilder) {
			b.header("A", tRoot, 1)
			f1 := b.op(&Op{Kind: OpFollowup, Sender: tRoot, Child: "A", MessageID: "m1"})
			f2 := b.op(&Op{Kind: OpFollowup, Sender: tRoot, Child: "A", MessageID: "m2"})
			b.turn("A", "m2", "say "+Marker(f2.ID))
			b.turn("A", "m1", "say "+Marker(f1.ID))
		}, map[string]string{"I3": "claimed op 2's message before op 1's"}},
		{"a message from another root's credential accepted", func(b *histBuilder) {
			b.child("A", 0)
			f := b.op(&Op{Kind: OpForeign, ForeignKind: "followup-other-root", Sender: tOther, Child: "A", Outcome: OutcomeOK})
			b.turn("A", "foreign", "say "+Marker(f.ID))
		}, map[string]string{"I4": "followup-other-root"}},
		{"a descendant of a closed root still running", func(b *histBuilder) {
			b.child("A", 0)
			b.header("G", "A", 2)
			b.h.Snapshot.Runs["G1"] = protocol.RunRecord{RunID: "G1", ChildID: "G", ParentSession: "A", Mode: protocol.ModeOneShot, State: protocol.RunRunning, CreatedAt: b.tick()}
			b.op(&Op{Kind: OpCloseRoot, Root: tRoot})
		}, map[string]string{"I5": "never settled", "I6": "still running"}},
		{"a subagent/start without its end", func(b *histBuilder) {
			b.child("A", 0)
			b.h.Snapshot.Lifecycle = b.h.Snapshot.Lifecycle[:len(b.h.Snapshot.Lifecycle)-1]
		}, map[string]string{"I7": "1 subagent/start and 0 subagent/end"}},
		{"a log left with an open turn", func(b *histBuilder) {
			b.child("A", 0)
			b.event("A", protocol.EvTurnStart, protocol.TurnData{Turn: 2})
		}, map[string]string{"I7": "never ended"}},
		{"a child deeper than its cap", func(b *histBuilder) {
			b.header("D", tRoot, 4)
		}, map[string]string{"I8": "depth 4"}},
		{"more live children than the limit", func(b *histBuilder) {
			for _, id := range []string{"A", "B", "C"} {
				b.header(id, tRoot, 1)
				b.h.Snapshot.Runs[id] = protocol.RunRecord{RunID: id, ChildID: id, ParentSession: tRoot, Mode: protocol.ModeOneShot,
					State: protocol.RunSettled, CreatedAt: 2_000_000, SettledAt: 2_000_500}
			}
		}, map[string]string{"I8": "with 2 children live"}},
		{"an accepted message still pending", func(b *histBuilder) {
			b.child("A", 0)
			f := b.op(&Op{Kind: OpFollowup, Sender: tRoot, Child: "A", MessageID: "late"})
			b.h.Snapshot.Inbox["A"] = []InboxEntry{{Seq: 9, MessageID: "late", Text: "say " + Marker(f.ID), Source: protocol.MessageSource{Kind: protocol.SourceUser}}}
		}, map[string]string{"L1": "still pending"}},
		{"an accepted message claimed long after the bound", func(b *histBuilder) {
			b.child("A", 0)
			f := b.op(&Op{Kind: OpFollowup, Sender: tRoot, Child: "A", MessageID: "slow"})
			b.now += 120_000
			b.turn("A", "slow", "say "+Marker(f.ID))
		}, map[string]string{"L1": "past the bound"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHist(t)
			tc.mutate(b)
			expect(t, b.check(), tc.want)
		})
	}
}

// TestCheckerBoundsWaitForFaultsDrainsAndInterrupts: a message held by a
// fault, a drain or an interrupt is judged from the heal, the lift or the
// next message.
func TestCheckerBoundsWaitForFaultsDrainsAndInterrupts(t *testing.T) {
	for _, hold := range []string{"fault", "drain", "interrupt"} {
		t.Run(hold, func(t *testing.T) {
			b := newHist(t)
			b.child("A", 0)
			f := b.op(&Op{Kind: OpFollowup, Sender: tRoot, Child: "A", MessageID: "held"})
			at := b.now
			switch hold {
			case "fault":
				b.h.Faults = []FaultRecord{{Class: FaultIsolate, Start: at - 10, End: at + 100_000}}
			case "drain":
				b.op(&Op{Kind: OpDrain, Scope: "parent", Targets: []string{tRoot}})
				b.now += 100_000
				b.op(&Op{Kind: OpLift, Scope: "parent", Targets: []string{tRoot}})
			case "interrupt":
				b.op(&Op{Kind: OpInterrupt, Child: "A"})
				b.now += 100_000
				next := b.op(&Op{Kind: OpFollowup, Sender: "grant:x", Child: "A", MessageID: "next"})
				defer b.turn("A", "next", "say "+Marker(next.ID))
			}
			b.now = at + 130_000
			b.turn("A", "held", "say "+Marker(f.ID))
			r := b.check()
			if !r.Verdict("L1").Holds() {
				t.Fatalf("held by a %s, yet judged late: %v", hold, r.Verdict("L1").Examples)
			}
		})
	}
}
