package acpagent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	acpagent "github.com/brood-dev/brood/services/acp-agent"
)

// askedEditor is an editor that records the session/request_permission it
// gets and the updates of the tool calls they stand for, and answers each
// with decide.
type askedEditor struct {
	editor
	decide func(ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionOutcome

	mu       sync.Mutex
	asks     []acp.RequestPermissionRequest
	statuses map[acp.ToolCallId][]acp.ToolCallStatus
	texts    map[acp.ToolCallId][]string // the text of each update's content
}

func (e *askedEditor) RequestPermission(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	e.mu.Lock()
	e.asks = append(e.asks, req)
	e.mu.Unlock()
	return acp.RequestPermissionResponse{Outcome: e.decide(ctx, req)}, nil
}

func (e *askedEditor) SessionUpdate(ctx context.Context, n acp.SessionNotification) error {
	text := func(cs []acp.ToolCallContent) string {
		var b strings.Builder
		for _, c := range cs {
			if c.Content != nil && c.Content.Content.Text != nil {
				b.WriteString(c.Content.Content.Text.Text)
			}
		}
		return b.String()
	}
	e.mu.Lock()
	switch u := n.Update; {
	case u.ToolCall != nil && strings.HasPrefix(string(u.ToolCall.ToolCallId), "request-"):
		e.statuses[u.ToolCall.ToolCallId] = append(e.statuses[u.ToolCall.ToolCallId], u.ToolCall.Status)
		e.texts[u.ToolCall.ToolCallId] = append(e.texts[u.ToolCall.ToolCallId], text(u.ToolCall.Content))
	case u.ToolCallUpdate != nil && u.ToolCallUpdate.Status != nil && strings.HasPrefix(string(u.ToolCallUpdate.ToolCallId), "request-"):
		e.statuses[u.ToolCallUpdate.ToolCallId] = append(e.statuses[u.ToolCallUpdate.ToolCallId], *u.ToolCallUpdate.Status)
		e.texts[u.ToolCallUpdate.ToolCallId] = append(e.texts[u.ToolCallUpdate.ToolCallId], text(u.ToolCallUpdate.Content))
	}
	e.mu.Unlock()
	return e.editor.SessionUpdate(ctx, n)
}

func (e *askedEditor) taken() ([]acp.RequestPermissionRequest, map[acp.ToolCallId][]acp.ToolCallStatus) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := map[acp.ToolCallId][]acp.ToolCallStatus{}
	for k, v := range e.statuses {
		st[k] = append([]acp.ToolCallStatus(nil), v...)
	}
	return append([]acp.RequestPermissionRequest(nil), e.asks...), st
}

func newAskedEditor() *askedEditor {
	return &askedEditor{statuses: map[acp.ToolCallId][]acp.ToolCallStatus{}, texts: map[acp.ToolCallId][]string{}}
}

func (e *askedEditor) textsOf(id acp.ToolCallId) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.texts[id]...)
}

func selected(id string) acp.RequestPermissionOutcome {
	return acp.RequestPermissionOutcome{Selected: &acp.RequestPermissionOutcomeSelected{OptionId: acp.PermissionOptionId(id)}}
}

var cancelled = acp.RequestPermissionOutcome{Cancelled: &acp.RequestPermissionOutcomeCancelled{}}

// requestOf returns the Brood request id and asking session an ask names
// in its _meta.
func requestOf(t *testing.T, req acp.RequestPermissionRequest) (id, session string) {
	t.Helper()
	m, _ := req.Meta[protocol.ACPMetaKey].(map[string]any)
	id, _ = m["requestId"].(string)
	session, _ = m["sessionId"].(string)
	if id == "" || session == "" || req.ToolCall.ToolCallId != acp.ToolCallId("request-"+id) {
		t.Fatalf("the ask names no request: meta %v, tool call %q", req.Meta, req.ToolCall.ToolCallId)
	}
	return id, session
}

// listCounter counts the requests.list calls on the wire; the function it
// returns waits until n more were made (an agent's polls are at most
// RequestPollMax apart).
func listCounter(t *testing.T, s *stack.Stack) func(t *testing.T, n int64) {
	t.Helper()
	var lists atomic.Int64
	sub, err := s.NC.Subscribe("*.v1.>", func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, "."+protocol.EpRequestsList) {
			lists.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func(t *testing.T, n int64) {
		t.Helper()
		from := lists.Load()
		testutil.Eventually(t, time.Duration(n+2)*acpagent.RequestPollMax, func() bool { return lists.Load() >= from+n },
			"%d more requests.list", n)
	}
}

// TestEditorAnswersTheTreesRequests (issue 33, item 4): a background child
// of an ACP session of `brood acp-agent` parks a call on a request; the
// editor (the ACP Go SDK's client side) gets it as session/request_permission
// in that session, once, however long it takes to answer (and when
// the editor loads the session again meanwhile); its choice
// reaches the child through requests.answer as the user's: approved, the
// tool runs and the turn completes; denied, the call's result is the
// denial; a question's choices are the options and the chosen one is the
// answer. A cancelled ask leaves the request pending and is not asked
// again; a request answered elsewhere while the editor is asked has its
// ask cancelled, and the other answer stands.
func TestEditorAnswersTheTreesRequests(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	polls := listCounter(t, s)
	const write = `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"
	const ask = `call ask {"question":"Which database?","choices":["postgres","sqlite"]}` + "\nsay done"
	approve := func(t *testing.T, id string) {
		t.Helper()
		if _, err := s.Client.AnswerRequest(context.Background(), protocol.RequestAnswerRequest{RequestID: id, Authority: s.Grant(), Answer: protocol.AnswerApprove}); err != nil {
			t.Error(err)
		}
	}
	tests := []struct {
		name   string
		script string
		// decide answers the ask; after, when set, runs once it answered,
		// while the child's call is parked.
		decide  func(t *testing.T, ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionOutcome
		after   func(t *testing.T, id string)
		reload  bool // the editor loads the session again while it is asked
		tool    string
		result  string
		isError bool
		written bool
		state   string // the request's, in the child's log
		final   acp.ToolCallStatus
	}{
		{"approved in the editor, asked once while it waits", write, func(t *testing.T, _ context.Context, _ acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
			polls(t, 3) // the request is listed again meanwhile: not asked again
			return selected("approve")
		}, nil, true, "write_file", "wrote 2 bytes", false, true, protocol.RequestApproved, acp.ToolCallStatusCompleted},
		{"denied in the editor", write, func(*testing.T, context.Context, acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
			return selected("deny")
		}, nil, false, "write_file", "denied in the editor", true, false, protocol.RequestDenied, acp.ToolCallStatusCompleted},
		{"a question's choice", ask, func(t *testing.T, _ context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
			for _, o := range req.Options {
				if o.Name == "sqlite" {
					return selected(string(o.OptionId))
				}
			}
			t.Errorf("no option sqlite: %+v", req.Options)
			return cancelled
		}, nil, false, "ask", "sqlite", false, false, protocol.RequestAnswered, acp.ToolCallStatusCompleted},
		{"cancelled in the editor: pending, not asked again", write, func(*testing.T, context.Context, acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
			return cancelled
		}, func(t *testing.T, id string) {
			polls(t, 3)
			r, err := s.Client.GetRequest(context.Background(), protocol.RequestGetRequest{RequestID: id, Authority: s.Grant()})
			if err != nil || r.State != protocol.RequestPending {
				t.Errorf("after a cancelled ask the request is %+v, %v; want pending", r, err)
			}
			approve(t, id)
		}, false, "write_file", "wrote 2 bytes", false, true, protocol.RequestApproved, acp.ToolCallStatusFailed},
		{"answered elsewhere while the editor is asked", write, func(t *testing.T, ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
			id, _ := requestOf(t, req)
			approve(t, id)
			select {
			case <-ctx.Done(): // $/cancel_request
			case <-time.After(4 * acpagent.RequestPollMax):
				t.Error("the ask was not cancelled once the request was answered elsewhere")
			}
			return selected("deny") // too late: loses
		}, nil, false, "write_file", "wrote 2 bytes", false, true, protocol.RequestApproved, acp.ToolCallStatusCompleted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			dir := t.TempDir()
			ed := newAskedEditor()
			var conn *acp.ClientSideConnection
			ed.decide = func(ctx context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
				if tt.reload {
					// A load of a session open here replays it: no second ask.
					if _, err := conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: req.SessionId, Cwd: dir, McpServers: []acp.McpServer{}}); err != nil {
						t.Errorf("session/load while asked: %v", err)
					}
				}
				return tt.decide(t, ctx, req)
			}
			conn = serveTo(t, s, acpagent.DelegationTools("spawn", dir), ed)
			ns, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: dir, McpServers: []acp.McpServer{}})
			if err != nil {
				t.Fatal(err)
			}
			prompt, err := json.Marshal(tt.script)
			if err != nil {
				t.Fatal(err)
			}
			r, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock(
				`call subagent {"description":"helper","prompt":` + string(prompt) + `,"run_in_background":true}` + "\nsay started")}})
			if err != nil || r.StopReason != acp.StopReasonEndTurn {
				t.Fatalf("prompt: %+v, %v", r, err)
			}
			var asks []acp.RequestPermissionRequest
			testutil.Eventually(t, 60*time.Second, func() bool { asks, _ = ed.taken(); return len(asks) > 0 }, "the editor is asked")
			req := asks[0]
			id, child := requestOf(t, req)
			if req.SessionId != ns.SessionId {
				t.Fatalf("asked in session %s, want the root's %s", req.SessionId, ns.SessionId)
			}
			var opts []string
			for _, o := range req.Options {
				opts = append(opts, string(o.OptionId)+":"+string(o.Kind))
			}
			title := ""
			if req.ToolCall.Title != nil {
				title = *req.ToolCall.Title
			}
			switch tt.tool {
			case "write_file":
				if want := []string{"approve:allow_once", "deny:reject_once"}; !reflect.DeepEqual(opts, want) {
					t.Fatalf("options %v, want %v", opts, want)
				}
				if want := map[string]any{"path": "x.txt", "content": "hi"}; !reflect.DeepEqual(req.ToolCall.RawInput, want) {
					t.Fatalf("rawInput %#v, want %v", req.ToolCall.RawInput, want)
				}
				if !strings.Contains(title, child) || !strings.Contains(title, "write_file") {
					t.Fatalf("title %q names neither the child %s nor the tool", title, child)
				}
			case "ask":
				if want := []string{"choice-0:allow_once", "choice-1:allow_once"}; !reflect.DeepEqual(opts, want) {
					t.Fatalf("options %v, want %v", opts, want)
				}
			}

			if tt.after != nil {
				tt.after(t, id)
			}
			// The child's call ends and its turn with it.
			var evs []protocol.SessionEvent
			testutil.Eventually(t, 60*time.Second, func() bool {
				_, evs = s.Log(child)
				return len(evs) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd
			}, "the child's turn ends")
			var trail []string
			var answer protocol.RequestAnswerData
			var result protocol.ToolResultData
			var end protocol.TurnEndData
			for _, ev := range evs {
				switch ev.Type {
				case protocol.EvRequestOpen, protocol.EvToolResult:
					trail = append(trail, ev.Type)
					if ev.Type == protocol.EvToolResult && ev.Decode(&result) != nil {
						t.Fatal("tool/result")
					}
				case protocol.EvRequestAnswer:
					trail = append(trail, ev.Type)
					if err := ev.Decode(&answer); err != nil {
						t.Fatal(err)
					}
				case protocol.EvTurnEnd:
					if err := ev.Decode(&end); err != nil {
						t.Fatal(err)
					}
				}
			}
			if want := "request/open request/answer tool/result"; strings.Join(trail, " ") != want {
				t.Fatalf("the child's log: %v, want %s", trail, want)
			}
			if answer.RequestID != id || answer.State != tt.state || answer.By.Kind != protocol.AnswererUser {
				t.Fatalf("the answer %+v, want %s by the user", answer, tt.state)
			}
			if result.Name != tt.tool || result.IsError != tt.isError || !strings.Contains(protocol.PlainText(result.Content), tt.result) {
				t.Fatalf("the %s result %+v, want (error %v) %q", tt.tool, result, tt.isError, tt.result)
			}
			if end.Reason.Kind != protocol.TurnCompleted {
				t.Fatalf("the child's turn ended %+v", end.Reason)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "x.txt")); (err == nil) != tt.written || (tt.written && string(b) != "hi") {
				t.Fatalf("x.txt: %q, %v; written: want %v", b, err, tt.written)
			}
			// One ask; the tool call it stands for went pending, then to its outcome.
			var statuses map[acp.ToolCallId][]acp.ToolCallStatus
			testutil.Eventually(t, 10*time.Second, func() bool {
				asks, statuses = ed.taken()
				return len(statuses[req.ToolCall.ToolCallId]) >= 2
			}, "the editor sees the outcome")
			if len(asks) != 1 {
				t.Fatalf("the editor was asked %d times, want once", len(asks))
			}
			if got, want := statuses[req.ToolCall.ToolCallId], []acp.ToolCallStatus{acp.ToolCallStatusPending, tt.final}; !reflect.DeepEqual(got, want) {
				t.Fatalf("the request's tool call went %v, want %v", got, want)
			}
		})
	}
}

// TestEditorIsShownQuestionsItCannotAnswer (issue 33, item 4): a question
// without choices (free text) has no options an editor could offer: it is
// not asked, but shown as a pending tool call that says how to answer it
// (brood answer), and completed with the answer once it was answered
// elsewhere.
func TestEditorIsShownQuestionsItCannotAnswer(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	ed := newAskedEditor()
	ed.decide = func(context.Context, acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
		t.Error("a question without choices was asked")
		return cancelled
	}
	conn := serveTo(t, s, acpagent.DelegationTools("spawn", dir), ed)
	ns, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: dir, McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock(
		`call subagent {"description":"helper","prompt":"call ask {\"question\":\"Which branch?\"}\nsay done","run_in_background":true}` + "\nsay started")}})
	if err != nil || r.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %+v, %v", r, err)
	}
	var call acp.ToolCallId
	testutil.Eventually(t, 60*time.Second, func() bool {
		_, st := ed.taken()
		for id := range st {
			call = id
		}
		return call != ""
	}, "the editor is shown the question")
	id := strings.TrimPrefix(string(call), "request-")
	if texts := ed.textsOf(call); len(texts) != 1 || !strings.Contains(texts[0], "Which branch?") || !strings.Contains(texts[0], "brood answer "+id+" TEXT") {
		t.Fatalf("the question's tool call says %q", texts)
	}
	rec, err := s.Client.AnswerQuestion(ctx, id, s.Grant(), "main", "")
	if err != nil {
		t.Fatal(err)
	}
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 60*time.Second, func() bool {
		_, evs = s.Log(rec.SessionID)
		return len(evs) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd
	}, "the child's turn ends")
	var result protocol.ToolResultData
	for _, ev := range evs {
		if ev.Type == protocol.EvToolResult && ev.Decode(&result) != nil {
			t.Fatal("tool/result")
		}
	}
	if result.Name != "ask" || result.IsError || protocol.PlainText(result.Content) != "main" {
		t.Fatalf("the ask result %+v", result)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(ed.textsOf(call)) == 2 }, "the editor is told it was answered")
	asks, st := ed.taken()
	if texts := ed.textsOf(call); len(asks) != 0 || !reflect.DeepEqual(st[call], []acp.ToolCallStatus{acp.ToolCallStatusPending, acp.ToolCallStatusCompleted}) ||
		!strings.Contains(texts[1], "answered elsewhere: answered (by user): main") {
		t.Fatalf("asks %d, the question's tool call went %v saying %q", len(asks), st[call], texts)
	}
}

// backgroundWrite is a prompt of an ACP session that starts a background
// child whose write_file call asks for approval.
const backgroundWrite = `call subagent {"description":"helper","prompt":"call write_file {\"path\":\"x.txt\",\"content\":\"hi\"}\nsay done","run_in_background":true}` + "\nsay started"

// leftPending starts an ACP session whose background child asks, in an
// editor that cancels the ask (the request stays pending), and returns the
// session, the request, the asking child and the stop of that editor's
// connection.
func leftPending(t *testing.T, ctx context.Context, s *stack.Stack, dir string) (acp.SessionId, string, string, func()) {
	t.Helper()
	first := newAskedEditor()
	first.decide = func(context.Context, acp.RequestPermissionRequest) acp.RequestPermissionOutcome { return cancelled }
	conn, stop := serveStoppable(t, s, acpagent.DelegationTools("spawn", dir), first)
	ns, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: dir, McpServers: []acp.McpServer{}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock(backgroundWrite)}})
	if err != nil || r.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %+v, %v", r, err)
	}
	var asks []acp.RequestPermissionRequest
	testutil.Eventually(t, 60*time.Second, func() bool { asks, _ = first.taken(); return len(asks) == 1 }, "the first editor is asked")
	id, child := requestOf(t, asks[0])
	return ns.SessionId, id, child, stop
}

// childLive reports whether session child, below root, has a live agent.
func childLive(t *testing.T, ctx context.Context, s *stack.Stack, root acp.SessionId, child string) bool {
	t.Helper()
	rows, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: string(root), Descendants: true, Authority: s.Grant()})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows.Rows {
		if row.ID == child {
			return row.Activity == protocol.ActivityRunning
		}
	}
	return false
}

// TestEditorIsAskedAgainWhenItLoadsTheSession (issue 33, item 4): the
// editor leaves a background child's request pending (cancels the ask) and
// disconnects; the root closes, and its continuable child lives on, still
// parked. An editor that loads the session in a new agent process is asked
// about the request once (however often it is listed meanwhile), and its
// answer reaches the child.
func TestEditorIsAskedAgainWhenItLoadsTheSession(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	polls := listCounter(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	root, id, child, stop := leftPending(t, ctx, s, dir)
	stop()
	if !childLive(t, ctx, s, root, child) {
		t.Fatal("the child did not live on after its root closed")
	}
	second := newAskedEditor()
	second.decide = func(_ context.Context, req acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
		if got, _ := requestOf(t, req); got != id || req.SessionId != root {
			t.Errorf("asked about %s in %s, want %s in %s", got, req.SessionId, id, root)
		}
		polls(t, 3)
		return selected("approve")
	}
	conn := serveTo(t, s, acpagent.DelegationTools("spawn", dir), second)
	if _, err := conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: root, Cwd: dir, McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		_, evs := s.Log(child)
		return len(evs) > 0 && evs[len(evs)-1].Type == protocol.EvTurnEnd
	}, "the child's turn ends")
	if b, err := os.ReadFile(filepath.Join(dir, "x.txt")); err != nil || string(b) != "hi" {
		t.Fatalf("x.txt: %q, %v", b, err)
	}
	rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: id, Authority: s.Grant()})
	if err != nil || rec.State != protocol.RequestApproved || rec.Answer.By.Kind != protocol.AnswererUser {
		t.Fatalf("the request is %+v, %v; want approved by the user", rec, err)
	}
	if asks, _ := second.taken(); len(asks) != 1 {
		t.Fatalf("the second editor was asked %d times, want once", len(asks))
	}
}

// TestEditorIsNotAskedAboutADisposedChildsRequest (issue 33, item 4): a
// child disposed while its call is parked ends its turn, and its request
// with it (cancelled, docs/protocol.md §5.21 "A request ends with its
// turn"): an editor that loads the session again is not asked about it.
func TestEditorIsNotAskedAboutADisposedChildsRequest(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	polls := listCounter(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	root, id, child, stop := leftPending(t, ctx, s, dir)
	// brood dispose of a continuable child: its activation ends.
	if _, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: s.Grant(), Children: []string{child}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return !childLive(t, ctx, s, root, child) }, "the child is disposed")
	stop()

	second := newAskedEditor()
	second.decide = func(context.Context, acp.RequestPermissionRequest) acp.RequestPermissionOutcome {
		t.Error("the editor was asked about a disposed child's request")
		return cancelled
	}
	conn := serveTo(t, s, acpagent.DelegationTools("spawn", dir), second)
	if _, err := conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: root, Cwd: dir, McpServers: []acp.McpServer{}}); err != nil {
		t.Fatal(err)
	}
	polls(t, 3) // the loaded session lists its tree's requests
	if rec, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: id, Authority: s.Grant()}); err != nil || rec.State != protocol.RequestCancelled {
		t.Fatalf("the request is %+v, %v; want cancelled", rec, err)
	}
	if asks, st := second.taken(); len(asks) != 0 || len(st) != 0 {
		t.Fatalf("the second editor was asked %d times, shown %v", len(asks), st)
	}
}
