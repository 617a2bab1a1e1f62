package acpbridge

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// ledger is a child's budget of model requests and the coordinator's
// budget requests as the child sees them: a reservation past the
// requests left is refused BUDGET_EXHAUSTED; a budget request opens
// pending (Requests, read with the child's credential only) and reads as
// answer set it (an approval, a raise, adds one request to the ledger).
type ledger struct {
	testutil.Requests
	mu       sync.Mutex
	left     int64
	reserved int
	settled  int
}

func (l *ledger) ReserveBudget(_ context.Context, r protocol.BudgetReserveRequest) (protocol.BudgetReserveReply, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Self.Credential != "child-cred" {
		return protocol.BudgetReserveReply{}, protocol.Errorf(protocol.CodeUnauthorized, "not the child's credential")
	}
	if l.left < r.Want.ModelRequests {
		return protocol.BudgetReserveReply{}, protocol.BudgetExhausted("c", protocol.BudgetLimitModelRequests, "requests", 1, 1)
	}
	l.left -= r.Want.ModelRequests
	l.reserved++
	return protocol.BudgetReserveReply{ReservationID: fmt.Sprintf("res-%d", l.reserved), Granted: r.Want}, nil
}

func (l *ledger) SettleBudget(context.Context, protocol.BudgetSettleRequest) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settled++
	return nil
}

// answer answers the budget requests: approved raises the ledger by one
// request first, as budget.raise does.
func (l *ledger) answer(state, reason string) {
	l.mu.Lock()
	if state == protocol.RequestApproved {
		l.left++
	}
	l.mu.Unlock()
	l.Answer(state, reason)
}

// pausedSession is a continuable ACP child of the fake agent that draws
// on the ledger l, logging to log over events (a restart's log).
func pausedSession(t *testing.T, l *ledger, log *memLog) *Session {
	t.Helper()
	o := testOptions(t)
	o.Requests, o.Budget = l, l
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t)}, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.NewSession(context.Background(), provider.SessionSpec{Header: protocol.SessionHeader{ID: "c", Cwd: t.TempDir(), Budgets: []string{"c"}},
		Credential: "child-cred", Log: log, Events: log.events(), Continuable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.(provider.Closer).Close() })
	return s.(*Session)
}

// awaitPause waits until s's running turn is paused at its budget's cap
// and checks what its log says then: the budget request open in the open
// turn, no step started since, the turn parked (sessionlog.Parked), as
// children.list reads it.
func awaitPause(t *testing.T, s *Session, log *memLog) *protocol.RequestOpenData {
	t.Helper()
	var pause *protocol.RequestOpenData
	testutil.Eventually(t, 10*time.Second, func() bool { pause = s.BudgetPause(); return pause != nil }, "the turn pauses at its budget's cap")
	evs := log.events()
	if p, ok := sessionlog.Parked(evs); !ok || p.Budget == nil || p.Budget.RequestID != pause.RequestID || len(p.Pending) != 0 {
		t.Fatalf("the log's parked turn %+v, %v; want paused on %s", p, ok, pause.RequestID)
	}
	if last := evs[len(evs)-1]; last.Type != protocol.EvRequestOpen {
		t.Fatalf("the log ends in %s; want the pause's request/open, no step started", last.Type)
	}
	return pause
}

// turnEnds returns the turn/end reasons in evs and how many turns started.
func turnEnds(evs []protocol.SessionEvent) (ends []protocol.TurnEndReason, starts int) {
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvTurnStart:
			starts++
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			_ = ev.Decode(&d)
			ends = append(ends, d.Reason)
		}
	}
	return ends, starts
}

// TestSessionPausesAtItsBudgetsCap (issue 32, item 3; docs/protocol.md
// §5.5, "Pause and raise"): a continuable ACP child whose reservation is
// refused BUDGET_EXHAUSTED pauses before its prompt on a request of kind
// budget (BudgetPause, the log's parked turn), its agent process resident
// and idle; a raise continues the same turn, which prompts the same ACP
// session and completes (one turn end); a denial or a timeout ends the
// turn BUDGET_EXHAUSTED, the prompt never sent.
func TestSessionPausesAtItsBudgetsCap(t *testing.T) {
	tests := []struct {
		name   string
		answer string
		reason string
		want   protocol.TurnEndReason
		diag   string
	}{
		{"raised", protocol.RequestApproved, "", protocol.TurnEndReason{Kind: protocol.TurnCompleted}, ""},
		{"denied", protocol.RequestDenied, "not now",
			protocol.TurnEndReason{Kind: protocol.TurnError, Code: protocol.CodeBudgetExhausted}, "ended denied by the user: not now"},
		{"timed out", protocol.RequestTimedOut, "",
			protocol.TurnEndReason{Kind: protocol.TurnError, Code: protocol.CodeBudgetExhausted}, "none came in time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &ledger{left: 1, Requests: testutil.Requests{Credential: "child-cred"}}
			log := &memLog{}
			s := pausedSession(t, l, log)
			if r, out := turn(t, s, log, "echo one"); r.Kind != protocol.TurnCompleted || out != "echo: one" {
				t.Fatalf("the first turn: %+v %q", r, out)
			}
			ctx := context.Background()
			before := len(log.events())
			if out, ok := s.OpenTurn(ctx, provider.Input{Content: protocol.Text("echo two"), Source: protocol.MessageSource{Kind: protocol.SourceUser}}); !ok {
				t.Fatalf("open turn: %+v", out)
			}
			done := make(chan provider.Outcome, 1)
			go func() { done <- s.RunSteps(ctx) }()
			pause := awaitPause(t, s, log)
			reqs := l.Opened()
			if len(reqs) != 1 || reqs[0].Kind != protocol.RequestBudget || reqs[0].Turn != 2 || reqs[0].Step != 1 || reqs[0].BudgetOf != "c" ||
				reqs[0].CallID != "budget-t2-s1-1" || pause.RequestID != protocol.RequestID("c", "budget-t2-s1-1") || reqs[0].Exhausted == "" {
				t.Fatalf("requests opened %+v, pause %+v; want one budget request of turn 2, step 1, of ledger c", reqs, pause)
			}
			l.answer(tt.answer, tt.reason)
			var out provider.Outcome
			select {
			case out = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the paused turn did not end after its answer")
			}
			if out.Err != nil || out.Fenced || out.Reason.Kind != tt.want.Kind || out.Reason.Code != tt.want.Code || !strings.Contains(out.Reason.Error, tt.diag) {
				t.Fatalf("outcome %+v; want %+v saying %q", out, tt.want, tt.diag)
			}
			if s.BudgetPause() != nil {
				t.Fatal("the turn ended and still shows paused")
			}
			evs := log.events()
			ends, starts := turnEnds(evs[before:])
			if starts != 1 || len(ends) != 1 || ends[0].Kind != tt.want.Kind {
				t.Fatalf("turn 2: %d starts, ends %+v; want one turn, one end", starts, ends)
			}
			got := trail(t, evs[before:])
			if got != "request/open request/answer" {
				t.Fatalf("turn 2's requests: %q", got)
			}
			text := protocol.PlainText(sessionlog.SelectOutput(evs[before:]))
			if n := len(acpSessions(evs)); n != 1 {
				t.Fatalf("%d ACP sessions; want the first one's agent prompted again", n)
			}
			if tt.answer == protocol.RequestApproved && text != "echo: two" {
				t.Fatalf("the raised turn's answer %q; want the prompt of the same turn answered", text)
			}
			if tt.answer != protocol.RequestApproved && strings.Contains(strings.Join(typesOf(evs[before:]), " "), protocol.EvStepStart) {
				t.Fatalf("a prompt was sent after the pause ended %s: %v", tt.answer, typesOf(evs[before:]))
			}
			if err := sessionlog.ValidateReplay(evs, false); err != nil {
				t.Fatalf("the log does not replay: %v", err)
			}
		})
	}
}

// TestSessionPauseSurvivesItsBridge (issue 32, item 3): a turn paused at
// its budget's cap when its bridge stops (its lease lost: nothing more is
// logged) is left open; a Session built over its log finds it parked
// (ParkedTurn), waits on the same request (none opened again) showing
// paused, and once raised starts the agent and prompts the turn's own
// message: one turn, one end.
func TestSessionPauseSurvivesItsBridge(t *testing.T) {
	l := &ledger{Requests: testutil.Requests{Credential: "child-cred"}}
	log := &memLog{}
	first := pausedSession(t, l, log)
	ctx, stop := context.WithCancelCause(context.Background())
	if out, ok := first.OpenTurn(ctx, provider.Input{Content: protocol.Text("echo paused"), Source: protocol.MessageSource{Kind: protocol.SourceUser}}); !ok {
		t.Fatalf("open turn: %+v", out)
	}
	done := make(chan provider.Outcome, 1)
	go func() { done <- first.RunSteps(ctx) }()
	pause := awaitPause(t, first, log)
	stop(provider.ErrLeaseLost)
	if out := <-done; !out.Fenced {
		t.Fatalf("the first bridge's turn: %+v; want fenced, nothing logged", out)
	}
	if _, ok := sessionlog.Parked(log.events()); !ok {
		t.Fatal("the stopped bridge closed the paused turn")
	}

	again := pausedSession(t, l, log)
	if !again.ParkedTurn() {
		t.Fatal("a Session over the log does not find the paused turn")
	}
	go func() { done <- again.ContinueParked(context.Background()) }()
	if p := awaitPause(t, again, log); p.RequestID != pause.RequestID {
		t.Fatalf("paused again on %s; want the same request %s", p.RequestID, pause.RequestID)
	}
	if n := len(l.Opened()); n != 1 {
		t.Fatalf("%d requests opened; want the first one waited on again", n)
	}
	l.answer(protocol.RequestApproved, "")
	var out provider.Outcome
	select {
	case out = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the continued turn did not end after the raise")
	}
	if out.Err != nil || out.Reason.Kind != protocol.TurnCompleted || out.Turn != 1 {
		t.Fatalf("outcome %+v; want turn 1 completed", out)
	}
	evs := log.events()
	if ends, starts := turnEnds(evs); starts != 1 || len(ends) != 1 {
		t.Fatalf("%d starts, ends %+v; want one turn, one end", starts, ends)
	}
	if got := protocol.PlainText(sessionlog.SelectOutput(evs)); got != "echo: paused" {
		t.Fatalf("the continued turn's answer %q; want its own prompt answered", got)
	}
	if again.ParkedTurn() {
		t.Fatal("the turn still reads parked after it ended")
	}
	if err := sessionlog.ValidateReplay(evs, false); err != nil {
		t.Fatalf("the log does not replay: %v", err)
	}
}
