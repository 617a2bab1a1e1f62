package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// budgetPausedRequest waits until continuable child id is paused at its
// budget's cap (continuable.state paused) and returns its budget request.
func budgetPausedRequest(t *testing.T, s *stack.Stack, id string) protocol.RequestRecord {
	t.Helper()
	var pause *protocol.RequestOpenData
	testutil.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: id, Authority: s.Grant()})
		pause = st.BudgetPause
		return err == nil && st.State == protocol.StatePaused && pause != nil
	}, "the child pauses at its budget's cap")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: pause.RequestID, Authority: s.Grant()})
	if err != nil || rec.Kind != protocol.RequestBudget || rec.State != protocol.RequestPending || rec.BudgetOf != id {
		t.Fatalf("the budget request: %+v, %v; want kind budget, pending, of %s's ledger", rec, err, id)
	}
	return rec
}

// turnEnds returns the reasons of the turn/end events of evs, and how
// many turn/starts they hold.
func turnEnds(evs []protocol.SessionEvent) (ends []string, starts int) {
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvTurnStart:
			starts++
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			_ = ev.Decode(&d)
			ends = append(ends, d.Reason.Kind+string(d.Reason.Code))
		}
	}
	return ends, starts
}

// TestBudgetRaise (issue 32, item 3; docs/protocol.md §5.5, "Pause and
// raise"): a continuable child at its cap pauses (state paused, its
// children row paused, a pending request of kind budget); a raise by a
// stranger (another root, a user grant over other trees), by a sibling,
// of a negative, NaN, huge or empty amount, of a limit the budget does not
// name, or above the parent's own remainder is refused with a typed error
// and changes nothing; the parent's raise within its remainder continues
// the same turn, which completes; paused again in its next turn, the
// user's raise continues it.
func TestBudgetRaise(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	twoSteps := "call read_file {\"path\":\"nothing.txt\"}\nsay done"
	st, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "capped",
		Prompt: protocol.Text(twoSteps), Options: protocol.ContinuableOptions{Budget: &protocol.Budget{ModelRequests: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	child := st.ChildID
	req := budgetPausedRequest(t, s, child)
	rows, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: root.Ref().SessionID, Authority: s.Grant()})
	if err != nil || len(rows.Rows) != 1 || rows.Rows[0].State != protocol.StatePaused {
		t.Fatalf("children rows %+v, %v; want the child paused", rows, err)
	}

	// A stranger: another root's credential, and a user grant scoped to
	// another user's trees.
	stranger := s.Root()
	otherUser := "grant-of-another-user-0000000001"
	if err := s.Store.CreateGrant(ctx, protocol.HashCredential(otherUser), protocol.UserGrantRecord{ExpiresAt: store.NowMs() + 60_000, MintedBy: "test", User: "someone-else"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	// A sibling: a live continuable session of the same parent, whose
	// credential the test holds (its header and lease as a start writes
	// them, on the live spawn worker).
	sibling := protocol.ParentRef{SessionID: "sibling0000000000000000001", Credential: "sibling-credential"}
	if err := s.Store.PutHeader(ctx, protocol.SessionHeader{ID: sibling.SessionID, ParentSession: root.SessionID, Origin: protocol.OriginSubagent,
		Provider: "spawn", CreatedAt: store.NowMs()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: sibling.SessionID, Kind: protocol.AgentContinuable, Provider: "spawn",
		ParentSession: root.SessionID, HostID: host.ID(), CredentialHash: protocol.HashCredential(sibling.Credential)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: sibling.SessionID, Authority: protocol.Authority{Parent: &sibling}}); err != nil {
		t.Fatalf("the sibling's credential is not that of a live agent (it lists its own children): %v", err)
	}
	before, err := s.Store.Budget(ctx, child)
	if err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		name  string
		auth  protocol.Authority
		raise string // JSON
		code  protocol.Code
	}{
		{"a stranger root", stranger.Authority(), `{"modelRequests":1}`, protocol.CodeUnauthorized},
		{"a stranger user", protocol.Authority{Grant: otherUser}, `{"modelRequests":1}`, protocol.CodeUnauthorized},
		{"a sibling", protocol.Authority{Parent: &sibling}, `{"modelRequests":1}`, protocol.CodeUnauthorized},
		{"negative", root.Authority(), `{"modelRequests":-1}`, protocol.CodeInvalidArgument},
		{"NaN", root.Authority(), `{"modelRequests":NaN}`, protocol.CodeInvalidArgument},
		{"not a whole number", root.Authority(), `{"modelRequests":0.5}`, protocol.CodeInvalidArgument},
		{"huge", root.Authority(), `{"modelRequests":9007199254740993}`, protocol.CodeInvalidArgument},
		{"nothing", s.Grant(), `{}`, protocol.CodeInvalidArgument},
		{"a limit the budget does not name", s.Grant(), `{"tokens":1000}`, protocol.CodeInvalidArgument},
		{"above the parent's remainder", root.Authority(), `{"modelRequests":10}`, protocol.CodeLimitExceeded},
	}
	nc := s.Conn()
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			auth, _ := json.Marshal(tt.auth)
			body := fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":%s}`, child, auth, tt.raise)
			resp := rawReq(t, nc, s.Store.Subj.Coord(protocol.EpBudgetRaise), body, jsonHeader())
			var pe protocol.Error
			if err := json.Unmarshal(resp.Data, &pe); err != nil || pe.Code != tt.code {
				t.Fatalf("reply %s, want %s", resp.Data, tt.code)
			}
		})
	}
	after, err := s.Store.Budget(ctx, child)
	if err != nil || after.Value.Limits != before.Value.Limits || after.Value.Charged != before.Value.Charged {
		t.Fatalf("the refused raises changed the ledger: %+v, was %+v (%v)", after.Value, before.Value, err)
	}
	if rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: req.ID, Authority: s.Grant()}); err != nil || rec.State != protocol.RequestPending {
		t.Fatalf("the budget request after the refused raises: %+v, %v", rec, err)
	}
	if got, err := s.Client.Budget(ctx, child, stranger.Authority()); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("a stranger's budget.get = %+v, %v; want UNAUTHORIZED", got, err)
	}
	if got, err := s.Client.Budget(ctx, child, root.Authority()); err != nil || !got.Own || len(got.Budgets) != 2 || got.Budgets[1].Limits.ModelRequests != 1 {
		t.Fatalf("the parent's budget.get = %+v, %v; want the root's ledger and the child's own", got, err)
	}

	// The parent raises within its remainder: the same turn continues.
	rep, err := s.Client.RaiseBudget(ctx, child, root.Authority(), protocol.BudgetSpend{ModelRequests: 1})
	if err != nil || rep.Budget.Limits.ModelRequests != 2 || strings.Join(rep.Resumed, ",") != req.ID {
		t.Fatalf("the parent's raise = %+v, %v; want the limit 2 and request %s answered", rep, err, req.ID)
	}
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs = s.Log(child)
		ends, _ := turnEnds(evs)
		return len(ends) == 1
	}, "the raised turn ends")
	if ends, starts := turnEnds(evs); starts != 1 || ends[0] != protocol.TurnCompleted {
		t.Fatalf("%d turns, ends %v; want the one turn, continued and completed", starts, ends)
	}
	if rec, _ := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: req.ID, Authority: s.Grant()}); rec.State != protocol.RequestApproved ||
		rec.Answer == nil || rec.Answer.By.Kind != protocol.AnswererAgent || rec.Answer.By.SessionID != root.SessionID {
		t.Fatalf("the budget request after the raise: %+v", rec)
	}

	// Its next turn pauses at its first model request; the user raises.
	if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: child, Authority: root.Authority(), Message: protocol.Text(twoSteps)}); err != nil {
		t.Fatal(err)
	}
	req2 := budgetPausedRequest(t, s, child)
	if req2.ID == req.ID || req2.Turn != 2 || req2.Step != 1 {
		t.Fatalf("the second pause's request %+v; want a new one at turn 2, step 1", req2)
	}
	if rep, err = s.Client.RaiseBudget(ctx, child, s.Grant(), protocol.BudgetSpend{ModelRequests: 2}); err != nil || strings.Join(rep.Resumed, ",") != req2.ID {
		t.Fatalf("the user's raise = %+v, %v", rep, err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs = s.Log(child)
		ends, _ := turnEnds(evs)
		return len(ends) == 2
	}, "the second turn ends")
	if ends, starts := turnEnds(evs); starts != 2 || ends[1] != protocol.TurnCompleted {
		t.Fatalf("%d turns, ends %v; want the second completed", starts, ends)
	}

	// A root's own budget has no parent to raise it: its user does; the
	// root itself, another root and another user's grant may not.
	for _, auth := range []protocol.Authority{root.Authority(), stranger.Authority(), {Grant: otherUser}} {
		if _, err := s.Client.RaiseBudget(ctx, root.SessionID, auth, protocol.BudgetSpend{ModelRequests: 1}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("a raise of the root's budget by %+v = %v; want UNAUTHORIZED", auth, err)
		}
	}
	if rep, err = s.Client.RaiseBudget(ctx, root.SessionID, s.Grant(), protocol.BudgetSpend{ModelRequests: 5}); err != nil || rep.Budget.Limits.ModelRequests != 15 {
		t.Fatalf("the user's raise of the root's budget = %+v, %v; want its limit 15", rep, err)
	}
}

// TestBudgetPauseEnds (issue 32, item 3): a turn paused at its budget's
// cap ends BUDGET_EXHAUSTED, never completed, when its budget's deadline
// passes meanwhile (the deadline's reason) or when the pause is denied
// (the denial's reason).
func TestBudgetPauseEnds(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	for _, tt := range []struct {
		name   string
		budget protocol.Budget
		deny   bool
		diag   string
	}{
		{"at its deadline", protocol.Budget{ModelRequests: 1, DeadlineMs: 2000}, false, "deadline passed"},
		{"denied", protocol.Budget{ModelRequests: 1}, true, "denied by the user: not now"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			root := s.Root()
			st, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "capped",
				Prompt: protocol.Text("call read_file {\"path\":\"nothing.txt\"}\nsay done"), Options: protocol.ContinuableOptions{Budget: &tt.budget}})
			if err != nil {
				t.Fatal(err)
			}
			req := budgetPausedRequest(t, s, st.ChildID)
			if tt.deny {
				if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerDeny, Reason: "not now"}); err != nil {
					t.Fatal(err)
				}
			}
			var end protocol.TurnEndData
			testutil.Eventually(t, 30*time.Second, func() bool {
				_, evs := s.Log(st.ChildID)
				for _, ev := range evs {
					if ev.Type == protocol.EvTurnEnd && ev.Decode(&end) == nil {
						return true
					}
				}
				return false
			}, "the paused turn ends")
			if end.Reason.Kind != protocol.TurnError || end.Reason.Code != protocol.CodeBudgetExhausted || !strings.Contains(end.Reason.Error, tt.diag) {
				t.Fatalf("turn end %+v; want error BUDGET_EXHAUSTED saying %q", end.Reason, tt.diag)
			}
		})
	}
}

// TestBudgetPauseBeforeToolCalls (issue 32, item 3): a continuable child
// whose step's tool calls get no reservation (its toolCalls limit) pauses
// with the calls logged and not run; the user's raise runs them, once,
// and the same turn completes.
func TestBudgetPauseBeforeToolCalls(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("alpha"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: s.Root(dir).Ref(), Label: "capped",
		Prompt:  protocol.Text("call read_file {\"path\":\"a.txt\"}\ncall read_file {\"path\":\"a.txt\"}\nsay done"),
		Options: protocol.ContinuableOptions{Budget: &protocol.Budget{ToolCalls: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	req := budgetPausedRequest(t, s, st.ChildID)
	if req.Step != 1 || !strings.Contains(req.Exhausted, "toolCalls") {
		t.Fatalf("the pause's request %+v; want step 1, its toolCalls limit spent", req)
	}
	if _, evs := s.Log(st.ChildID); strings.Count(eventTypes(evs), protocol.EvToolResult) != 0 {
		t.Fatalf("tool calls ran before the raise: %s", eventTypes(evs))
	}
	if _, err := s.Client.RaiseBudget(ctx, st.ChildID, s.Grant(), protocol.BudgetSpend{ToolCalls: 1}); err != nil {
		t.Fatal(err)
	}
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs = s.Log(st.ChildID)
		ends, _ := turnEnds(evs)
		return len(ends) == 1
	}, "the raised turn ends")
	if ends, starts := turnEnds(evs); starts != 1 || ends[0] != protocol.TurnCompleted {
		t.Fatalf("%d turns, ends %v; want the one turn completed", starts, ends)
	}
	if got := eventTypes(evs); !strings.Contains(got, "tool/call tool/call request/open request/answer tool/result tool/result step/end") {
		t.Fatalf("log %s; want the calls, the pause and its raise, then both results", got)
	}
}

// eventTypes is the types of evs, space-separated.
func eventTypes(evs []protocol.SessionEvent) string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return strings.Join(out, " ")
}

// TestBudgetRaiseBeforeThePauseOpens (issue 32): a raise that lands
// between a child's BUDGET_EXHAUSTED refusal and the opening of its
// budget request is not lost: the request, opened with the raise count
// its refusal saw, is answered approved at once, by the raiser. A pause
// opened after the raise it saw waits, and the next raise answers it,
// found in the coordinator's watch of brood_agents: no raise lists the
// bucket's keys.
func TestBudgetRaiseBeforeThePauseOpens(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	noConsumers := agentsConsumersCreated(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	// The child's own ledger has its one model request spent.
	child := protocol.ParentRef{SessionID: "raisedchild00000000000001", Credential: "raised-child-credential"}
	budgetedChild(t, s, host.ID(), root.SessionID, child, protocol.BudgetRecord{SessionID: child.SessionID, Limits: protocol.Budget{ModelRequests: 1},
		Charged: protocol.BudgetSpend{ModelRequests: 1}, CreatedAt: store.NowMs()})
	refusal := func() int64 {
		t.Helper()
		_, err := s.Client.ReserveBudget(ctx, protocol.BudgetReserveRequest{Self: child, Want: protocol.BudgetSpend{ModelRequests: 1}, NoWait: true})
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeBudgetExhausted {
			t.Fatalf("reserve = %v; want BUDGET_EXHAUSTED", err)
		}
		n, ok := pe.Details["raises"].(float64) // JSON
		if !ok {
			if i, isInt := pe.Details["raises"].(int64); isInt {
				n, ok = float64(i), true
			}
		}
		if !ok {
			t.Fatalf("the refusal names no raise count: %v", pe.Details)
		}
		return int64(n)
	}
	open := func(call string, raises int64) protocol.RequestRecord {
		t.Helper()
		rec, err := s.Client.OpenRequest(ctx, protocol.RequestOpenRequest{Self: child, Kind: protocol.RequestBudget, CallID: call, Turn: 1, Step: 1,
			BudgetOf: child.SessionID, Exhausted: "spent", BudgetRaises: &raises})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}

	// The order forced: refused, raised (nothing paused yet), then the
	// pause opens.
	seen := refusal()
	if rep, err := s.Client.RaiseBudget(ctx, child.SessionID, s.Grant(), protocol.BudgetSpend{ModelRequests: 1}); err != nil || len(rep.Resumed) != 0 {
		t.Fatalf("the raise before the pause = %+v, %v; want nothing to resume", rep, err)
	}
	late := open("budget-t1-s1-1", seen)
	if late.State != protocol.RequestApproved || late.Answer == nil || late.Answer.By.Kind != protocol.AnswererUser {
		t.Fatalf("the pause opened after a raise it did not see: %+v; want approved at once, by the user", late)
	}
	if got, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: late.ID, Authority: s.Grant()}); err != nil || got.State != protocol.RequestApproved {
		t.Fatalf("the request as stored: %+v, %v", got, err)
	}

	// A pause that saw the raise waits; the next raise answers it.
	if _, err := s.Client.ReserveBudget(ctx, protocol.BudgetReserveRequest{Self: child, Want: protocol.BudgetSpend{ModelRequests: 1}, NoWait: true}); err != nil {
		t.Fatalf("the raised model request: %v", err)
	}
	seen = refusal()
	waiting := open("budget-t1-s1-2", seen)
	if seen != 1 || waiting.State != protocol.RequestPending {
		t.Fatalf("a pause that saw the raise (count %d) is %s; want 1 and pending", seen, waiting.State)
	}
	rep, err := s.Client.RaiseBudget(ctx, child.SessionID, s.Grant(), protocol.BudgetSpend{ModelRequests: 1})
	if err != nil || strings.Join(rep.Resumed, ",") != waiting.ID || rep.Budget.Raises != 2 {
		t.Fatalf("the second raise = %+v, %v; want request %s answered, 2 raises", rep, err, waiting.ID)
	}
	noConsumers()
}

// budgetedChild writes continuable child self of root as a start does:
// its header draws on its own ledger, led, and its lease is on the live
// host hostID.
func budgetedChild(t *testing.T, s *stack.Stack, hostID, root string, self protocol.ParentRef, led protocol.BudgetRecord) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Store.PutHeader(ctx, protocol.SessionHeader{ID: self.SessionID, ParentSession: root, Origin: protocol.OriginSubagent,
		Provider: "spawn", CreatedAt: store.NowMs(), Budgets: []string{self.SessionID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.WriteBudget(ctx, self.SessionID, led, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: self.SessionID, Kind: protocol.AgentContinuable, Provider: "spawn",
		ParentSession: root, HostID: hostID, CredentialHash: protocol.HashCredential(self.Credential)}); err != nil {
		t.Fatal(err)
	}
}

// TestBudgetGetShowsOnlyTheChildsReservations (issue 32): budget.get and
// budget.raise show a ledger's reservations of the child asked about
// only, without their credential hashes; what the others hold (a
// descendant's, a sibling's) is one total, so what remains is the same.
func TestBudgetGetShowsOnlyTheChildsReservations(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	child := protocol.ParentRef{SessionID: "shownchild000000000000001", Credential: "shown-child-credential"}
	other := protocol.BudgetReservation{ID: "res-other", SessionID: "grandchild000000000000001", RunID: "run-other", HostID: "host-other",
		CredentialHash: protocol.HashCredential("grandchild-credential"), Spend: protocol.BudgetSpend{Tokens: 30, ModelRequests: 1}, At: store.NowMs()}
	own := protocol.BudgetReservation{ID: "res-own", SessionID: child.SessionID, RunID: "run-own", HostID: host.ID(),
		CredentialHash: protocol.HashCredential(child.Credential), Spend: protocol.BudgetSpend{Tokens: 20, ModelRequests: 1}, At: store.NowMs()}
	led := protocol.BudgetRecord{SessionID: child.SessionID, Limits: protocol.Budget{Tokens: 100, ModelRequests: 5},
		Charged: protocol.BudgetSpend{Tokens: 10}, Reservations: []protocol.BudgetReservation{other, own}, CreatedAt: store.NowMs()}
	budgetedChild(t, s, host.ID(), root.SessionID, child, led)
	check := func(what string, got protocol.BudgetRecord) {
		t.Helper()
		raw, _ := json.Marshal(got)
		if len(got.Reservations) != 1 || got.Reservations[0].ID != own.ID || got.Reservations[0].CredentialHash != "" ||
			got.ReservedOthers != other.Spend || got.Remaining() != led.Remaining() ||
			strings.Contains(string(raw), other.SessionID) || strings.Contains(string(raw), other.CredentialHash) || strings.Contains(string(raw), own.CredentialHash) {
			t.Fatalf("%s shows %s; want only the child's reservation, no credential hash, the rest as reservedOthers", what, raw)
		}
	}
	for _, auth := range []protocol.Authority{s.Grant(), root.Authority()} {
		got, err := s.Client.Budget(ctx, child.SessionID, auth)
		if err != nil || len(got.Budgets) != 1 {
			t.Fatalf("budget.get = %+v, %v", got, err)
		}
		check("budget.get", got.Budgets[0])
	}
	rep, err := s.Client.RaiseBudget(ctx, child.SessionID, s.Grant(), protocol.BudgetSpend{Tokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	led.Limits.Tokens += 5
	check("budget.raise", rep.Budget)
}
