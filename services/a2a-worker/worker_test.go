package a2aworker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The SDK's HTTP keep-alive connections to the test agent.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// echo is a small A2A agent built with the same SDK: it answers
// "echo: <text>"; a message "slow <duration> <text>" works that long first
// (honouring cancellation). It records every task it started, and every
// task cancelled.
type echo struct {
	mu        sync.Mutex
	started   []a2a.TaskInfo
	texts     []string
	cancelled []a2a.TaskID
}

func (e *echo) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		text := ec.Message.Parts[0].Text()
		e.mu.Lock()
		e.started = append(e.started, ec.TaskInfo())
		e.texts = append(e.texts, text)
		e.mu.Unlock()
		if !yield(a2a.NewSubmittedTask(ec, ec.Message), nil) {
			return
		}
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
			return
		}
		if rest, ok := strings.CutPrefix(text, "slow "); ok {
			ds, t, _ := strings.Cut(rest, " ")
			d, _ := time.ParseDuration(ds)
			text = t
			select {
			case <-ctx.Done():
				yield(nil, context.Cause(ctx))
				return
			case <-time.After(d):
			}
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart("echo: "+text)), nil) {
			return
		}
		done := a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil)
		if rest, ok := strings.CutPrefix(text, "usage "); ok {
			// "usage IN OUT": the task reports that usage (ExtUsage).
			var in, out int
			_, _ = fmt.Sscanf(rest, "%d %d", &in, &out)
			done.Metadata = map[string]any{ExtUsage: map[string]any{"inputTokens": in, "outputTokens": out}}
		}
		yield(done, nil)
	}
}

func (e *echo) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		e.mu.Lock()
		e.cancelled = append(e.cancelled, ec.TaskID)
		e.mu.Unlock()
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func (e *echo) snapshot() (started []a2a.TaskInfo, texts []string, cancelled []a2a.TaskID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]a2a.TaskInfo(nil), e.started...), append([]string(nil), e.texts...), append([]a2a.TaskID(nil), e.cancelled...)
}

// startEcho serves the echo agent (JSON-RPC) and its card on a loopback
// port; it returns the agent and its card URL.
func startEcho(t *testing.T) (*echo, string) {
	t.Helper()
	e := &echo{}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	card := &a2a.AgentCard{
		Name: "echo", Description: "echoes", Version: "1",
		SupportedInterfaces: []*a2a.AgentInterface{a2a.NewAgentInterface(srv.URL+"/rpc", a2a.TransportProtocolJSONRPC)},
		Capabilities:        a2a.AgentCapabilities{Streaming: true},
		DefaultInputModes:   []string{"text/plain"}, DefaultOutputModes: []string{"text/plain"},
		Skills: []a2a.AgentSkill{{ID: "echo", Name: "echo", Description: "echoes", Tags: []string{"echo"}}},
	}
	mux.Handle("/.well-known/agent-card.json", a2asrv.NewStaticAgentCardHandler(card))
	mux.Handle("/rpc", a2asrv.NewJSONRPCHandler(a2asrv.NewHandler(e)))
	return e, srv.URL + "/.well-known/agent-card.json"
}

// cut is an HTTP transport the test can cut, as a killed worker's
// connections are: nothing it would send after that reaches the agent.
type cut struct{ down atomic.Bool }

func (c *cut) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.down.Load() {
		return nil, errors.New("the worker is dead")
	}
	return http.DefaultTransport.RoundTrip(r)
}

const name = "a2a-echo"

// addWorker starts an a2a worker on its own connection; kill stops it as a
// kill would: its HTTP is cut first (it sends the remote agent nothing
// more), then its connection closes and it stops.
func addWorker(t *testing.T, s *stack.Stack, cardURL string) (kill func()) {
	t.Helper()
	s.Provide(name)
	nc := s.Conn()
	tr := &cut{}
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer bcancel()
	st, err := store.Bind(bctx, nc, s.Store.Subj)
	if err != nil {
		t.Fatal(err)
	}
	st.Cfg = s.Store.Cfg
	h, err := New(Config{NC: nc, Store: st, Name: name, CardURL: cardURL,
		HTTPClient: &http.Client{Transport: tr}, HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry,
		DrainGrace: 2 * time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	s.WaitProvider(name)
	var once sync.Once
	kill = func() {
		once.Do(func() {
			tr.down.Store(true)
			nc.Close()
			cancel()
			<-done
		})
	}
	t.Cleanup(kill)
	return kill
}

func newStack(t *testing.T) *stack.Stack {
	s := stack.New(t)
	s.AddCoordinator()
	return s
}

func toolCalls(t *testing.T, s *stack.Stack, child string) []string {
	t.Helper()
	_, evs := s.Log(child)
	var ids []string
	for _, ev := range evs {
		var d protocol.ToolCallData
		if ev.Type == protocol.EvToolCall && ev.Decode(&d) == nil && d.Name == TaskTool {
			ids = append(ids, d.Arguments)
		}
	}
	return ids
}

// TestDelegatesOneShotAndContinuable: a one-shot Brood run answers with the
// remote agent's answer; a continuable child's followup goes to the same
// remote context; each remote task's id is in the child's log.
func TestDelegatesOneShotAndContinuable(t *testing.T) {
	s := newStack(t)
	e, card := startEcho(t)
	addWorker(t, s, card)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	_, res, err := s.Run(root.Ref(), name, "hello", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "echo: hello" {
		t.Fatalf("one-shot: %v %+v", err, res)
	}
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: name, Parent: root.Ref(), Label: "c", Prompt: protocol.Text("first")})
	if err != nil {
		t.Fatal(err)
	}
	answered := func(want string) {
		testutil.Eventually(t, 30*time.Second, func() bool {
			got, err := s.Client.SessionResult(ctx, protocol.SessionResultRequest{SessionID: r.ChildID, Authority: s.Grant()})
			return err == nil && got.Finished && protocol.PlainText(got.Output) == want
		}, "the child answered %q", want)
	}
	answered("echo: first")
	if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: r.ChildID, Authority: s.Grant(), Message: protocol.Text("second")}); err != nil {
		t.Fatal(err)
	}
	answered("echo: second")
	started, texts, _ := e.snapshot()
	if len(started) != 3 || texts[1] != "first" || texts[2] != "second" {
		t.Fatalf("remote tasks: %v %v", started, texts)
	}
	if started[1].ContextID != started[2].ContextID || started[0].ContextID == started[1].ContextID {
		t.Fatalf("remote contexts: %v (the followup must reuse the child's, the one-shot run has its own)", started)
	}
	calls := toolCalls(t, s, r.ChildID)
	if len(calls) != 2 || !strings.Contains(calls[0], string(started[1].TaskID)) || !strings.Contains(calls[1], string(started[2].TaskID)) {
		t.Fatalf("logged remote tasks %v, want %v", calls, started[1:])
	}
}

// TestDisposeCancelsTheRemoteTask: a parent's dispose of its child reaches
// the remote agent as CancelTask of the remote task the turn waits for.
func TestDisposeCancelsTheRemoteTask(t *testing.T) {
	s := newStack(t)
	e, card := startEcho(t)
	addWorker(t, s, card)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: name, Parent: root.Ref(), Label: "slow", Prompt: protocol.Text("slow 60s never")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return len(toolCalls(t, s, r.ChildID)) == 1 }, "the remote task logged")
	if _, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: s.Grant(), Children: []string{r.ChildID}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		started, _, cancelled := e.snapshot()
		return len(started) == 1 && len(cancelled) == 1 && cancelled[0] == started[0].TaskID
	}, "the remote task was not cancelled")
}

// TestKilledWorkerReattaches: a worker killed while its child waits for a
// remote task; the takeover closes the turn. The child's next turn, on
// another worker, re-attaches to that remote task (waits for it and gives
// its answer) and sends only the new message: the remote agent sees two
// tasks, never the first message twice.
func TestKilledWorkerReattaches(t *testing.T) {
	s := newStack(t)
	e, card := startEcho(t)
	kill := addWorker(t, s, card)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	root := s.Root()
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: name, Parent: root.Ref(), Label: "slow", Prompt: protocol.Text("slow 4s first")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return len(toolCalls(t, s, r.ChildID)) == 1 }, "the remote task logged")
	kill()
	// The takeover closes the turn interrupted.
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs := s.Log(r.ChildID)
		for _, ev := range evs {
			var d protocol.TurnEndData
			if ev.Type == protocol.EvTurnEnd && ev.Decode(&d) == nil && d.Reason.Kind == protocol.TurnInterrupted {
				return true
			}
		}
		return false
	}, "the killed worker's turn was closed")
	addWorker(t, s, card)
	if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: r.ChildID, Authority: s.Grant(), Message: protocol.Text("second")}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		got, err := s.Client.SessionResult(ctx, protocol.SessionResultRequest{SessionID: r.ChildID, Authority: s.Grant()})
		return err == nil && got.Finished && protocol.PlainText(got.Output) == "echo: first\necho: second"
	}, "the next turn gave the re-attached task's answer and its own")
	started, texts, cancelled := e.snapshot()
	if len(started) != 2 || texts[0] != "slow 4s first" || texts[1] != "second" || len(cancelled) != 0 {
		t.Fatalf("remote tasks %v %v, cancelled %v: want the first once, then the second", started, texts, cancelled)
	}
	if started[0].ContextID != started[1].ContextID {
		t.Fatalf("remote contexts %v: the followup must reuse the child's", started)
	}
}

// TestABroodRunDelegates: a spawn agent whose subagent tool delegates to the
// a2a provider gets the remote agent's answer as its child's result; and
// when the spawn run is disposed while its a2a child waits, the dispose
// reaches the remote task as CancelTask.
func TestABroodRunDelegates(t *testing.T) {
	s := newStack(t)
	e, card := startEcho(t)
	addWorker(t, s, card)
	s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.SubagentProvider = name })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	first, res, err := s.Run(root.Ref(), "spawn", `call subagent {"description":"ask echo","prompt":"hello"}`+"\nsay done", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("delegating run: %v %+v", err, res)
	}
	_, evs := s.Log(first.ChildID)
	found := false
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "subagent" && strings.Contains(protocol.PlainText(d.Content), "echo: hello") {
			found = true
		}
	}
	if !found {
		t.Fatalf("the spawn agent's subagent result lacks the remote answer")
	}
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn",
		Prompt: protocol.Text(`call subagent {"description":"ask echo","prompt":"slow 60s never"}` + "\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		started, _, _ := e.snapshot()
		return len(started) == 2
	}, "the remote task of the delegated child started")
	if _, err := run.Dispose(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		started, _, cancelled := e.snapshot()
		return len(cancelled) == 1 && cancelled[0] == started[1].TaskID
	}, "the parent's dispose did not cancel the remote task")
}

// TestRemoteTasksSpendOnTheirBudgets (issue 32, item 2): an a2a child that
// draws on a budget reserves each step (a request to the remote agent) and
// its a2a_task call: one turn charges two model requests, one tool call,
// and, the remote reporting no usage, each step's whole token grant
// (unknown, never zero). At the modelRequests cap the next child's turn is
// refused BUDGET_EXHAUSTED before anything reaches the remote agent.
func TestRemoteTasksSpendOnTheirBudgets(t *testing.T) {
	s := newStack(t)
	e, card := startEcho(t)
	addWorker(t, s, card)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	_, res, err := s.Run(root.Ref(), name, "hello", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the first child: %v %+v", err, res)
	}
	var rec protocol.BudgetRecord
	testutil.Eventually(t, 10*time.Second, func() bool {
		got, err := s.Store.Budget(ctx, root.SessionID)
		rec = got.Value
		return err == nil && len(rec.Reservations) == 0
	}, "the first child's reservations settled")
	if rec.Charged.ModelRequests != 2 || rec.Charged.ToolCalls != 1 || rec.Charged.Children != 1 || rec.Charged.Tokens <= 2*4096 {
		t.Fatalf("the ledger charged %+v, want 2 requests, 1 tool call, 1 child and two whole grants of tokens", rec.Charged)
	}
	_, res, err = s.Run(root.Ref(), name, "again", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeBudgetExhausted {
		t.Fatalf("the second child: %+v, want error BUDGET_EXHAUSTED", res)
	}
	if started, _, _ := e.snapshot(); len(started) != 1 {
		t.Fatalf("the remote agent got %d tasks, want the first child's only", len(started))
	}
}

// TestRemoteTaskUsageIsCharged (issue 32, item 5): a remote task that
// reports its usage (the usage extension's task metadata) has it logged as
// its step's and charged instead of the step's whole grant; the step that
// sent the message reports none and stays unknown.
func TestRemoteTaskUsageIsCharged(t *testing.T) {
	s := newStack(t)
	_, card := startEcho(t)
	addWorker(t, s, card)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	_, res, err := s.Run(root.Ref(), name, "usage 7 3", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the child: %v %+v", err, res)
	}
	if u := res.Usage; u == nil || u.Own.InputTokens != 7 || u.Own.OutputTokens != 3 || u.Own.ModelRequests != 2 || u.Own.UnreportedRequests != 1 {
		t.Fatalf("the child's usage %+v, want 7 in and 3 out reported by one of its 2 requests", u)
	}
	var rec protocol.BudgetRecord
	testutil.Eventually(t, 10*time.Second, func() bool {
		got, err := s.Store.Budget(ctx, root.SessionID)
		rec = got.Value
		return err == nil && len(rec.Reservations) == 0
	}, "the reservations settled")
	// The sending step's whole grant (at least the 4096-token answer
	// bound) and the reported 10: not a second whole grant.
	if rest := rec.Charged.Tokens - 10; rest < 4096 || rest >= 2*4096 {
		t.Fatalf("the ledger charged %d tokens, want one step's grant plus the 10 reported", rec.Charged.Tokens)
	}
}
