package integration

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Issue 32, item 2: budgets on a delegation, enforced by a durable ledger
// (docs/protocol.md §5.5, "Budgets"; §5.22).

// budgetRoot opens a root with budget b in a temp dir, closed at cleanup.
func budgetRoot(t *testing.T, s *stack.Stack, b *protocol.Budget) *client.Root {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: b})
	if err != nil {
		t.Fatalf("open root: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = r.Close(ctx)
	})
	return r
}

// ledger reads the ledger of the budget session id named.
func ledger(t *testing.T, s *stack.Stack, id string) protocol.BudgetRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := s.Store.Budget(ctx, id)
	if err != nil {
		t.Fatalf("ledger of %s: %v", id, err)
	}
	return rec.Value
}

// listSteps is a script of n steps of one list_dir call each, then a line.
func listSteps(n int, last string) string {
	var b strings.Builder
	for range n {
		b.WriteString("call list_dir {}\n")
	}
	b.WriteString("say " + last)
	return b.String()
}

// TestBudgetHoldsOverATree is the acceptance: a scripted tree (a
// root, 3 children, 2 grandchildren each, in parallel over 2 spawn workers
// and 2 coordinators) under a 1,000-token budget spends at most 1,000
// tokens over every log (the in-flight bound is 0 here: the scripted
// model's input estimate is exact and its answers honour the grant), the
// ledger charged exactly what the logs say, every result's usage equals its
// log's, and the root's total equals the sum of all.
func TestBudgetHoldsOverATree(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	const limit = 1000
	root := budgetRoot(t, s, &protocol.Budget{Tokens: limit})

	grandchild := listSteps(12, "grandchild done")
	child := delegate(t, "g1", grandchild, false) + "\n" + delegate(t, "g2", grandchild, false) + "\nsay child done"
	var wg sync.WaitGroup
	results := make([]protocol.SubagentResult, 3)
	runs := make([]*client.Run, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i], results[i], errs[i] = s.Run(root.Ref(), "spawn", child, protocol.StartOptions{})
		}()
	}
	wg.Wait()
	exhausted := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		if results[i].ErrorCode == protocol.CodeBudgetExhausted {
			exhausted++
		}
	}
	if exhausted == 0 {
		t.Fatalf("no child reached the budget: %+v", results)
	}

	// Every child that started ended once: the 3 children, and the
	// grandchildren their budget let them start (a child whose first model
	// request found the budget spent delegated nothing).
	type node struct {
		id  string
		end protocol.LifecycleEvent
	}
	var nodes []node
	testutil.Eventually(t, 30*time.Second, func() bool {
		nodes = nil
		starts := 0
		var walk func(parent string)
		walk = func(parent string) {
			for _, ev := range s.Lifecycle(parent) {
				switch ev.Type {
				case protocol.LifecycleStart:
					starts++
				case protocol.LifecycleEnd:
					nodes = append(nodes, node{ev.ID, ev})
					walk(ev.ID)
				}
			}
		}
		walk(root.SessionID)
		return len(nodes) >= 3 && len(nodes) == starts
	}, "every child in the tree ended once")

	var sum protocol.RunUsage
	for _, n := range nodes {
		h, evs := s.Log(n.id)
		if len(h.Budgets) != 1 || h.Budgets[0] != root.SessionID {
			t.Errorf("child %s draws on %v, want the root's budget", n.id, h.Budgets)
		}
		own := sessionlog.OwnUsage(sessionlog.Own(evs, h.SeedLength))
		if n.end.Usage == nil || n.end.Usage.Own != own {
			t.Errorf("child %s: its end's own usage %+v, its log's %+v", n.id, n.end.Usage, own)
		}
		sum = sum.Add(own)
		t.Logf("child %s (parent %s): %s %s, own %+v", n.id, n.end.ParentSession, n.end.StopReason, n.end.ErrorCode, own)
	}
	var total protocol.RunUsage
	for _, r := range results {
		if r.Usage == nil {
			t.Fatalf("a result without usage: %+v", r)
		}
		total = total.Add(r.Usage.Subtree)
	}
	if total != sum {
		t.Fatalf("the root's total %+v differs from the sum over the tree's logs %+v", total, sum)
	}
	if sum.Tokens() > limit {
		t.Fatalf("the tree spent %d tokens over its logs; the budget is %d (in-flight bound 0)", sum.Tokens(), limit)
	}
	var rec protocol.BudgetRecord
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec = ledger(t, s, root.SessionID)
		return len(rec.Reservations) == 0
	}, "every reservation settled")
	want := protocol.BudgetSpend{Tokens: sum.Tokens(), ModelRequests: sum.ModelRequests, ToolCalls: sum.ToolCalls, Children: int64(len(nodes))}
	if rec.Charged != want {
		t.Fatalf("the ledger charged %+v, the logs say %+v", rec.Charged, want)
	}
	t.Logf("tree: %d sessions, %d children reached the cap; %d tokens of %d over %d model requests", len(nodes), exhausted, sum.Tokens(), limit, sum.ModelRequests)
}

// TestBudgetOneShotAtItsCap: a one-shot child whose answer would pass its
// token budget ends BUDGET_EXHAUSTED with the partial answer the grant
// allowed as its output, within a second of the cap; the limit and usage
// are named.
func TestBudgetOneShotAtItsCap(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	// 11 input tokens (the prompt's words); 15 tokens leave 4 for the answer.
	began := time.Now()
	run, res, err := s.Run(root.Ref(), "spawn", "say one two three four five six seven eight nine ten", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 15}})
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeBudgetExhausted {
		t.Fatalf("result %+v, want error BUDGET_EXHAUSTED", res)
	}
	if got := protocol.PlainText(res.Output); got != "one two three four" {
		t.Fatalf("output %q, want the partial answer the budget allowed", got)
	}
	if !strings.Contains(res.Diagnostic, "budget") {
		t.Fatalf("diagnostic %q does not name the budget", res.Diagnostic)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("the run took %s to end at its cap", took)
	}
	// The last step's settlement may land after the result (its host
	// sends it once the run is published: agent.OverlapSettles).
	var rec protocol.BudgetRecord
	testutil.Eventually(t, 5*time.Second, func() bool {
		rec = ledger(t, s, run.ChildID)
		return len(rec.Reservations) == 0
	}, "the run's reservation settled")
	if rec.Charged.Tokens != 15 {
		t.Fatalf("ledger %+v, want 15 tokens charged and nothing in flight", rec)
	}
	// The next model request is refused before it is sent.
	_, res, err = s.Run(root.Ref(), "spawn", "call list_dir {}\nsay after", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ErrorCode != protocol.CodeBudgetExhausted || !strings.Contains(res.Diagnostic, "tokens") {
		t.Fatalf("second run %+v, want BUDGET_EXHAUSTED naming tokens", res)
	}
	// A budget below the prompt's input: the reservation taken at admission
	// (5 tokens) does not fit the 11-token request, is released, not
	// charged, and no model request is made.
	run, res, err = s.Run(root.Ref(), "spawn", "say one two three four five six seven eight nine ten", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 5}})
	if err != nil || res.ErrorCode != protocol.CodeBudgetExhausted {
		t.Fatalf("third run %+v, %v; want BUDGET_EXHAUSTED", res, err)
	}
	if h, _ := s.Log(run.ChildID); h.BudgetStartTokens != 5 {
		t.Fatalf("header budgetStartTokens %d, want the 5 tokens taken at admission", h.BudgetStartTokens)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec := ledger(t, s, run.ChildID)
		return len(rec.Reservations) == 0 && rec.Charged.IsZero()
	}, "the admission's reservation released, nothing charged")
}

// TestBudgetDeadHostReservationChargedOnce (issue 32, item 2): a worker
// killed (SIGKILL) while its child's model request holds a reservation
// leaves it on the ledger; the coordinator that settles the run HOST_LOST
// charges it in full and removes it, once: the ledger ends with exactly
// that reservation charged and nothing in flight.
func TestBudgetDeadHostReservationChargedOnce(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 300 * time.Millisecond })
	w := spawnWorkerProc(t, s.Server.ClientURL())
	s.WaitProvider("spawn")
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(),
		Prompt: protocol.Text("sleep 60s\nsay late"), Options: protocol.StartOptions{Budget: &protocol.Budget{Tokens: 10_000}}})
	if err != nil {
		t.Fatal(err)
	}
	var held protocol.BudgetReservation
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec := ledger(t, s, run.ChildID)
		if len(rec.Reservations) != 1 {
			return false
		}
		held = rec.Reservations[0]
		return true
	}, "the model request holds a reservation")
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	res, err := run.Result(ctx)
	if err != nil || res.ErrorCode != protocol.CodeHostLost {
		t.Fatalf("result %+v, %v; want HOST_LOST", res, err)
	}
	var rec protocol.BudgetRecord
	testutil.Eventually(t, 10*time.Second, func() bool {
		rec = ledger(t, s, run.ChildID)
		return len(rec.Reservations) == 0
	}, "the dead host's reservation is removed")
	if rec.Charged != held.Spend || held.Spend.Tokens == 0 || held.Spend.ModelRequests != 1 {
		t.Fatalf("charged %+v; the dead host's reservation was %+v: want it charged once, in full", rec.Charged, held.Spend)
	}
}
