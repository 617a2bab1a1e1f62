package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// parkedLog runs script's turn in an agent whose requests are never
// answered, and stops it once its call is parked (request/open logged) the
// way a host that lost its lease stops, appending nothing more: the log a
// host that died while the call waited leaves behind.
func parkedLog(t *testing.T, ws string, tools *Registry, script string) []protocol.SessionEvent {
	t.Helper()
	req := &testutil.Requests{Reading: make(chan struct{})}
	a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: ws}, Credential: "cred1", Log: &memLog{}, Model: model.NewScripted(),
		Tools: tools, Requests: req})
	must(t, err)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// The call is parked once it reads its request: request/open is logged
	// before the first read.
	go func() {
		select {
		case <-req.Reading:
			cancel(ErrLeaseLost)
		case <-ctx.Done():
		}
	}()
	if out := a.RunTurn(ctx, userInput(script)); !out.Fenced {
		t.Fatalf("the parked turn ended %+v; want it stopped with nothing appended", out)
	}
	return a.Events()
}

// TestAParkedTurnContinuesFromTheLog (issue 33, item 1): a turn whose host
// died while a call waited for its request is continued by the session's
// next agent, built over the log: the request is read again with the new
// agent's own credential (never opened again), its answer logged once, the
// approved tool run once (or the denial, the question's answer given), and
// the turn goes on with its next step to its end. A call whose answer was
// logged before the host died is not run again; a call that ran beside the
// parked one gets an interrupted result. The turn is one turn: one
// turn/start, one turn/end.
func TestAParkedTurnContinuesFromTheLog(t *testing.T) {
	const write = `call write_file {"path":"x.txt","content":"hi"}`
	tests := []struct {
		name     string
		script   string
		answered string // a request/answer the dead host logged, when set
		req      *testutil.Requests
		written  bool
		results  []string // the parked step's results, in call order
		trail    string
	}{
		{"approved after the restart", write + "\nsay done", "", &testutil.Requests{State: protocol.RequestApproved, Polls: 2}, true,
			[]string{"wrote 2 bytes"}, "tool/call request/open request/answer tool/result"},
		{"denied after the restart", write + "\nsay done", "", &testutil.Requests{State: protocol.RequestDenied, Reason: "no", Polls: 2}, false,
			[]string{"denied by the user: no"}, "tool/call request/open request/answer tool/result"},
		{"timed out after the restart", write + "\nsay done", "", &testutil.Requests{State: protocol.RequestTimedOut, Polls: 2}, false,
			[]string{"timed out, which counts as a denial"}, "tool/call request/open request/answer tool/result"},
		{"a question answered after the restart", `call ask {"question":"Which?","choices":["a","b"]}` + "\nsay done", "",
			&testutil.Requests{State: protocol.RequestAnswered, Text: "b", Polls: 2}, false, []string{"b"}, "tool/call request/open request/answer tool/result"},
		{"approved before the host died", write + "\nsay done", protocol.RequestApproved, &testutil.Requests{}, false,
			[]string{"it may have run, and it is not run again"}, "tool/call request/open request/answer tool/result"},
		{"denied before the host died", write + "\nsay done", protocol.RequestDenied, &testutil.Requests{}, false,
			[]string{"denied by the user"}, "tool/call request/open request/answer tool/result"},
		{"a call beside the parked one", `call list_dir {"path":"."}` + "\n" + write + "\nsay done", "", &testutil.Requests{State: protocol.RequestApproved, Polls: 2}, true,
			[]string{"interrupted", "wrote 2 bytes"}, "tool/call tool/call request/open request/answer tool/result"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := t.TempDir()
			tools, err := NewRegistry(WriteFileTool(ws), ListDirTool(ws), AskTool())
			must(t, err)
			events := parkedLog(t, ws, tools, tt.script)
			p, ok := sessionlog.Parked(events)
			if !ok || len(p.Pending) == 0 {
				t.Fatalf("the log a dead host left is not parked: %+v", p)
			}
			if tt.answered != "" {
				pc := p.Pending[len(p.Pending)-1]
				ev, err := protocol.NewEvent(protocol.EvRequestAnswer, 1, protocol.RequestAnswerData{RequestID: pc.Open.RequestID, CallID: pc.Call.CallID,
					State: tt.answered, By: protocol.Answerer{Kind: protocol.AnswererUser}})
				must(t, err)
				ev.Seq = int64(len(events))
				events = append(events, ev)
				if _, ok := sessionlog.Parked(events); ok {
					t.Fatal("a turn whose only request was answered in the log still reads as parked")
				}
			}
			log := &memLog{next: int64(len(events))}
			b, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: ws}, Credential: "cred2", Log: log, Events: events,
				Model: model.NewScripted(), Tools: tools, Requests: tt.req})
			must(t, err)
			if tt.answered != "" {
				if b.ParkedTurn() {
					t.Fatal("ParkedTurn over a log whose answer was logged")
				}
				// Whoever resumes it closes it, or continues what is left:
				// ContinueParked does nothing then.
				if out := b.ContinueParked(context.Background()); out.Turn != 0 || out.Reason.Kind != "" || len(log.records) != 0 {
					t.Fatalf("ContinueParked with nothing parked: %+v, %d records", out, len(log.records))
				}
				return
			}
			if !b.ParkedTurn() {
				t.Fatal("ParkedTurn = false over a parked log")
			}
			out := b.ContinueParked(context.Background())
			if out.Reason.Kind != protocol.TurnCompleted || out.Turn != 1 || out.Fenced || out.Err != nil {
				t.Fatalf("the continued turn ended %+v; want turn 1 completed", out)
			}
			var trail, results []string
			starts, ends := 0, 0
			for _, ev := range b.Events() {
				switch ev.Type {
				case protocol.EvTurnStart:
					starts++
				case protocol.EvTurnEnd:
					ends++
				case protocol.EvToolCall, protocol.EvRequestOpen, protocol.EvRequestAnswer:
					trail = append(trail, ev.Type)
				case protocol.EvToolResult:
					trail = append(trail, ev.Type)
					var d protocol.ToolResultData
					must(t, ev.Decode(&d))
					results = append(results, protocol.PlainText(d.Content))
				}
			}
			if starts != 1 || ends != 1 {
				t.Fatalf("%d turn/start and %d turn/end; want the one turn, continued", starts, ends)
			}
			if got := strings.Join(trail, " "); !strings.HasPrefix(got, tt.trail) {
				t.Fatalf("trail %q, want it to begin %q", got, tt.trail)
			}
			if len(results) != len(tt.results) {
				t.Fatalf("results %q, want %d", results, len(tt.results))
			}
			for i, want := range tt.results {
				if !strings.Contains(results[i], want) {
					t.Fatalf("result %d = %q, want %q", i, results[i], want)
				}
			}
			if _, err := os.Stat(filepath.Join(ws, "x.txt")); (err == nil) != tt.written {
				t.Fatalf("x.txt written %v, want %v", err == nil, tt.written)
			}
			if len(tt.req.Opened()) != 0 {
				t.Fatalf("the continued turn opened %+v; the request was opened before the host died", tt.req.Opened())
			}
			if tt.req.Reads() == 0 {
				t.Fatal("the continued turn never read its request")
			}
			if b.ParkedTurn() {
				t.Fatal("still parked after the turn ended")
			}
		})
	}
}

// TestAContinuedTurnReadsItsRequestAsItsNewAgent: the request is read with
// the resumed agent's own credential, the only one its coordinator takes
// once the session's lease is the new epoch's: a read with another is
// refused UNAUTHORIZED, and the approved call would not run.
func TestAContinuedTurnReadsItsRequestAsItsNewAgent(t *testing.T) {
	ws := t.TempDir()
	tools, err := NewRegistry(WriteFileTool(ws))
	must(t, err)
	events := parkedLog(t, ws, tools, `call write_file {"path":"x.txt","content":"hi"}`+"\nsay done")
	req := &testutil.Requests{Credential: "cred2", State: protocol.RequestApproved, Polls: 2}
	b, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: ws}, Credential: "cred2", Log: &memLog{next: int64(len(events))}, Events: events,
		Model: model.NewScripted(), Tools: tools, Requests: req})
	must(t, err)
	if out := b.ContinueParked(context.Background()); out.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("outcome %+v", out)
	}
	if _, err := os.Stat(filepath.Join(ws, "x.txt")); err != nil || req.Reads() == 0 {
		t.Fatalf("after %d reads the approved call did not run (%v): a read was refused", req.Reads(), err)
	}
}
