package chaos

import (
	"flag"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

var explainSession = flag.String("chaos.explain", "", "a session for TestExplainSession to show from the -chaos.check history")

// TestExplainSession prints what a saved history knows of one session (its
// header, log, run records, lifecycle events, lease, pending inbox items,
// the operations on it) and the faults, times from the history's start:
//
//	go test ./pkg/chaos -run TestExplainSession -v -chaos.check=FILE -chaos.explain=SESSION
func TestExplainSession(t *testing.T) {
	if *checkHistory == "" || *explainSession == "" {
		t.Skip("needs -chaos.check and -chaos.explain")
	}
	h, err := LoadHistory(*checkHistory)
	if err != nil {
		t.Fatal(err)
	}
	s := h.Snapshot
	at := func(ms int64) float64 { return float64(ms-h.Start) / 1000 }
	t.Logf("header %+v", s.Headers[*explainSession])
	for _, ev := range s.Logs[*explainSession] {
		var d any
		_ = protocol.Unmarshal(protocol.Msgpack, ev.Data, &d)
		t.Logf("%d +%.3f %s %v", ev.Seq, at(ev.Time), ev.Type, d)
	}
	for _, r := range s.Runs {
		if r.ChildID == *explainSession {
			t.Logf("run %s %s created +%.3f settled +%.3f by %s %+v", r.RunID, r.State, at(r.CreatedAt), at(r.SettledAt), r.SettledBy, r.Result)
		}
	}
	for _, ev := range s.Lifecycle {
		if ev.ID == *explainSession {
			t.Logf("lifecycle %s run %s +%.3f %s", ev.Type, ev.RunID, at(ev.Time), ev.StopReason)
		}
	}
	t.Logf("agent %+v", s.Agents[*explainSession])
	for _, it := range s.Inbox[*explainSession] {
		t.Logf("pending %+v", it)
	}
	for _, op := range h.Ops {
		if op.Child == *explainSession || op.Root == *explainSession {
			t.Logf("op %d %s %s +%.3f..+%.3f %s %s %s", op.ID, op.Kind, op.Sender, at(op.Invoke), at(op.Complete), op.Outcome, op.Code, op.MessageID)
		}
	}
	for _, f := range h.Faults {
		t.Logf("fault %s %s +%.3f..+%.3f", f.Class, f.Target, at(f.Start), at(f.End))
	}
}
