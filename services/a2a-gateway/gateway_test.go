package a2agateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Every gateway's goroutines (HTTP server, user connections, roots'
// renewals, streams) end when it stops.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	aliceToken = "alice-secret-token"
	bobToken   = "bob-secret-token"
)

var testCallers = []Caller{
	{User: "alice", TokenSHA256: TokenHash(aliceToken)},
	{User: "bob", TokenSHA256: TokenHash(bobToken)},
}

// env is a Brood stack (a coordinator, a spawn worker with the scripted
// model) and a gateway over it.
type env struct {
	t  *testing.T
	s  *stack.Stack
	gw *Gateway
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	e := &env{t: t, s: s}
	e.gw, _ = e.startGateway("127.0.0.1:0")
	return e
}

// startGateway starts a gateway on addr; stop ends it (and the test's end
// does too).
func (e *env) startGateway(addr string) (*Gateway, func()) {
	e.t.Helper()
	url := e.s.URL
	gw, err := New(Config{
		Listen: addr, Callers: testCallers, Cards: e.s.Client, Logger: testutil.Logger(e.t), Workspace: e.t.TempDir(),
		Dial: func(user, _ string) (*nats.Conn, error) {
			return nats.Connect(url, nats.CustomInboxPrefix(protocol.UserInboxPrefix(user)), nats.MaxReconnects(-1))
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	stop := testutil.Background(e.t, gw)
	select {
	case <-gw.Ready():
	case <-time.After(10 * time.Second):
		e.t.Fatal("gateway not listening after 10s")
	}
	return gw, stop
}

// bearer adds a token to every request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

func httpClient(token string) *http.Client {
	return &http.Client{Transport: bearer{token: token, base: http.DefaultTransport}}
}

// client discovers provider's card on gw and returns an SDK client of one
// binding, authenticated with token.
func (e *env) client(gw *Gateway, provider, token string, binding a2a.TransportProtocol) *a2aclient.Client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	card, err := agentcard.NewResolver(http.DefaultClient).Resolve(ctx, gw.AgentURL(provider))
	if err != nil {
		e.t.Fatalf("resolve card: %v", err)
	}
	var iface *a2a.AgentInterface
	for _, i := range card.SupportedInterfaces {
		if i.ProtocolBinding == binding {
			iface = i
		}
	}
	if iface == nil {
		e.t.Fatalf("card has no %s interface: %+v", binding, card.SupportedInterfaces)
	}
	hc := httpClient(token)
	cl, err := a2aclient.NewFromEndpoints(ctx, []*a2a.AgentInterface{iface},
		a2aclient.WithJSONRPCTransport(hc), a2aclient.WithRESTTransport(hc))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cl.Destroy() })
	return cl
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func userMsg(contextID, text string) *a2a.SendMessageRequest {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	m.ContextID = contextID
	return &a2a.SendMessageRequest{Message: m}
}

func immediately(r *a2a.SendMessageRequest) *a2a.SendMessageRequest {
	r.Config = &a2a.SendMessageConfig{ReturnImmediately: true}
	return r
}

func artifactText(t *a2a.Task) string {
	var b strings.Builder
	for _, a := range t.Artifacts {
		for _, p := range a.Parts {
			b.WriteString(p.Text())
		}
	}
	return b.String()
}

func asTask(t *testing.T) func(r a2a.SendMessageResult, err error) *a2a.Task {
	return func(r a2a.SendMessageResult, err error) *a2a.Task {
		t.Helper()
		if err != nil {
			t.Fatalf("send: %v", err)
		}
		task, ok := r.(*a2a.Task)
		if !ok {
			t.Fatalf("send answered %T, want a task", r)
		}
		return task
	}
}

var bindings = []a2a.TransportProtocol{a2a.TransportProtocolJSONRPC, a2a.TransportProtocolHTTPJSON}

// TestCardPerProvider: each continuable provider has a card naming both
// bindings, bearer auth, streaming, a skill for the provider and one per
// tool, and the Brood extensions; an unknown provider has none.
func TestCardPerProvider(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	card, err := agentcard.NewResolver(http.DefaultClient).Resolve(ctx, e.gw.AgentURL("spawn"))
	if err != nil {
		t.Fatal(err)
	}
	if card.Name != "spawn" || !card.Capabilities.Streaming || len(card.SupportedInterfaces) != 2 {
		t.Fatalf("card: %+v", card)
	}
	skills := map[string]bool{}
	for _, s := range card.Skills {
		skills[s.ID] = true
	}
	for _, want := range []string{"spawn", "tool/subagent", "tool/read_file"} {
		if !skills[want] {
			t.Errorf("card skills %v lack %s", skills, want)
		}
	}
	exts := map[string]bool{}
	for _, x := range card.Capabilities.Extensions {
		exts[x.URI] = true
	}
	if !exts[ExtCascadingCancel] || !exts[ExtUsage] {
		t.Errorf("card extensions %v lack the Brood ones", exts)
	}
	if _, ok := card.SecuritySchemes[bearerScheme]; !ok || len(card.SecurityRequirements) != 1 {
		t.Errorf("card security: %+v %+v", card.SecuritySchemes, card.SecurityRequirements)
	}
	if _, err := agentcard.NewResolver(http.DefaultClient).Resolve(ctx, e.gw.AgentURL("nope")); err == nil {
		t.Error("a card for an unknown provider")
	}
}

// TestSendGetFollowupList runs, on each binding: a one-shot send (answered
// once the turn ended), get, a followup in the same context (its next
// task), and list by context and overall.
func TestSendGetFollowupList(t *testing.T) {
	e := newEnv(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			ctx := ctxT(t, 60*time.Second)
			cl := e.client(e.gw, "spawn", aliceToken, b)
			first := asTask(t)(cl.SendMessage(ctx, userMsg("", "say hello "+string(b))))
			if first.Status.State != a2a.TaskStateCompleted || artifactText(first) != "hello "+string(b) {
				t.Fatalf("first task: %s %q", first.Status.State, artifactText(first))
			}
			if first.ContextID == "" || !strings.HasPrefix(string(first.ID), first.ContextID+".") {
				t.Fatalf("ids: task %s context %s", first.ID, first.ContextID)
			}
			got, err := cl.GetTask(ctx, &a2a.GetTaskRequest{ID: first.ID})
			if err != nil || got.Status.State != a2a.TaskStateCompleted || artifactText(got) != artifactText(first) {
				t.Fatalf("get: %v %+v", err, got)
			}
			if len(got.History) == 0 || got.History[0].Parts[0].Text() != "say hello "+string(b) {
				t.Errorf("get history: %+v", got.History)
			}
			second := asTask(t)(cl.SendMessage(ctx, userMsg(first.ContextID, "say again")))
			if second.ContextID != first.ContextID || second.ID == first.ID || second.Status.State != a2a.TaskStateCompleted || artifactText(second) != "again" {
				t.Fatalf("followup task: %+v (first %s)", second, first.ID)
			}
			if second.Metadata[metaTurn] == nil {
				t.Errorf("followup metadata: %+v", second.Metadata)
			}
			list, err := cl.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: first.ContextID, IncludeArtifacts: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Tasks) != 2 || list.Tasks[0].ID != first.ID || list.Tasks[1].ID != second.ID || artifactText(list.Tasks[1]) != "again" {
				t.Fatalf("list of the context: %+v", list.Tasks)
			}
			all, err := cl.ListTasks(ctx, &a2a.ListTasksRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if !hasTask(all.Tasks, second.ID) {
				t.Fatalf("list of every context lacks %s: %d tasks", second.ID, len(all.Tasks))
			}
		})
	}
}

func hasTask(ts []*a2a.Task, id a2a.TaskID) bool {
	for _, t := range ts {
		if t.ID == id {
			return true
		}
	}
	return false
}

// TestStream: a streamed send yields the task, then working, the
// assistant's text, the output artifact and the completed status, in that
// order, on each binding.
func TestStream(t *testing.T) {
	e := newEnv(t)
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			ctx := ctxT(t, 60*time.Second)
			cl := e.client(e.gw, "spawn", aliceToken, b)
			var kinds []string
			var final a2a.TaskState
			var art string
			for ev, err := range cl.SendStreamingMessage(ctx, userMsg("", "sleep 200ms\nsay streamed")) {
				if err != nil {
					t.Fatalf("stream: %v (after %v)", err, kinds)
				}
				switch v := ev.(type) {
				case *a2a.Task:
					kinds = append(kinds, "task:"+string(v.Status.State))
				case *a2a.TaskStatusUpdateEvent:
					kinds = append(kinds, "status:"+string(v.Status.State))
					final = v.Status.State
				case *a2a.TaskArtifactUpdateEvent:
					kinds = append(kinds, "artifact")
					art = v.Artifact.Parts[0].Text()
				}
			}
			if final != a2a.TaskStateCompleted || art != "streamed" || kinds[0] != "task:"+string(a2a.TaskStateSubmitted) {
				t.Fatalf("stream events %v, final %s, artifact %q", kinds, final, art)
			}
			if !containsInOrder(kinds, "status:"+string(a2a.TaskStateWorking), "artifact", "status:"+string(a2a.TaskStateCompleted)) {
				t.Fatalf("stream events out of order: %v", kinds)
			}
		})
	}
}

func containsInOrder(have []string, want ...string) bool {
	i := 0
	for _, h := range have {
		if i < len(want) && h == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestResubscribeAfterGatewayRestart: a task is started on one gateway, its
// stream is read there, the gateway stops mid-task; a new gateway (nothing
// carried over) re-subscribes and gets the task to its end from Brood.
func TestResubscribeAfterGatewayRestart(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 90*time.Second)
	gw1, stop1 := e.startGateway("127.0.0.1:0")
	cl1 := e.client(gw1, "spawn", aliceToken, a2a.TransportProtocolJSONRPC)
	// 8 s: long enough on a loaded machine for the stop and the second
	// gateway's start to happen while the task still works.
	task := asTask(t)(cl1.SendMessage(ctx, immediately(userMsg("", "sleep 8s\nsay survived"))))
	sctx, scancel := context.WithCancel(ctx)
	var first a2a.Event
	for ev, err := range cl1.SubscribeToTask(sctx, &a2a.SubscribeToTaskRequest{ID: task.ID}) {
		if err != nil {
			t.Fatal(err)
		}
		first = ev
		break
	}
	scancel()
	if tk, ok := first.(*a2a.Task); !ok || tk.ID != task.ID || tk.Status.State.Terminal() {
		t.Fatalf("first event of the subscription: %#v", first)
	}
	stop1()
	gw2, _ := e.startGateway("127.0.0.1:0")
	cl2 := e.client(gw2, "spawn", aliceToken, a2a.TransportProtocolHTTPJSON)
	var final a2a.TaskState
	var art string
	updates := 0
	for ev, err := range cl2.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: task.ID}) {
		if err != nil {
			t.Fatal(err)
		}
		switch v := ev.(type) {
		case *a2a.Task:
			final = v.Status.State
		case *a2a.TaskStatusUpdateEvent:
			final = v.Status.State
			updates++
		case *a2a.TaskArtifactUpdateEvent:
			art = v.Artifact.Parts[0].Text()
		}
	}
	if final != a2a.TaskStateCompleted || art != "survived" || updates == 0 {
		t.Fatalf("after the restart the subscription ended %s with %q after %d updates (want the task still working when re-subscribed, then completed)", final, art, updates)
	}
}

// TestCancelCascadesToGrandchild: the context's agent starts a background
// child of its own (the caller's grandchild) and works on; CancelTask ends
// the task canceled, and Brood's logs show both the context's turn and the
// grandchild's turn ended aborted.
func TestCancelCascadesToGrandchild(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 90*time.Second)
	cl := e.client(e.gw, "spawn", aliceToken, a2a.TransportProtocolJSONRPC)
	script := `call subagent {"description":"grandchild","prompt":"sleep 60s\nsay never","run_in_background":true}
sleep 60s
say never`
	task := asTask(t)(cl.SendMessage(ctx, immediately(userMsg("", script))))
	var grandchild string
	testutil.Eventually(t, 30*time.Second, func() bool {
		rows, err := e.s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: task.ContextID, Authority: e.s.Grant()})
		if err != nil || len(rows.Rows) == 0 || rows.Rows[0].State != protocol.StateRunning {
			return false
		}
		// Its turn is open: a dispose that came before the turn's first
		// record would end the run with no turn to end aborted.
		_, evs := e.s.Log(rows.Rows[0].ID)
		for _, ev := range evs {
			if ev.Type == protocol.EvTurnStart {
				grandchild = rows.Rows[0].ID
				return true
			}
		}
		return false
	}, "the context's agent started no running grandchild with an open turn")
	canceled, err := cl.CancelTask(ctx, &a2a.CancelTaskRequest{ID: task.ID})
	if err != nil {
		t.Fatal(err)
	}
	if canceled.Status.State != a2a.TaskStateCanceled {
		t.Fatalf("cancel answered %s", canceled.Status.State)
	}
	for _, id := range []string{task.ContextID, grandchild} {
		testutil.Eventually(t, 30*time.Second, func() bool {
			_, evs := e.s.Log(id)
			for _, ev := range evs {
				var d protocol.TurnEndData
				if ev.Type == protocol.EvTurnEnd && ev.Decode(&d) == nil && d.Reason.Kind == protocol.TurnAborted {
					return true
				}
			}
			return false
		}, "session %s has no aborted turn in its log", id)
	}
	if _, err := cl.CancelTask(ctx, &a2a.CancelTaskRequest{ID: task.ID}); !errors.Is(err, a2a.ErrTaskNotCancelable) {
		t.Fatalf("a second cancel: %v, want TaskNotCancelable", err)
	}
}

// TestAnotherCallerIsRefused: bob reaches none of alice's tasks or
// contexts, whatever the method (TaskNotFound, as for a task that does not
// exist); a request without a known token is 401.
func TestAnotherCallerIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 60*time.Second)
	alice := e.client(e.gw, "spawn", aliceToken, a2a.TransportProtocolJSONRPC)
	task := asTask(t)(alice.SendMessage(ctx, userMsg("", "say mine")))
	for _, b := range bindings {
		t.Run(string(b), func(t *testing.T) {
			bob := e.client(e.gw, "spawn", bobToken, b)
			if _, err := bob.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID}); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("bob's get of alice's task: %v", err)
			}
			if _, err := bob.CancelTask(ctx, &a2a.CancelTaskRequest{ID: task.ID}); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("bob's cancel of alice's task: %v", err)
			}
			for _, err := range bob.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: task.ID}) {
				if !errors.Is(err, a2a.ErrTaskNotFound) {
					t.Errorf("bob's subscribe to alice's task: %v", err)
				}
				break
			}
			if _, err := bob.SendMessage(ctx, userMsg(task.ContextID, "say stolen")); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("bob's followup in alice's context: %v", err)
			}
			if _, err := bob.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: task.ContextID}); !errors.Is(err, a2a.ErrTaskNotFound) {
				t.Errorf("bob's list of alice's context: %v", err)
			}
			all, err := bob.ListTasks(ctx, &a2a.ListTasksRequest{})
			if err != nil || hasTask(all.Tasks, task.ID) {
				t.Errorf("bob's list: %v, has alice's task: %v", err, all != nil && hasTask(all.Tasks, task.ID))
			}
			// Ids bob forges: a made-up context, a made-up message in it.
			for _, id := range []a2a.TaskID{"nope", a2a.TaskID(task.ContextID + ".forged"), a2a.TaskID("x." + task.ContextID)} {
				if _, err := bob.GetTask(ctx, &a2a.GetTaskRequest{ID: id}); !errors.Is(err, a2a.ErrTaskNotFound) {
					t.Errorf("bob's get of %s: %v", id, err)
				}
			}
		})
	}
	// Alice's own forged message id in her own context names nothing.
	if _, err := alice.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(task.ContextID + ".forged")}); !errors.Is(err, a2a.ErrTaskNotFound) {
		t.Errorf("a forged message id: %v", err)
	}
	for _, token := range []string{"", "wrong"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.gw.AgentURL("spawn")+"/jsonrpc",
			strings.NewReader(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":%q}}`, task.ID)))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: status %d, want 401", token, resp.StatusCode)
		}
	}
}

// TestBadMessagesStartNothing: a message over MessageBytesMax, a body over
// RequestBytesMax, a part that is not text, a message without text and one
// naming a taskId (input-required is a seam) are refused, and no session
// is written for any of them.
func TestBadMessagesStartNothing(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 60*time.Second)
	cl := e.client(e.gw, "spawn", aliceToken, a2a.TransportProtocolJSONRPC)
	before := e.s.SessionCount()
	withTask := userMsg("", "say x")
	withTask.Message.TaskID = "01K0000000000000000000000A.01K0000000000000000000000B"
	data := userMsg("", "")
	data.Message.Parts = a2a.ContentParts{a2a.NewDataPart(map[string]any{"k": 1})}
	for _, tc := range []struct {
		name string
		req  *a2a.SendMessageRequest
		want error
	}{
		{"text over MessageBytesMax", userMsg("", strings.Repeat("x", MessageBytesMax+1)), a2a.ErrInvalidParams},
		{"body over RequestBytesMax", userMsg("", strings.Repeat("x", RequestBytesMax+1)), nil},
		{"a data part", data, a2a.ErrUnsupportedContentType},
		{"no text", userMsg("", "  "), a2a.ErrInvalidParams},
		{"a taskId", withTask, a2a.ErrUnsupportedOperation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cl.SendMessage(ctx, tc.req)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("send: %v, want %v", err, tc.want)
			}
		})
	}
	if after := e.s.SessionCount(); after != before {
		t.Fatalf("%d sessions before, %d after: a refused message started something", before, after)
	}
}
