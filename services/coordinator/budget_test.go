package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
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
	// The child's last settlement may land after its result (its host
	// sends it once the run is published: agent.OverlapSettles).
	var charged protocol.BudgetSpend
	testutil.Eventually(t, 5*time.Second, func() bool {
		rec, err := s.Store.Budget(ctx, root.SessionID)
		charged = rec.Value.Charged
		return err == nil && len(rec.Value.Reservations) == 0
	}, "the child's reservation settled")
	if charged.Children != 1 || charged.Tokens != 3 {
		t.Fatalf("the root's ledger after one child: %+v, want 1 child and its 3 tokens (2 in, 1 out)", charged)
	}
}

// TestALateSettleOfASettledRunChargesWhatWasUsed (docs/protocol.md §5.5,
// "Budgets"; issue 32, item 2): a one-shot host settles and publishes its
// run while the last step's settlement is on its way
// (agent.OverlapSettles). A reservation whose run settled less than
// SettledReservationGrace ago is left by the sweep of a ledger found short,
// and its late settlement charges what the step used, not the whole grant;
// one whose run settled longer ago is charged in full by that sweep, and a
// settlement after it changes nothing (charged once).
func TestALateSettleOfASettledRunChargesWhatWasUsed(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	grant := protocol.BudgetSpend{ModelRequests: 1, Tokens: 4000}
	used := protocol.BudgetSpend{ModelRequests: 1, Tokens: 120}
	for i, tt := range []struct {
		name        string
		settledAgo  time.Duration
		wantCharged protocol.BudgetSpend
	}{
		{"within the grace", 0, used},
		{"past the grace", coordinator.SettledReservationGrace + time.Second, grant},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 1, Tokens: 10_000}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = root.Close(context.Background()) }()
			// The child as its host runs it: header, run record, and a
			// lease naming the run.
			id := fmt.Sprintf("latesettlechild0000000000%d", i)
			child := protocol.ParentRef{SessionID: id, Credential: "credential-of-" + id}
			if err := s.Store.PutHeader(ctx, protocol.SessionHeader{ID: id, ParentSession: root.SessionID, Origin: protocol.OriginSubagent,
				Provider: "spawn", CreatedAt: store.NowMs(), Budgets: []string{root.SessionID}}); err != nil {
				t.Fatal(err)
			}
			run := protocol.RunRecord{RunID: id, ChildID: id, ParentSession: root.SessionID, Provider: "spawn", Mode: protocol.ModeOneShot,
				State: protocol.RunRunning, CreatedAt: store.NowMs()}
			rev, err := s.Store.CreateRun(ctx, run)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: id, Kind: protocol.AgentOneShot, Provider: "spawn", RunID: id,
				ParentSession: root.SessionID, HostID: host.ID(), CredentialHash: protocol.HashCredential(child.Credential)}); err != nil {
				t.Fatal(err)
			}
			var res protocol.BudgetReserveReply
			if err := s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: child, Want: grant}, &res); err != nil || res.Granted != grant {
				t.Fatalf("the step's reservation: %+v, %v", res, err)
			}
			// The run settles before its last settlement lands.
			settled := store.Settled(run, host.ID(), protocol.SubagentResult{StopReason: protocol.StopCompleted})
			settled.SettledAt -= tt.settledAgo.Milliseconds()
			if ok, err := s.Store.SettleRun(ctx, settled, rev); !ok || err != nil {
				t.Fatalf("settle the run: %v, %v", ok, err)
			}
			// The root's own model request finds the ledger short (its one
			// request is reserved): the coordinator sweeps it.
			var refused protocol.BudgetReserveReply
			err = s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: root.Ref(), Want: protocol.BudgetSpend{ModelRequests: 1}, NoWait: true}, &refused)
			if protocol.CodeOf(err) != protocol.CodeBudgetExhausted {
				t.Fatalf("a reservation on the full ledger: %+v, %v; want BUDGET_EXHAUSTED", refused, err)
			}
			if err := s.Client.Call(ctx, protocol.EpBudgetSettle, protocol.BudgetSettleRequest{Self: child, ReservationID: res.ReservationID, Used: used}, &protocol.Empty{}); err != nil {
				t.Fatalf("the late settle: %v", err)
			}
			rec, err := s.Store.Budget(ctx, root.SessionID)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Value.Charged != tt.wantCharged || len(rec.Value.Reservations) != 0 {
				t.Fatalf("the ledger charged %+v with %d reservations in flight; want %+v charged once, nothing in flight",
					rec.Value.Charged, len(rec.Value.Reservations), tt.wantCharged)
			}
		})
	}
}

// TestBudgetReserveRetriesOnlyWhenWaitingCanHelp (docs/protocol.md §5.5,
// "The reservation rule"; issue 32, item 3, "at the cap, pause, never
// hang"): a model request that does not fit is told to ask again
// (retryMs) only while another session's reservation in flight holds
// tokens. Tokens held by the caller's own reservation, or by a
// reservation of a run settled longer than SettledReservationGrace ago
// (swept first, charged in full), grant what is free at once.
func TestBudgetReserveRetriesOnlyWhenWaitingCanHelp(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	held := protocol.BudgetSpend{ModelRequests: 1, Tokens: 800}
	want := protocol.BudgetSpend{ModelRequests: 1, Tokens: 500}
	for i, tt := range []struct {
		name      string
		holder    string        // who holds 800 of the 1000 tokens: "self" or "child"
		settled   time.Duration // the child's run settled this long ago (0: running)
		wantRetry bool
	}{
		{"the caller's own reservation", "self", 0, false},
		{"a run settled past the grace", "child", coordinator.SettledReservationGrace + time.Second, false},
		{"another session's reservation in flight", "child", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{Tokens: 1000}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = root.Close(context.Background()) }()
			holder := root.Ref()
			if tt.holder == "child" {
				id := fmt.Sprintf("retrywaitchild00000000000%d", i)
				holder = protocol.ParentRef{SessionID: id, Credential: "credential-of-" + id}
				if err := s.Store.PutHeader(ctx, protocol.SessionHeader{ID: id, ParentSession: root.SessionID, Origin: protocol.OriginSubagent,
					Provider: "spawn", CreatedAt: store.NowMs(), Budgets: []string{root.SessionID}}); err != nil {
					t.Fatal(err)
				}
				run := protocol.RunRecord{RunID: id, ChildID: id, ParentSession: root.SessionID, Provider: "spawn", Mode: protocol.ModeOneShot,
					State: protocol.RunRunning, CreatedAt: store.NowMs()}
				rev, err := s.Store.CreateRun(ctx, run)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: id, Kind: protocol.AgentOneShot, Provider: "spawn", RunID: id,
					ParentSession: root.SessionID, HostID: host.ID(), CredentialHash: protocol.HashCredential(holder.Credential)}); err != nil {
					t.Fatal(err)
				}
				var res protocol.BudgetReserveReply
				if err := s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: holder, Want: held}, &res); err != nil || res.Granted != held {
					t.Fatalf("the held reservation: %+v, %v", res, err)
				}
				// The run settles (past the grace: its host died without
				// settling the reservation), or at the test's end.
				settled := store.Settled(run, host.ID(), protocol.SubagentResult{StopReason: protocol.StopCompleted})
				settled.SettledAt -= tt.settled.Milliseconds()
				if tt.settled == 0 {
					defer func() { _, _ = s.Store.SettleRun(context.Background(), settled, rev) }()
				} else if ok, err := s.Store.SettleRun(ctx, settled, rev); !ok || err != nil {
					t.Fatalf("settle the run: %v, %v", ok, err)
				}
			} else {
				var res protocol.BudgetReserveReply
				if err := s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: holder, Want: held}, &res); err != nil || res.Granted != held {
					t.Fatalf("the held reservation: %+v, %v", res, err)
				}
			}
			var rep protocol.BudgetReserveReply
			err = s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: root.Ref(), Want: want, TokensMin: 100}, &rep)
			if err != nil {
				t.Fatalf("the reservation that does not fit: %v", err)
			}
			if tt.wantRetry {
				if rep.RetryMs == 0 || rep.ReservationID != "" {
					t.Fatalf("reply %+v; want retryMs and nothing reserved while another session holds the tokens", rep)
				}
				return
			}
			if rep.RetryMs != 0 || rep.ReservationID == "" || rep.Granted.Tokens != 200 {
				t.Fatalf("reply %+v; want the 200 free tokens granted at once, no retryMs", rep)
			}
		})
	}
}
