package agent

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// stallingModel is the scripted model, except that its request number
// stallAt (from 1) tells reached and waits until its context is done: the
// model request a host has in flight when it dies.
type stallingModel struct {
	*model.Scripted
	stallAt  int64
	requests atomic.Int64
	reached  chan struct{}
}

func (m *stallingModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	if m.requests.Add(1) == m.stallAt {
		close(m.reached)
		<-ctx.Done()
		return model.Response{}, ctx.Err()
	}
	return m.Scripted.Stream(ctx, req, onText)
}

// probeTool counts its runs; with stall set, each run tells running and
// waits until its context is done (a call in flight when its host dies).
func probeTool(name string, idempotent bool, runs *atomic.Int64, stall bool, running chan<- string) *Tool {
	return &Tool{
		Name: name, Description: "probe", Parameters: json.RawMessage(`{"type":"object"}`), Idempotent: idempotent,
		Run: func(ctx context.Context, _ ToolContext, _ string) ToolResult {
			runs.Add(1)
			if stall {
				running <- name
				<-ctx.Done()
				return ErrorResult("%s cancelled", name)
			}
			return TextResult(name + " ran")
		},
	}
}

// deadHostLog runs script's turn on an agent (model m, tools) and stops it
// as a host that lost its lease stops (ErrLeaseLost: nothing more is
// appended) once stalled is closed: the log a host that died then leaves.
func deadHostLog(t *testing.T, m model.Model, tools *Registry, script string, stalled <-chan struct{}) []protocol.SessionEvent {
	t.Helper()
	a, err := New(Config{Header: protocol.SessionHeader{ID: "S1"}, Credential: "cred1", Log: &memLog{}, Model: m, Tools: tools})
	must(t, err)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	go func() {
		<-stalled
		cancel(ErrLeaseLost)
	}()
	if out := a.RunTurn(ctx, userInput(script)); !out.Fenced {
		t.Fatalf("the dead host's turn ended %+v; want it stopped with nothing appended", out)
	}
	return a.Events()
}

// TestAContinuedTurnRedoesNothingTheLogHolds (issue 31, item 2): a turn
// whose host died is continued by an agent built over its log
// (ContinueTurn): the steps the log holds are not run again (one
// step/start per step, one result per call); the model request that was
// in flight is sent again; of the calls logged without a result, the
// idempotent tool's is run again and the other one's result says it was
// interrupted by a host loss and may or may not have taken effect; the
// turn is one turn, which completes.
func TestAContinuedTurnRedoesNothingTheLogHolds(t *testing.T) {
	t.Run("the model request in flight is sent again", func(t *testing.T) {
		var ro, rw atomic.Int64
		tools, err := NewRegistry(probeTool("probe_ro", true, &ro, false, nil), probeTool("probe_rw", false, &rw, false, nil))
		must(t, err)
		script := "call probe_rw {}\nsleep 0s\ncall probe_ro {}\nsay done" // three steps
		dead := &stallingModel{Scripted: model.NewScripted(), stallAt: 3, reached: make(chan struct{})}
		events := deadHostLog(t, dead, tools, script, dead.reached)
		if rw.Load() != 1 || ro.Load() != 1 {
			t.Fatalf("before the host died: probe_rw ran %d times, probe_ro %d; want 1 and 1", rw.Load(), ro.Load())
		}
		next := &stallingModel{Scripted: model.NewScripted()}
		out, evs := continueOver(t, events, next, tools)
		if out.Reason.Kind != protocol.TurnCompleted || out.Turn != 1 {
			t.Fatalf("the continued turn ended %+v; want turn 1 completed", out)
		}
		if n := next.requests.Load(); n != 1 {
			t.Errorf("the continuing agent made %d model requests; want 1 (the one in flight)", n)
		}
		if rw.Load() != 1 || ro.Load() != 1 {
			t.Errorf("completed calls ran again: probe_rw %d times, probe_ro %d", rw.Load(), ro.Load())
		}
		wantOnce(t, evs, 3, 2)
	})
	t.Run("calls in flight: the idempotent one runs again, the other is reported interrupted", func(t *testing.T) {
		var ro, rw atomic.Int64
		running := make(chan string, 2)
		stalled := make(chan struct{})
		dead, err := NewRegistry(probeTool("probe_ro", true, &ro, true, running), probeTool("probe_rw", false, &rw, true, running))
		must(t, err)
		go func() {
			<-running
			<-running
			close(stalled)
		}()
		script := "call probe_ro {}\ncall probe_rw {}\nsay done"
		events := deadHostLog(t, model.NewScripted(), dead, script, stalled)
		var ro2, rw2 atomic.Int64
		tools, err := NewRegistry(probeTool("probe_ro", true, &ro2, false, nil), probeTool("probe_rw", false, &rw2, false, nil))
		must(t, err)
		next := &stallingModel{Scripted: model.NewScripted()}
		out, evs := continueOver(t, events, next, tools)
		if out.Reason.Kind != protocol.TurnCompleted {
			t.Fatalf("the continued turn ended %+v; want completed", out)
		}
		if ro2.Load() != 1 || rw2.Load() != 0 {
			t.Errorf("after the loss: probe_ro ran %d times, probe_rw %d; want 1 and 0", ro2.Load(), rw2.Load())
		}
		if n := next.requests.Load(); n != 1 {
			t.Errorf("the continuing agent made %d model requests; want 1 (the step after the calls)", n)
		}
		results := wantOnce(t, evs, 2, 2)
		if r := results["probe_ro"]; r.IsError || protocol.PlainText(r.Content) != "probe_ro ran" {
			t.Errorf("probe_ro's result = %+v; want it run again", r)
		}
		if r := results["probe_rw"]; !r.IsError || !strings.Contains(protocol.PlainText(r.Content), "may or may not have taken effect") {
			t.Errorf("probe_rw's result = %+v; want it reported interrupted by a host loss", r)
		}
	})
	t.Run("nothing open: nothing is done", func(t *testing.T) {
		a, err := New(Config{Header: protocol.SessionHeader{ID: "S1"}, Log: &memLog{}, Model: model.NewScripted(), Tools: &Registry{local: map[string]bool{}}})
		must(t, err)
		if out := a.RunTurn(context.Background(), userInput("say hi")); out.Reason.Kind != protocol.TurnCompleted {
			t.Fatalf("turn = %+v", out)
		}
		log := &memLog{next: int64(a.EventCount())}
		b, err := New(Config{Header: protocol.SessionHeader{ID: "S1"}, Log: log, Events: a.Events(), Model: model.NewScripted(), Tools: &Registry{local: map[string]bool{}}})
		must(t, err)
		if out := b.ContinueTurn(context.Background()); out.Turn != 0 || len(log.records) != 0 {
			t.Fatalf("ContinueTurn over an ended turn: %+v, %d records", out, len(log.records))
		}
	})
}

// continueOver builds an agent over events (the log a dead host left) and
// continues its turn; it returns the outcome and the session's events.
func continueOver(t *testing.T, events []protocol.SessionEvent, m model.Model, tools *Registry) (Outcome, []protocol.SessionEvent) {
	t.Helper()
	b, err := New(Config{Header: protocol.SessionHeader{ID: "S1"}, Credential: "cred2", Log: &memLog{next: int64(len(events))}, Events: events, Model: m, Tools: tools})
	must(t, err)
	out := b.ContinueTurn(context.Background())
	return out, b.Events()
}

// wantOnce checks that events hold one turn with steps step/starts, each
// step once, and calls tool calls each with one result; it returns the
// results by tool name.
func wantOnce(t *testing.T, events []protocol.SessionEvent, steps, calls int) map[string]protocol.ToolResultData {
	t.Helper()
	seen := map[int64]int{}
	results := map[string]protocol.ToolResultData{}
	byCall := map[string]int{}
	counts := map[string]int{}
	for _, ev := range events {
		counts[ev.Type]++
		switch ev.Type {
		case protocol.EvStepStart:
			var d protocol.StepData
			must(t, ev.Decode(&d))
			seen[d.Step]++
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			must(t, ev.Decode(&d))
			results[d.Name] = d
			byCall[d.CallID]++
		}
	}
	if counts[protocol.EvTurnStart] != 1 || counts[protocol.EvTurnEnd] != 1 {
		t.Errorf("%d turn/start and %d turn/end; want one turn", counts[protocol.EvTurnStart], counts[protocol.EvTurnEnd])
	}
	if len(seen) != steps {
		t.Errorf("steps %v; want %d", seen, steps)
	}
	for s, n := range seen {
		if n != 1 {
			t.Errorf("step %d logged %d times", s, n)
		}
	}
	if counts[protocol.EvToolCall] != calls || len(byCall) != calls {
		t.Errorf("%d tool/call, results for %d calls; want %d each", counts[protocol.EvToolCall], len(byCall), calls)
	}
	for c, n := range byCall {
		if n != 1 {
			t.Errorf("call %s has %d results", c, n)
		}
	}
	return results
}
