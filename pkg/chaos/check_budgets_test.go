package chaos

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// budgeted gives child id (made by b.child: one turn, one model request
// with no usage reported) the budget limits, drawn on by the sessions
// listed (each a child made by b.child), and a ledger charged charged.
func (b *histBuilder) budgeted(id string, limits protocol.Budget, charged protocol.BudgetSpend, drawers ...string) *protocol.BudgetRecord {
	for _, s := range append([]string{id}, drawers...) {
		h := b.h.Snapshot.Headers[s]
		h.Budgets = append(h.Budgets, id)
		b.h.Snapshot.Headers[s] = h
	}
	if b.h.Snapshot.Budgets == nil {
		b.h.Snapshot.Budgets = map[string]protocol.BudgetRecord{}
	}
	b.h.Snapshot.Budgets[id] = protocol.BudgetRecord{SessionID: id, Limits: limits, Charged: charged, CreatedAt: b.now}
	rec := b.h.Snapshot.Budgets[id]
	return &rec
}

// spendTurn logs a turn of child: one step whose model reported in and
// out tokens and asked for calls tool calls, the first ran of them run
// (an ok result), the rest refused (an error result, not run).
func (b *histBuilder) spendTurn(child string, in, out int64, calls, ran int, end protocol.TurnEndReason) {
	n := int64(1)
	for _, ev := range b.h.Snapshot.Logs[child] {
		if ev.Type == protocol.EvTurnStart {
			n++
		}
	}
	var tcs []protocol.ToolCall
	for i := range calls {
		tcs = append(tcs, protocol.ToolCall{ID: "t" + string(rune('a'+i)), Name: "list_dir", Arguments: "{}"})
	}
	b.event(child, protocol.EvTurnStart, protocol.TurnData{Turn: n})
	b.event(child, protocol.EvStepStart, protocol.StepData{Turn: n, Step: 1})
	b.event(child, protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: n, Step: 1,
		Message: protocol.AssistantMessage{Content: protocol.Text("ok"), ToolCalls: tcs}, Usage: &protocol.Usage{InputTokens: in, OutputTokens: out}})
	for i, tc := range tcs {
		b.event(child, protocol.EvToolCall, protocol.ToolCallData{Turn: n, Step: 1, CallID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
		b.event(child, protocol.EvToolResult, protocol.ToolResultData{Turn: n, Step: 1, CallID: tc.ID, Name: tc.Name, Content: protocol.Text("r"), IsError: i >= ran})
	}
	b.event(child, protocol.EvStepEnd, protocol.StepData{Turn: n, Step: 1})
	if end.Kind == "" {
		end.Kind = protocol.TurnCompleted
	}
	b.event(child, protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: end})
}

// Budgets (I11): each case is a tree's logs and the ledger a build leaves;
// the checker must name exactly the invariants it breaks.
func TestCheckerBudgets(t *testing.T) {
	exhausted := protocol.TurnEndReason{Kind: protocol.TurnError, Code: protocol.CodeBudgetExhausted, Error: "the budget of A is spent"}
	cases := []struct {
		name   string
		mutate func(b *histBuilder)
		want   map[string]string
		check  func(t *testing.T, s Summary)
	}{
		{"charged what the logs show, at the cap", func(b *histBuilder) {
			b.child("A", 0)
			b.spendTurn("A", 30, 10, 2, 1, exhausted)
			// 2 model requests (b.child's step reports no usage), 40
			// tokens, 1 tool call run (the other refused).
			b.budgeted("A", protocol.Budget{Tokens: 40, ModelRequests: 2, ToolCalls: 1}, protocol.BudgetSpend{Tokens: 40, ModelRequests: 2, ToolCalls: 1})
		}, nil, func(t *testing.T, s Summary) {
			if s.Budgets != 1 || s.BudgetLimitsReached != 3 || s.BudgetTurnsExhausted != 1 || s.BudgetTokensLogged != 40 || s.BudgetTokensCharged != 40 {
				t.Errorf("summary %+v", s)
			}
		}},
		{"a dead host's reservation charged in full, above the logs", func(b *histBuilder) {
			b.child("A", 0)
			b.spendTurn("A", 30, 10, 0, 0, protocol.TurnEndReason{})
			b.budgeted("A", protocol.Budget{Tokens: 500}, protocol.BudgetSpend{Tokens: 40 + 200, ModelRequests: 3})
		}, nil, nil},
		{"a reservation of a settled run left in flight counts as charged", func(b *histBuilder) {
			b.child("A", 0)
			b.spendTurn("A", 30, 10, 0, 0, protocol.TurnEndReason{})
			rec := b.budgeted("A", protocol.Budget{Tokens: 100}, protocol.BudgetSpend{Tokens: 10, ModelRequests: 1})
			rec.Reservations = []protocol.BudgetReservation{{ID: "r1", SessionID: "A", RunID: "A-e1", Spend: protocol.BudgetSpend{Tokens: 60, ModelRequests: 1}}}
			b.h.Snapshot.Budgets["A"] = *rec
		}, nil, func(t *testing.T, s Summary) {
			if s.BudgetReservations != 1 || s.BudgetReservationsLeft != 1 {
				t.Errorf("summary %+v", s)
			}
		}},
		{"a model request without a reservation: the ledger below the logs", func(b *histBuilder) {
			b.child("A", 0)
			b.spendTurn("A", 30, 10, 0, 0, protocol.TurnEndReason{})
			b.budgeted("A", protocol.Budget{Tokens: 500}, protocol.BudgetSpend{ModelRequests: 1})
		}, map[string]string{"I11": "charged and reserved 0 tokens, less than its tree's logs show (40 over 1 sessions)"}, nil},
		{"a tool call run without a reservation", func(b *histBuilder) {
			b.child("A", 0)
			b.spendTurn("A", 30, 10, 2, 2, protocol.TurnEndReason{})
			b.budgeted("A", protocol.Budget{ToolCalls: 5}, protocol.BudgetSpend{Tokens: 40, ModelRequests: 2, ToolCalls: 1})
		}, map[string]string{"I11": "charged and reserved 1 toolCalls, less than its tree's logs show (2"}, nil},
		{"a dead host's reservation charged twice: the ledger over its limit", func(b *histBuilder) {
			b.child("A", 0)
			b.spendTurn("A", 30, 10, 0, 0, protocol.TurnEndReason{})
			b.budgeted("A", protocol.Budget{ModelRequests: 2}, protocol.BudgetSpend{Tokens: 40, ModelRequests: 3})
		}, map[string]string{"I11": "charged and reserved 3 modelRequests, over its limit of 2"}, nil},
		{"the tree's logs over the limit", func(b *histBuilder) {
			b.child("A", 0)
			b.child("B", 0)
			b.spendTurn("A", 30, 10, 0, 0, protocol.TurnEndReason{})
			b.spendTurn("B", 30, 10, 0, 0, protocol.TurnEndReason{})
			b.budgeted("A", protocol.Budget{Tokens: 60}, protocol.BudgetSpend{Tokens: 40, ModelRequests: 4}, "B")
		}, map[string]string{"I11": "its tree's logs (2 sessions) show 80 tokens, over its limit of 60"}, nil},
		{"children started, each charged", func(b *histBuilder) {
			b.child("A", 0)
			b.child("B", 0)
			b.child("C", 0)
			b.budgeted("A", protocol.Budget{Children: 2}, protocol.BudgetSpend{ModelRequests: 3, Children: 2}, "B", "C")
		}, nil, nil},
		{"a child started uncharged", func(b *histBuilder) {
			b.child("A", 0)
			b.child("B", 0)
			b.budgeted("A", protocol.Budget{Children: 2}, protocol.BudgetSpend{ModelRequests: 2}, "B")
		}, map[string]string{"I11": "charged and reserved 0 children, less than its tree's logs show (1"}, nil},
		{"a session lists a budget with no ledger", func(b *histBuilder) {
			b.child("A", 0)
			h := b.h.Snapshot.Headers["A"]
			h.Budgets = []string{"GONE"}
			b.h.Snapshot.Headers["A"] = h
		}, map[string]string{"I11": "draws on budget GONE, which has no ledger"}, nil},
		{"a reservation held twice", func(b *histBuilder) {
			b.child("A", 0)
			rec := b.budgeted("A", protocol.Budget{Tokens: 100}, protocol.BudgetSpend{ModelRequests: 1})
			r := protocol.BudgetReservation{ID: "r1", SessionID: "A", Spend: protocol.BudgetSpend{Tokens: 10}}
			rec.Reservations = []protocol.BudgetReservation{r, r}
			b.h.Snapshot.Budgets["A"] = *rec
		}, map[string]string{"I11": "holds reservation r1 twice"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHist(t)
			tc.mutate(b)
			r := b.check()
			expect(t, r, tc.want)
			if r.Verdict("I11").Checked == 0 {
				t.Error("I11 checked nothing")
			}
			if tc.check != nil {
				tc.check(t, r.Summary)
			}
		})
	}
}

// budgetPause logs a turn of child paused at its budget's cap: its step's
// model request refused, a request of kind budget opened (call id
// budget-t<turn>-s1-1, no tool call); it returns the turn and request id.
func (b *histBuilder) budgetPause(child string) (int64, string) {
	n := int64(1)
	for _, ev := range b.h.Snapshot.Logs[child] {
		if ev.Type == protocol.EvTurnStart {
			n++
		}
	}
	callID := "budget-t" + string(rune('0'+n)) + "-s1-1"
	rid := protocol.RequestID(child, callID)
	b.event(child, protocol.EvTurnStart, protocol.TurnData{Turn: n})
	b.event(child, protocol.EvRequestOpen, protocol.RequestOpenData{RequestID: rid, Kind: protocol.RequestBudget, Turn: n, Step: 1, CallID: callID,
		Deadline: b.now + 8000})
	if b.h.Snapshot.Requests == nil {
		b.h.Snapshot.Requests = map[string]protocol.RequestRecord{}
	}
	b.h.Snapshot.Requests[rid] = protocol.RequestRecord{Version: 1, ID: rid, SessionID: child, Kind: protocol.RequestBudget, CallID: callID,
		State: protocol.RequestPending, CreatedAt: b.now, Deadline: b.now + 8000}
	return n, rid
}

// raised answers child's budget request rid by a raise (an OpRaise that
// resumed it, the record approved by the user, the answer logged).
func (b *histBuilder) raised(child, rid string, turn int64) {
	rec := b.h.Snapshot.Requests[rid]
	rec.State, rec.Answer = protocol.RequestApproved, &protocol.RequestAnswer{State: protocol.RequestApproved, By: byUser, At: b.tick(), ID: "r1",
		Reason: "budget raised: tokens=+100"}
	b.h.Snapshot.Requests[rid] = rec
	b.op(&Op{Kind: OpRaise, Sender: "grant:client-1", Child: child, RequestID: rid, Verb: verbRaise, Budget: &protocol.Budget{Tokens: 100}, Targets: []string{rid}})
	b.event(child, protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: rid, CallID: rec.CallID, State: protocol.RequestApproved, By: byUser})
	b.event(child, protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1})
	b.event(child, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 1})
}

// A continuable child paused at its budget's cap (kind budget: no call,
// no result) is judged by I10 as its turn tells: answered approved (by a
// raise) its turn goes on and ends once, or pauses again; denied or timed
// out it ends BUDGET_EXHAUSTED, never completed; each answer taken once.
func TestCheckerBudgetPauses(t *testing.T) {
	exhausted := protocol.TurnEndReason{Kind: protocol.TurnError, Code: protocol.CodeBudgetExhausted}
	cases := []struct {
		name   string
		mutate func(b *histBuilder)
		want   map[string]string
	}{
		{"denied: the turn ends BUDGET_EXHAUSTED", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			rec := b.h.Snapshot.Requests[rid]
			rec.State, rec.Answer = protocol.RequestDenied, &protocol.RequestAnswer{State: protocol.RequestDenied, By: byUser, At: b.tick(), ID: "x1"}
			b.h.Snapshot.Requests[rid] = rec
			b.answerOp(rid, protocol.AnswerDeny, "x1", protocol.RequestDenied, "")
			b.event("A", protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: rid, CallID: rec.CallID, State: protocol.RequestDenied, By: byUser})
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: exhausted})
		}, nil},
		{"closed with its aborted turn", func(b *histBuilder) {
			b.child("A", 0)
			n, _ := b.budgetPause("A")
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnAborted}})
		}, nil},
		{"raised: the same turn goes on and completes once", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			b.raised("A", rid, n)
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, nil},
		{"raised, paused again, then denied: BUDGET_EXHAUSTED", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			b.raised("A", rid, n)
			callID := "budget-t2-s1-2"
			rid2 := protocol.RequestID("A", callID)
			b.event("A", protocol.EvRequestOpen, protocol.RequestOpenData{RequestID: rid2, Kind: protocol.RequestBudget, Turn: n, Step: 1, CallID: callID, Deadline: b.now + 8000})
			b.h.Snapshot.Requests[rid2] = protocol.RequestRecord{Version: 1, ID: rid2, SessionID: "A", Kind: protocol.RequestBudget, CallID: callID,
				State: protocol.RequestDenied, CreatedAt: b.now, Deadline: b.now + 8000, Answer: &protocol.RequestAnswer{State: protocol.RequestDenied, By: byUser, At: b.tick(), ID: "x2"}}
			b.answerOp(rid2, protocol.AnswerDeny, "x2", protocol.RequestDenied, "")
			b.event("A", protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: rid2, CallID: callID, State: protocol.RequestDenied, By: byUser})
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: exhausted})
		}, nil},
		{"raised, and its turn ended twice (resumed twice)", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			b.raised("A", rid, n)
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, map[string]string{"I10": "its turn 2 ended 2 times", "I7": "turn/end without an open turn"}},
		{"a raise and a denial both taken", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			b.raised("A", rid, n)
			b.answerOp(rid, protocol.AnswerDeny, "x9", protocol.RequestDenied, "")
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, map[string]string{"I10": "2 answers were taken"}},
		{"denied, yet its turn completed", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			rec := b.h.Snapshot.Requests[rid]
			rec.State, rec.Answer = protocol.RequestDenied, &protocol.RequestAnswer{State: protocol.RequestDenied, By: byUser, At: b.tick(), ID: "x1"}
			b.h.Snapshot.Requests[rid] = rec
			b.answerOp(rid, protocol.AnswerDeny, "x1", protocol.RequestDenied, "")
			b.event("A", protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: rid, CallID: rec.CallID, State: protocol.RequestDenied, By: byUser})
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, map[string]string{"I10": "was denied at"}},
		{"timed out, and its turn ended error with another code", func(b *histBuilder) {
			b.child("A", 0)
			n, rid := b.budgetPause("A")
			rec := b.h.Snapshot.Requests[rid]
			rec.State, rec.Answer = protocol.RequestTimedOut, &protocol.RequestAnswer{State: protocol.RequestTimedOut, By: byTimeout, At: b.tick(), ID: "x1"}
			b.h.Snapshot.Requests[rid] = rec
			b.event("A", protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: rid, CallID: rec.CallID, State: protocol.RequestTimedOut, By: byTimeout})
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnError, Code: protocol.CodeInternal}})
		}, map[string]string{"I10": "ended error INTERNAL, not BUDGET_EXHAUSTED"}},
		{"never answered, yet its turn completed", func(b *histBuilder) {
			b.child("A", 0)
			n, _ := b.budgetPause("A")
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, map[string]string{"I10": "was never answered in its log, yet its turn 2 completed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHist(t)
			tc.mutate(b)
			r := b.check()
			expect(t, r, tc.want)
			if r.Verdict("I10").Checked == 0 {
				t.Error("I10 checked nothing")
			}
		})
	}
}
