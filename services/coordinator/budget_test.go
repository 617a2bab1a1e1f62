package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestBudgetBadInput (issue 32, items 2 and 6): a budget that is negative,
// huge, not a whole number, NaN, empty, has an unknown key, or asks for
// more than remains of its parent's is refused with a typed error naming
// the field (and the unit), on runs.start, continuable.start and
// agents.open; nothing is started and nothing charged.
func TestBudgetBadInput(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	nc := s.Conn()
	subj := s.Store.Subj
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{Tokens: 1000, Children: 5, DeadlineMs: 600_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	parent, _ := json.Marshal(root.Ref())
	sessions := s.SessionCount()

	tests := []struct {
		name, budget string
		code         protocol.Code
		field        string // in details: field (INVALID_ARGUMENT) or limit (LIMIT_EXCEEDED)
	}{
		{"negative", `{"tokens":-1}`, protocol.CodeInvalidArgument, "budget.tokens"},
		{"huge", `{"toolCalls":9007199254740993}`, protocol.CodeInvalidArgument, "budget.toolCalls"},
		{"a deadline past 30 days", `{"deadlineMs":2592000001}`, protocol.CodeInvalidArgument, "budget.deadlineMs"},
		{"not a whole number", `{"tokens":1.5}`, protocol.CodeInvalidArgument, ""},
		{"NaN as a string", `{"modelRequests":"NaN"}`, protocol.CodeInvalidArgument, ""},
		{"NaN as a literal", `{"modelRequests":NaN}`, protocol.CodeInvalidArgument, ""},
		{"unknown key", `{"tokenz":5}`, protocol.CodeInvalidArgument, ""},
		{"no limit", `{}`, protocol.CodeInvalidArgument, "budget"},
		{"tokens above the parent's remainder", `{"tokens":1001}`, protocol.CodeLimitExceeded, "budget.tokens"},
		{"children above the parent's remainder", `{"children":5}`, protocol.CodeLimitExceeded, "budget.children"},
		{"a deadline past the parent's", `{"deadlineMs":900000}`, protocol.CodeLimitExceeded, "budget.deadlineMs"},
	}
	for _, ep := range []string{protocol.EpRunsStart, protocol.EpContinuableStart} {
		for _, tt := range tests {
			t.Run(ep+"/"+tt.name, func(t *testing.T) {
				body := fmt.Sprintf(`{"provider":"spawn","parent":%s,"label":"x","prompt":[{"type":"text","text":"say hi"}],"options":{"budget":%s}}`, parent, tt.budget)
				resp := rawReq(t, nc, subj.Coord(ep), body, jsonHeader())
				var pe protocol.Error
				if err := json.Unmarshal(resp.Data, &pe); err != nil || pe.Code != tt.code {
					t.Fatalf("reply %s, want %s", resp.Data, tt.code)
				}
				if tt.field != "" {
					got := fmt.Sprint(pe.Details["field"])
					if tt.code == protocol.CodeLimitExceeded {
						got = fmt.Sprint(pe.Details["limit"])
						if pe.Details["unit"] == nil {
							t.Fatalf("details %v name no unit", pe.Details)
						}
					}
					if got != tt.field {
						t.Fatalf("details %v do not name %s", pe.Details, tt.field)
					}
				}
			})
		}
	}
	t.Run("agents.open", func(t *testing.T) {
		for _, b := range []string{`{"tokens":-1}`, `{"children":0.5}`, `{}`, `{"x":1}`} {
			resp := rawReq(t, nc, subj.Coord(protocol.EpAgentsOpen), fmt.Sprintf(`{"cwd":%q,"budget":%s}`, t.TempDir(), b), jsonHeader())
			var pe protocol.Error
			if err := json.Unmarshal(resp.Data, &pe); err != nil || pe.Code != protocol.CodeInvalidArgument {
				t.Fatalf("open with budget %s: reply %s, want INVALID_ARGUMENT", b, resp.Data)
			}
		}
	})
	if n := s.SessionCount(); n != sessions {
		t.Fatalf("%d sessions were created by refused starts and opens", n-sessions)
	}
	rec, err := s.Store.Budget(ctx, root.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Value.Charged.IsZero() || len(rec.Value.Reservations) != 0 {
		t.Fatalf("refused starts charged the root's budget: %+v", rec.Value)
	}
	// A start within the remainder is admitted and charged one child.
	run, res, err := s.Run(root.Ref(), "spawn", "say within", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 1000, Children: 4}})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("a start within the remainder: %+v, %v", res, err)
	}
	h, _ := s.Log(run.ChildID)
	if strings.Join(h.Budgets, ",") != root.SessionID+","+run.ChildID || h.BudgetDeadlineAt == 0 {
		t.Fatalf("the child's header budgets %v (deadline %d), want the root's then its own", h.Budgets, h.BudgetDeadlineAt)
	}
	if rec, _ := s.Store.Budget(ctx, root.SessionID); rec.Value.Charged.Children != 1 || rec.Value.Charged.Tokens != 3 {
		t.Fatalf("the root's ledger after one child: %+v, want 1 child and its 3 tokens (2 in, 1 out)", rec.Value.Charged)
	}
}
