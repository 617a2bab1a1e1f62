package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestAPausesRaiseCountBuysNothingTheLedgerRefuses (docs/protocol.md
// §5.21 "Kinds", budgetRaises; §5.5 "Pause and raise"; issue 32's bad
// input): a child that sends requests.open a raise count other than the
// one its refusal saw gets at most its own pause answered approved (a
// stale count: the ledger had raises since), never a reservation the
// ledger refuses, and never another request answered: a negative, a
// fractional, a string or an overflowing count, or one on a request of
// another kind, is INVALID_ARGUMENT with nothing written; a huge count
// leaves the pause pending; a sibling's credential is UNAUTHORIZED; and a
// pending approval reopened by its call id as a budget pause with a stale
// count stays pending (the child cannot approve its own tool call).
func TestAPausesRaiseCountBuysNothingTheLedgerRefuses(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	const id = "raisecountchild0000000001"
	child := fakeChild(t, s, host.ID(), root.SessionID, id, []string{root.SessionID, id}, &protocol.Budget{ModelRequests: 1})
	sibling := fakeChild(t, s, host.ID(), root.SessionID, "raisecountsibling00000001", []string{root.SessionID}, nil)
	if _, err := s.Client.RaiseBudget(ctx, id, root.Authority(), protocol.BudgetSpend{ModelRequests: 1}); err != nil {
		t.Fatal(err)
	}
	// The child spends its raised limit of 2.
	for i := 0; i < 2; i++ {
		var res protocol.BudgetReserveReply
		if err := s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: child, Want: protocol.BudgetSpend{ModelRequests: 1}}, &res); err != nil {
			t.Fatalf("reservation %d: %v", i, err)
		}
		if err := s.Client.Call(ctx, protocol.EpBudgetSettle, protocol.BudgetSettleRequest{Self: child, ReservationID: res.ReservationID, Used: protocol.BudgetSpend{ModelRequests: 1}}, &protocol.Empty{}); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
	}
	refused := func() {
		t.Helper()
		var res protocol.BudgetReserveReply
		err := s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: child, Want: protocol.BudgetSpend{ModelRequests: 1}}, &res)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeBudgetExhausted {
			t.Fatalf("a reservation past the limit: %+v, %v; want BUDGET_EXHAUSTED", res, err)
		}
	}
	refused()
	ledger := func() string {
		rec, err := s.Store.Budget(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("limits %+v charged %+v reserved %d raises %d", rec.Value.Limits, rec.Value.Charged, len(rec.Value.Reservations), rec.Value.Raises)
	}
	before := ledger()
	nc := s.Conn()
	self := func(p protocol.ParentRef) string { b, _ := json.Marshal(p); return string(b) }
	open := func(p protocol.ParentRef, callID, kind, extra string) (protocol.Code, string) {
		body := fmt.Sprintf(`{"self":%s,"kind":%q,"callId":%q,"turn":1,"step":1%s}`, self(p), kind, callID, extra)
		return replyCode(t, s, nc, protocol.EpRequestsOpen, body)
	}
	state := func(callID string) string {
		rec, err := s.Store.Request(ctx, protocol.RequestID(id, callID))
		if err != nil {
			return "none"
		}
		return rec.Value.State
	}
	budgetOf := fmt.Sprintf(`,"budgetOf":%q`, id)
	for _, tt := range []struct {
		name, callID, kind, extra string
		as                        protocol.ParentRef
		code                      protocol.Code
		state                     string
	}{
		{"a negative count", "budget-neg", protocol.RequestBudget, budgetOf + `,"budgetRaises":-1`, child, protocol.CodeInvalidArgument, "none"},
		{"a fractional count", "budget-frac", protocol.RequestBudget, budgetOf + `,"budgetRaises":0.5`, child, protocol.CodeInvalidArgument, "none"},
		{"a string count", "budget-str", protocol.RequestBudget, budgetOf + `,"budgetRaises":"0"`, child, protocol.CodeInvalidArgument, "none"},
		{"an overflowing count", "budget-big", protocol.RequestBudget, budgetOf + `,"budgetRaises":1e400`, child, protocol.CodeInvalidArgument, "none"},
		{"a count without budgetOf", "budget-noof", protocol.RequestBudget, `,"budgetRaises":0`, child, protocol.CodeInvalidArgument, "none"},
		{"a count on an approval", "call-count", protocol.RequestApproval, `,"tool":"run_command","budgetRaises":0`, child, protocol.CodeInvalidArgument, "none"},
		{"a sibling's credential", "budget-sib", protocol.RequestBudget, budgetOf + `,"budgetRaises":0`,
			protocol.ParentRef{SessionID: id, Credential: sibling.Credential}, protocol.CodeUnauthorized, "none"},
		{"the largest count", "budget-max", protocol.RequestBudget, budgetOf + fmt.Sprintf(`,"budgetRaises":%d`, int64(math.MaxInt64)), child, "", protocol.RequestPending},
		{"the count it saw", "budget-seen", protocol.RequestBudget, budgetOf + `,"budgetRaises":1`, child, "", protocol.RequestPending},
		{"a stale count", "budget-stale", protocol.RequestBudget, budgetOf + `,"budgetRaises":0`, child, "", protocol.RequestApproved},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code, data := open(tt.as, tt.callID, tt.kind, tt.extra); code != tt.code {
				t.Fatalf("requests.open: %s; want %q", data, tt.code)
			}
			if got := state(tt.callID); got != tt.state {
				t.Fatalf("the request is %s; want %s", got, tt.state)
			}
			// Whatever its pause's answer, the ledger gave nothing.
			refused()
			if after := ledger(); after != before {
				t.Fatalf("the ledger after it: %s; was %s", after, before)
			}
		})
	}

	// A tool call waiting on its approval, reopened by its call id as a
	// budget pause with a stale count: the approval stays pending.
	if code, data := open(child, "call-parked", protocol.RequestApproval, `,"tool":"run_command","arguments":"{}"`); code != "" {
		t.Fatalf("the approval's open: %s", data)
	}
	if code, data := open(child, "call-parked", protocol.RequestBudget, budgetOf+`,"budgetRaises":0`); code != "" && code != protocol.CodeInvalidArgument {
		t.Fatalf("the approval reopened as a budget pause: %s", data)
	}
	if got := state("call-parked"); got != protocol.RequestPending {
		t.Fatalf("the approval reopened as a budget pause with a stale count is %s; want still pending", got)
	}
}

// TestAQueuedContinuableChildIsItsTreesOnly (docs/protocol.md §5.5, "The
// start queue", "Budgets"; issue 32, items 3 and 4): while its parent is at
// its live-children limit, a continuable.start with a bad budget (negative,
// NaN, above the parent's remainder) is refused with its code and queues
// nothing and charges nothing; a queued continuable child is refused
// UNAUTHORIZED to another user's root and grant (continuable.state, a
// followup, runs.await and runs.dispose by its child id and by its
// message's id), and another tree's start naming its child id is
// DUPLICATE_CHILD: the queued start stays as it was, and its user's grant
// still finds it.
func TestAQueuedContinuableChildIsItsTreesOnly(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LiveChildrenMax = 1 })
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice, bob := userClient(t, s, "alice"), userClient(t, s, "bob")
	open := func(cl *client.Client) *client.Root {
		root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{Tokens: 1000, Children: 3}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = root.Close(context.Background()) })
		return root
	}
	aliceRoot, bobRoot := open(alice), open(bob)
	for _, r := range []*client.Root{aliceRoot, bobRoot} {
		if _, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: r.Ref(), Provider: "spawn", Prompt: protocol.Text("sleep 30s\nsay x")}); err != nil {
			t.Fatal(err)
		}
	}
	ledger := func() string {
		rec, err := s.Store.Budget(ctx, aliceRoot.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("charged %+v reserved %+v", rec.Value.Charged, rec.Value.Reserved())
	}
	queueLen := func(parent string) int {
		q, err := s.Store.StartQueue(ctx, parent)
		if err != nil {
			return 0
		}
		return len(q.Value.Entries)
	}
	before := ledger()
	nc := s.Conn()
	parent, _ := json.Marshal(aliceRoot.Ref())
	for _, tt := range []struct {
		name, budget string
		code         protocol.Code
	}{
		{"negative", `{"tokens":-1}`, protocol.CodeInvalidArgument},
		{"NaN", `{"modelRequests":NaN}`, protocol.CodeInvalidArgument},
		{"huge", `{"toolCalls":9007199254740993}`, protocol.CodeInvalidArgument},
		{"tokens above the parent's remainder", `{"tokens":1001}`, protocol.CodeLimitExceeded},
		{"children above the parent's remainder", `{"children":3}`, protocol.CodeLimitExceeded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"provider":"spawn","parent":%s,"label":"x","prompt":[{"type":"text","text":"say hi"}],"options":{"budget":%s}}`, parent, tt.budget)
			if code, data := replyCode(t, s, nc, protocol.EpContinuableStart, body); code != tt.code {
				t.Fatalf("reply %s; want %s", data, tt.code)
			}
			if n := queueLen(aliceRoot.SessionID); n != 0 {
				t.Fatalf("the refused start left %d entries queued", n)
			}
			if after := ledger(); after != before {
				t.Fatalf("the refused start changed the ledger: %s; was %s", after, before)
			}
		})
	}

	const childID = "alices-reviewer"
	queued, err := alice.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: aliceRoot.Ref(), Label: "reviewer", ChildID: childID, Prompt: protocol.Text("say queued")})
	if err != nil || queued.State != protocol.StateQueued || queued.ChildID != childID {
		t.Fatalf("alice's continuable start at the limit: %+v %v; want queued as %s", queued, err, childID)
	}
	g, err := alice.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	aliceGrant := protocol.Authority{Grant: g.Grant}
	bg, err := bob.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bobGrant := protocol.Authority{Grant: bg.Grant}
	testutil.Eventually(t, 10*time.Second, func() bool {
		st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: childID, Authority: aliceGrant})
		return err == nil && st.State == protocol.StateQueued
	}, "alice's grant sees her child queued")

	// Bob's start naming alice's queued child's id, queued under his own
	// full parent.
	_, err = bob.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: bobRoot.Ref(), Label: "squat", ChildID: childID, Prompt: protocol.Text("say mine")})
	if protocol.CodeOf(err) != protocol.CodeDuplicateChild {
		t.Fatalf("bob's start naming alice's queued child's id: %v; want DUPLICATE_CHILD", err)
	}
	if n := queueLen(bobRoot.SessionID); n != 0 {
		t.Fatalf("bob's queue holds %d entries; want none", n)
	}

	for name, a := range map[string]protocol.Authority{"bob's root": bobRoot.Authority(), "bob's grant": bobGrant} {
		if _, err := s.Client.State(ctx, protocol.ChildRef{ChildID: childID, Authority: a}); protocol.CodeOf(err) != protocol.CodeUnauthorized && protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("continuable.state of alice's queued child with %s: %v; want UNAUTHORIZED or NOT_FOUND", name, err)
		}
		_, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: childID, Authority: a, Message: protocol.Text("say more")})
		if c := protocol.CodeOf(err); c == protocol.CodeUnavailable || c == "" {
			t.Fatalf("a followup to alice's queued child with %s: %v; want refused as not its child", name, err)
		}
		for _, id := range []string{childID, queued.MessageID} {
			ref := protocol.RunRef{RunID: id, Grant: a.Grant, Parent: a.Parent}
			for _, ep := range []string{protocol.EpRunsAwait, protocol.EpRunsDispose} {
				var st protocol.RunStatus
				if err := s.Client.Call(ctx, ep, ref, &st); protocol.CodeOf(err) != protocol.CodeUnauthorized && protocol.CodeOf(err) != protocol.CodeNotFound {
					t.Fatalf("%s %s of alice's queued child with %s: %+v %v; want UNAUTHORIZED", ep, id, name, st, err)
				}
			}
		}
	}
	if q, err := s.Store.StartQueue(ctx, aliceRoot.SessionID); err != nil || len(q.Value.Entries) != 1 || q.Value.Entries[0].ChildID != childID {
		t.Fatalf("alice's queue after bob's tries: %+v %v; want her start still there", q.Value, err)
	}
	if st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: childID, Authority: aliceGrant}); err != nil || st.State != protocol.StateQueued {
		t.Fatalf("alice's grant after bob's tries: %+v %v; want queued", st, err)
	}
}

// TestABudgetRaiseBySiblingOrStrangerChangesNothing (issue 32's bad
// input: "a raise by a sibling or a stranger"; docs/protocol.md §5.23):
// budget.raise and budget.get of a child with its sibling's credential,
// its grandparent's (only its exact parent acts on it, or a grant), its
// own child's, or another user's grant are UNAUTHORIZED, and no ledger
// changes; its user's grant and its parent may.
func TestABudgetRaiseBySiblingOrStrangerChangesNothing(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice, bob := userClient(t, s, "alice"), userClient(t, s, "bob")
	root, err := alice.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	const a, b, g = "raisedchild00000000000001", "raisingsibling00000000001", "raisedgrandchild000000001"
	fakeChild(t, s, host.ID(), root.SessionID, a, []string{root.SessionID, a}, &protocol.Budget{ModelRequests: 2})
	sibling := fakeChild(t, s, host.ID(), root.SessionID, b, []string{root.SessionID, b}, &protocol.Budget{ModelRequests: 2})
	grandchild := fakeChild(t, s, host.ID(), a, g, []string{root.SessionID, a, g}, &protocol.Budget{ModelRequests: 1})
	ag, err := alice.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bg, err := bob.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ledgers := func() string {
		out := ""
		for _, id := range []string{root.SessionID, a, b, g} {
			rec, err := s.Store.Budget(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			out += fmt.Sprintf("%s %+v %+v %d; ", id, rec.Value.Limits, rec.Value.Charged, rec.Value.Raises)
		}
		return out
	}
	before := ledgers()
	for _, tt := range []struct {
		name, target string
		auth         protocol.Authority
	}{
		{"a sibling", a, protocol.Authority{Parent: &sibling}},
		{"its grandparent", g, root.Authority()},
		{"its own child", a, protocol.Authority{Parent: &grandchild}},
		{"another user's grant", a, protocol.Authority{Grant: bg.Grant}},
		{"another user's grant on the root", root.SessionID, protocol.Authority{Grant: bg.Grant}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Client.RaiseBudget(ctx, tt.target, tt.auth, protocol.BudgetSpend{ModelRequests: 1}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
				t.Fatalf("budget.raise of %s: %v; want UNAUTHORIZED", tt.target, err)
			}
			var rep protocol.BudgetGetReply
			if err := s.Client.Call(ctx, protocol.EpBudgetGet, protocol.BudgetGetRequest{ChildID: tt.target, Authority: tt.auth}, &rep); protocol.CodeOf(err) != protocol.CodeUnauthorized {
				t.Fatalf("budget.get of %s: %+v %v; want UNAUTHORIZED", tt.target, rep, err)
			}
			if after := ledgers(); after != before {
				t.Fatalf("the ledgers after the refused raise: %s; were %s", after, before)
			}
		})
	}
	for name, auth := range map[string]protocol.Authority{"its parent": root.Authority(), "its user's grant": {Grant: ag.Grant}} {
		if _, err := s.Client.RaiseBudget(ctx, a, auth, protocol.BudgetSpend{ModelRequests: 1}); err != nil {
			t.Fatalf("budget.raise of the child by %s: %v", name, err)
		}
	}
	if rec, err := s.Store.Budget(ctx, a); err != nil || rec.Value.Limits.ModelRequests != 4 || rec.Value.Raises != 2 {
		t.Fatalf("the child's ledger after its parent's and its user's raises: %+v %v; want 4 model requests, 2 raises", rec.Value, err)
	}
}

// TestAQueuedStartFailedTwiceIsGivenBackOnce (docs/protocol.md §5.5, "The
// start queue", "Budgets"): a queued start is charged a child of its
// parent's budgets when it queues; failed twice (two replicas' admission
// passes over a parent whose session ended, or whose credential changed,
// fail its entries at once, or a pass fails it again after its dequeue
// failed), it is settled once and its child given back once, not twice:
// a second refund let the tree start a child its budget no longer held.
func TestAQueuedStartFailedTwiceIsGivenBackOnce(t *testing.T) {
	s := stack.New(t)
	c := s.AddCoordinator(func(c *coordinator.Config) { c.LiveChildrenMax = 1 })
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{Children: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	start := func() *client.Run {
		r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("sleep 30s\nsay x")})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	start()
	waiting := start()
	if waiting.State != protocol.RunQueued {
		t.Fatalf("the second start answered %q, want queued", waiting.State)
	}
	children := func() int64 {
		rec, err := s.Store.Budget(ctx, root.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Value.Charged.Add(rec.Value.Reserved()).Children
	}
	if got := children(); got != 2 {
		t.Fatalf("the root's ledger charges %d children with one live and one queued; want 2", got)
	}
	q, err := s.Store.StartQueue(ctx, root.SessionID)
	if err != nil || len(q.Value.Entries) != 1 {
		t.Fatalf("the queue: %+v %v", q.Value, err)
	}
	e := q.Value.Entries[0]
	cause := protocol.Errorf(protocol.CodeUnauthorized, "the parent's credential is not live")
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); c.FailQueued(ctx, root.SessionID, e, cause) }()
	}
	wg.Wait()
	c.FailQueued(ctx, root.SessionID, e, cause) // a later pass's, again
	if got := children(); got != 1 {
		t.Fatalf("the root's ledger charges %d children after its queued start failed three times; want 1 (the queued child given back once)", got)
	}
	if st, err := waiting.Result(ctx); err != nil || st.ErrorCode != protocol.CodeUnauthorized {
		t.Fatalf("the failed queued run's result: %+v %v; want settled UNAUTHORIZED", st, err)
	}
}
