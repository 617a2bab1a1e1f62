package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

// TestACPChildrenSpendOnTheirBudgets (issue 32, items 2 and 5): an ACP
// child reserves its turn (one model request) on the budgets it draws on
// before its prompt and settles it after: the tokens its agent reported,
// or the whole grant when it reported none (unknown, never zero). Each
// start counts one child. At the modelRequests cap the next ACP child's
// prompt is refused BUDGET_EXHAUSTED before its agent is started; at the
// children cap the next start is refused.
func TestACPChildrenSpendOnTheirBudgets(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	o := acpTestOptions(t)
	o.Budget = s.Client
	ps, err := acpbridge.Providers([]acpbridge.AgentConfig{{Name: "fake", Command: fakeAgent(t)}}, o)
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	root := budgetRoot(t, s, &protocol.Budget{ModelRequests: 2, Children: 3})

	// Reported usage: 10 in, 5 out.
	_, res, err := s.Run(root.Ref(), "fake", "usage 10 5", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the first ACP child: %+v, %v", res, err)
	}
	if rec := ledger(t, s, root.SessionID); rec.Charged != (protocol.BudgetSpend{Tokens: 15, ModelRequests: 1, Children: 1}) || len(rec.Reservations) != 0 {
		t.Fatalf("after a turn that reported its usage the ledger is %+v, want 15 tokens, 1 request, 1 child charged", rec)
	}
	// No usage reported: the grant is charged, one token per two bytes of
	// the prompt plus the answer's bound.
	prompt := "echo hi"
	_, res, err = s.Run(root.Ref(), "fake", prompt, protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the second ACP child: %+v, %v", res, err)
	}
	grant := int64(len(prompt))/2 + 4096
	if rec := ledger(t, s, root.SessionID); rec.Charged != (protocol.BudgetSpend{Tokens: 15 + grant, ModelRequests: 2, Children: 2}) || len(rec.Reservations) != 0 {
		t.Fatalf("after a turn of unknown usage the ledger is %+v, want %d tokens, 2 requests, 2 children charged", rec, 15+grant)
	}
	// At the modelRequests cap: the third child's prompt is refused before
	// its agent starts.
	began := time.Now()
	run, res, err := s.Run(root.Ref(), "fake", "echo again", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeBudgetExhausted {
		t.Fatalf("the third ACP child: %+v, want error BUDGET_EXHAUSTED", res)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("the refusal took %s", took)
	}
	_, evs := s.Log(run.ChildID)
	if got, want := eventTypes(evs), "turn/start user/message subagent/descriptor turn/end"; got != want {
		t.Fatalf("the refused child's log %s, want %s (no agent started, no step)", got, want)
	}
	if rec := ledger(t, s, root.SessionID); rec.Charged.ModelRequests != 2 || rec.Charged.Children != 3 || len(rec.Reservations) != 0 {
		t.Fatalf("after the refusal the ledger is %+v, want 2 requests and 3 children charged", rec)
	}
	// At the children cap the start itself is refused.
	_, _, err = s.Run(root.Ref(), "fake", "echo more", protocol.StartOptions{})
	if protocol.CodeOf(err) != protocol.CodeBudgetExhausted {
		t.Fatalf("a fourth start = %v, want BUDGET_EXHAUSTED", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return len(ledger(t, s, root.SessionID).Reservations) == 0 }, "nothing in flight")

	// A child whose own budget is the only one it draws on: its turn uses
	// the reservation the coordinator took at its admission, settled with
	// what the agent reported (not left to be charged in full).
	run, res, err = s.Run(s.Root().Ref(), "fake", "usage 3 2", protocol.StartOptions{Budget: &protocol.Budget{Tokens: 100}})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the ACP child with its own budget: %+v, %v", res, err)
	}
	if h, _ := s.Log(run.ChildID); h.BudgetStartTokens == 0 {
		t.Fatal("no reservation was taken at admission; the case is not tested")
	}
	if rec := ledger(t, s, run.ChildID); rec.Charged != (protocol.BudgetSpend{Tokens: 5, ModelRequests: 1}) || len(rec.Reservations) != 0 {
		t.Fatalf("the child's own ledger is %+v, want 5 tokens and 1 request charged, nothing in flight", rec)
	}
}

// acpPausedRequest waits until continuable ACP child id is paused at its
// budget's cap, as continuable.state and children.list (under parent)
// say, and returns its pending budget request.
func acpPausedRequest(t *testing.T, s *stack.Stack, parent, id string) protocol.RequestRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var pause *protocol.RequestOpenData
	testutil.Eventually(t, 30*time.Second, func() bool {
		st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: id, Authority: s.Grant()})
		pause = st.BudgetPause
		return err == nil && st.State == protocol.StatePaused && pause != nil
	}, "continuable.state says the ACP child is paused")
	rows, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: parent, Authority: s.Grant()})
	if err != nil || len(rows.Rows) != 1 || rows.Rows[0].State != protocol.StatePaused {
		t.Fatalf("children rows %+v, %v; want the ACP child paused", rows, err)
	}
	rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: pause.RequestID, Authority: s.Grant()})
	if err != nil || rec.Kind != protocol.RequestBudget || rec.State != protocol.RequestPending || rec.BudgetOf != id {
		t.Fatalf("the budget request: %+v, %v; want kind budget, pending, of %s's ledger", rec, err, id)
	}
	return rec
}

// startCapped starts a continuable child of provider ts under root with a
// budget of one model request, and waits until its first turn, which
// spends it, has completed.
func startCapped(ctx context.Context, t *testing.T, s *stack.Stack, root *client.Root) string {
	t.Helper()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "ts", Parent: root.Ref(), Label: "capped",
		Prompt: protocol.Text("hello"), Options: protocol.ContinuableOptions{Budget: &protocol.Budget{ModelRequests: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if ends, _ := acpTurnEnds(t, s, start.ChildID, 1); ends[0].Kind != protocol.TurnCompleted {
		t.Fatalf("the first turn ended %+v", ends[0])
	}
	return start.ChildID
}

// acpTurnEnds waits until child's log holds n turn ends (60 s at most),
// and returns their reasons and the log.
func acpTurnEnds(t *testing.T, s *stack.Stack, child string, n int) ([]protocol.TurnEndReason, []protocol.SessionEvent) {
	t.Helper()
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 60*time.Second, func() bool {
		_, evs = s.Log(child)
		return len(turnEndReasons(evs)) >= n
	}, "turn %d of the ACP child %s ends", n, child)
	return turnEndReasons(evs), evs
}

// TestACPContinuableChildPausesAtItsCap (issue 32, item 3; docs/protocol.md
// §5.5, "Pause and raise"): a continuable ACP child (the
// @agentclientprotocol/sdk test agent) whose budget of one model request
// is spent pauses before its next prompt: continuable.state and
// children.list say paused, a budget request is pending; the user's raise
// continues the same turn, which prompts once and completes (one turn
// end, the agent saw one earlier prompt); paused again, a denial ends the
// turn BUDGET_EXHAUSTED with the denial's reason, no prompt sent.
func TestACPContinuableChildPausesAtItsCap(t *testing.T) {
	acpDep(t, tsSDK)
	script := acpDep(t, tsAgentScript)
	s := stack.New(t)
	s.AddCoordinator()
	o := realAgentOptions(t)
	o.Budget, o.Requests = s.Client, s.Client
	ps, err := acpbridge.Providers([]acpbridge.AgentConfig{{Name: "ts", Command: "node", Args: []string{script},
		Env: map[string]string{"TS_AGENT_STATE_DIR": t.TempDir()}}}, o)
	if err != nil {
		t.Fatal(err)
	}
	s.AddHost(ps...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := s.Root()
	child := startCapped(ctx, t, s, root)

	// Its budget spent, the next turn pauses; the user raises it.
	followup(t, s, child, ref(root), "turns")
	req := acpPausedRequest(t, s, root.SessionID, child)
	if req.Turn != 2 || req.Step != 1 || !strings.Contains(req.Exhausted, "modelRequests") {
		t.Fatalf("the pause's request %+v; want turn 2, step 1, its modelRequests spent", req)
	}
	rep, err := s.Client.RaiseBudget(ctx, child, s.Grant(), protocol.BudgetSpend{ModelRequests: 1})
	if err != nil || strings.Join(rep.Resumed, ",") != req.ID {
		t.Fatalf("the raise = %+v, %v; want request %s answered", rep, err, req.ID)
	}
	got, evs := acpTurnEnds(t, s, child, 2)
	_, answers, _ := turnsOf(evs)
	if len(got) != 2 || got[1].Kind != protocol.TurnCompleted || strings.Count(eventTypes(evs), protocol.EvTurnStart) != 2 ||
		len(answers) != 2 || answers[1] != "turns before this one: 1" {
		t.Fatalf("after the raise: ends %+v, answers %q; want the second turn continued, prompted once, completed", got, answers)
	}

	// Spent again: the next pause is denied.
	followup(t, s, child, ref(root), "hello again")
	req = acpPausedRequest(t, s, root.SessionID, child)
	if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerDeny, Reason: "not now"}); err != nil {
		t.Fatal(err)
	}
	got, _ = acpTurnEnds(t, s, child, 3)
	if r := got[2]; r.Kind != protocol.TurnError || r.Code != protocol.CodeBudgetExhausted || !strings.Contains(r.Error, "denied by the user: not now") {
		t.Fatalf("the denied turn ended %+v; want error BUDGET_EXHAUSTED with the denial", r)
	}
	_, evs = s.Log(child)
	if _, answers, _ := turnsOf(evs); len(answers) != 2 {
		t.Fatalf("answers %q: the denied turn's prompt was sent", answers)
	}
	if rec := ledger(t, s, child); rec.Charged.ModelRequests != 2 || len(rec.Reservations) != 0 {
		t.Fatalf("the child's ledger %+v; want 2 requests charged, nothing in flight", rec)
	}
}

// TestACPPauseSurvivesItsBridgeKilled (issue 32, item 3: "after any
// restart"): a continuable ACP child (the @agentclientprotocol/sdk test
// agent, its sessions kept in a state directory) paused at its budget's
// cap when its `brood acp-bridge` is killed (-9, with its agent) is
// resumed on the live bridge, paused again on the same request (state
// paused, no second request opened); the raise continues the same turn
// there: the ACP session is loaded, the turn's prompt sent once, one turn
// end.
func TestACPPauseSurvivesItsBridgeKilled(t *testing.T) {
	acpDep(t, tsSDK)
	script := acpDep(t, tsAgentScript)
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 300 * time.Millisecond })
	s.Provide("ts")
	agent := "name=ts,command=node,arg=" + script + ",env=TS_AGENT_STATE_DIR=" + t.TempDir()
	bridge := func() *proc {
		return startProcGroup(t, "acp-bridge", "--nats", s.Server.ClientURL(), "--log-level", "info", "--agent", agent,
			"--silence-timeout", "30s", "--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String())
	}
	b1 := bridge()
	s.WaitProvider("ts")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := s.Root()
	child := startCapped(ctx, t, s, root)
	followup(t, s, child, ref(root), "turns")
	req := acpPausedRequest(t, s, root.SessionID, child)
	before, err := s.Store.LeaseLatest(ctx, child)
	if err != nil {
		t.Fatalf("the paused child's lease: %v", err)
	}
	bridge() // another bridge, alive when the first dies
	b1.signal(t, syscall.SIGKILL)
	testutil.Eventually(t, 60*time.Second, func() bool {
		l, err := s.Store.LeaseLatest(ctx, child)
		return err == nil && l.Value.RunID != before.Value.RunID && l.Value.HostID != before.Value.HostID && l.Value.TakenOverBy == ""
	}, "the child is resident again on the live bridge")
	if again := acpPausedRequest(t, s, root.SessionID, child); again.ID != req.ID {
		t.Fatalf("paused again on %s; want the same request %s", again.ID, req.ID)
	}
	_, paused := s.Log(child)
	if n := strings.Count(eventTypes(paused), protocol.EvRequestOpen); n != 1 || len(turnEndReasons(paused)) != 1 {
		t.Fatalf("after the takeover: %s; want the second turn open, paused on its one request", eventTypes(paused))
	}
	if rep, err := s.Client.RaiseBudget(ctx, child, s.Grant(), protocol.BudgetSpend{ModelRequests: 1}); err != nil || strings.Join(rep.Resumed, ",") != req.ID {
		t.Fatalf("the raise = %+v, %v; want request %s answered", rep, err, req.ID)
	}
	ends, evs := acpTurnEnds(t, s, child, 2)
	_, answers, _ := turnsOf(evs)
	if len(ends) != 2 || ends[1].Kind != protocol.TurnCompleted || strings.Count(eventTypes(evs), protocol.EvTurnStart) != 2 || len(answers) != 2 || answers[1] != "turns before this one: 1" {
		t.Fatalf("ends %+v, answers %q; want the second turn continued on the live bridge, prompted once, completed", ends, answers)
	}
	if got := acpSessions(evs); len(got) != 2 || !got[1].Loaded || got[1].SessionID != got[0].SessionID {
		t.Fatalf("acp/session events %+v; want the first session loaded on the live bridge", got)
	}
}
