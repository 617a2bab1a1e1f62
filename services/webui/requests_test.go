package webui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// listRequests is GET /api/requests of the view at base.
func listRequests(t *testing.T, base string) protocol.RequestsListReply {
	t.Helper()
	resp, err := http.Get(base + "/api/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l protocol.RequestsListReply
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /api/requests: %d %s", resp.StatusCode, body)
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l
}

// pendingOf waits until the view at base lists a pending request of
// session id, and returns it.
func pendingOf(t *testing.T, base, id string) protocol.RequestRecord {
	t.Helper()
	var got protocol.RequestRecord
	testutil.Eventually(t, 30*time.Second, func() bool {
		for _, r := range listRequests(t, base).Requests {
			if r.SessionID == id && r.State == protocol.RequestPending {
				got = r
				return true
			}
		}
		return false
	}, "a pending request of %s listed by the web view", id)
	return got
}

// answerAt posts an answer to request id at the view at base: its status,
// the record answered (on 200) and the error's code (else).
func answerAt(t *testing.T, base, id string, body AnswerBody) (int, protocol.RequestRecord, protocol.Code) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, base+"/api/requests/"+id+"/answer", bytes.NewReader(data))
	req.Header.Set(ActionHeader, "1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		var rec protocol.RequestRecord
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatalf("answer reply %s: %v", raw, err)
		}
		return resp.StatusCode, rec, ""
	}
	var pe protocol.Error
	_ = json.Unmarshal(raw, &pe)
	return resp.StatusCode, protocol.RequestRecord{}, pe.Code
}

// toolResult is the result of the child's call of tool, from its log.
func toolResult(s *stack.Stack, child, tool string) (protocol.ToolResultData, bool) {
	_, evs := s.Log(child)
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == tool {
			return d, true
		}
	}
	return protocol.ToolResultData{}, false
}

// TestRequestsAreListedAndAnsweredThroughTheView (issue 33, item 4): the
// view lists the pending requests its grant may answer and answers them
// through requests.answer: an approval approved (the call runs) or denied
// with a reason (the call gets it), a question answered with one of its
// choices; what the coordinator refuses comes back as its code (a wrong
// answer INVALID_ARGUMENT, the request still pending; a second answer
// ALREADY_ANSWERED), and an answer without the action header or with a
// body that is not one is refused before it reaches the coordinator.
func TestRequestsAreListedAndAnsweredThroughTheView(t *testing.T) {
	s, srv := stackServer(t, Config{})
	base := "http://" + srv.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(dir, prompt string) *client.Run {
		t.Helper()
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: s.Root(dir).Ref(), Prompt: protocol.Text(prompt)})
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	const write = `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"

	t.Run("approve", func(t *testing.T) {
		dir := t.TempDir()
		run := start(dir, write)
		req := pendingOf(t, base, run.ChildID)
		if req.Kind != protocol.RequestApproval || req.Tool != "write_file" || req.Arguments != `{"path":"x.txt","content":"hi"}` {
			t.Fatalf("listed %+v, want the approval of write_file", req)
		}
		status, rec, code := answerAt(t, base, req.ID, AnswerBody{Answer: protocol.AnswerApprove})
		if status != http.StatusOK || rec.State != protocol.RequestApproved || rec.Answer == nil || rec.Answer.By.Kind != protocol.AnswererUser {
			t.Fatalf("approve: %d %+v %s; want approved by the user", status, rec, code)
		}
		if status, _, code := answerAt(t, base, req.ID, AnswerBody{Answer: protocol.AnswerDeny}); status != http.StatusConflict || code != protocol.CodeAlreadyAnswered {
			t.Fatalf("a second answer: %d %s; want 409 ALREADY_ANSWERED", status, code)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "x.txt")); err != nil || string(b) != "hi" {
			t.Fatalf("x.txt: %q, %v; want the approved write", b, err)
		}
		for _, r := range listRequests(t, base).Requests {
			if r.ID == req.ID {
				t.Fatalf("still listed after its answer: %+v", r)
			}
		}
	})

	t.Run("deny with a reason", func(t *testing.T) {
		dir := t.TempDir()
		run := start(dir, write)
		req := pendingOf(t, base, run.ChildID)
		status, rec, code := answerAt(t, base, req.ID, AnswerBody{Answer: protocol.AnswerDeny, Reason: "not in this repo"})
		if status != http.StatusOK || rec.State != protocol.RequestDenied || rec.Answer.Reason != "not in this repo" {
			t.Fatalf("deny: %d %+v %s", status, rec, code)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if d, ok := toolResult(s, run.ChildID, "write_file"); !ok || !d.IsError || !strings.Contains(protocol.PlainText(d.Content), "not in this repo") {
			t.Fatalf("write_file result %+v, want the denial with its reason", d)
		}
		if _, err := os.Stat(filepath.Join(dir, "x.txt")); err == nil {
			t.Fatal("a denied write_file wrote")
		}
	})

	t.Run("a question", func(t *testing.T) {
		run := start(t.TempDir(), `call ask {"question":"Which database?","choices":["postgres","sqlite"]}`+"\nsay done")
		req := pendingOf(t, base, run.ChildID)
		if req.Kind != protocol.RequestQuestion || req.Question != "Which database?" || len(req.Choices) != 2 {
			t.Fatalf("listed %+v, want the question", req)
		}
		for _, wrong := range []AnswerBody{{Answer: protocol.AnswerAnswer, Text: "mysql"}, {Answer: protocol.AnswerApprove}} {
			if status, _, code := answerAt(t, base, req.ID, wrong); status != http.StatusBadRequest || code != protocol.CodeInvalidArgument {
				t.Fatalf("answer %+v: %d %s; want 400 INVALID_ARGUMENT", wrong, status, code)
			}
		}
		if again := pendingOf(t, base, run.ChildID); again.ID != req.ID {
			t.Fatalf("after the wrong answers %+v is listed, want %s still pending", again, req.ID)
		}
		status, rec, code := answerAt(t, base, req.ID, AnswerBody{Answer: protocol.AnswerAnswer, Text: "sqlite"})
		if status != http.StatusOK || rec.State != protocol.RequestAnswered || rec.Answer.Text != "sqlite" {
			t.Fatalf("answer: %d %+v %s", status, rec, code)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("run: %+v, %v", res, err)
		}
		if d, ok := toolResult(s, run.ChildID, "ask"); !ok || d.IsError || protocol.PlainText(d.Content) != "sqlite" {
			t.Fatalf("ask result %+v, want sqlite", d)
		}
	})

	t.Run("refused before the coordinator", func(t *testing.T) {
		resp, err := http.Post(base+"/api/requests/r0/answer", "application/json", strings.NewReader(`{"answer":"approve"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("an answer without %s: %d, want 403", ActionHeader, resp.StatusCode)
		}
		req, _ := http.NewRequest(http.MethodPost, base+"/api/requests/r0/answer", strings.NewReader(`{"verdict":"yes"}`))
		req.Header.Set(ActionHeader, "1")
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("a body that is no answer: %d, want 400", resp.StatusCode)
		}
	})
}

// userView is a web view whose server connects as NATS user (its grant is
// that user's: the trees of the roots it opened), and that user's client.
func userView(t *testing.T, s *stack.Stack, user string) (*client.Client, string) {
	t.Helper()
	nc, err := nats.Connect(s.URL, nats.CustomInboxPrefix(protocol.UserInboxPrefix(user)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cl, err := client.New(nc, client.Options{User: user})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	srv, err := New(Config{Client: cl, Listen: "127.0.0.1:0", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, srv)
	return cl, "http://" + srv.Addr()
}

// TestRequestsOfAnotherUsersTreeAreNotTheViews: a view reads and answers
// with its user's grant, as for sessions: another user's view neither
// lists a request of alice's tree nor answers it (UNAUTHORIZED, and the
// request stays pending); alice's view answers it.
func TestRequestsOfAnotherUsersTreeAreNotTheViews(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	alice, aliceView := userView(t, s, "alice")
	_, bobView := userView(t, s, "bob")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	root, err := alice.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = root.Close(context.Background()) })
	run, err := alice.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(),
		Prompt: protocol.Text(`call write_file {"path":"x.txt","content":"hi"}` + "\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	req := pendingOf(t, aliceView, run.ChildID)
	if l := listRequests(t, bobView); len(l.Requests) != 0 {
		t.Fatalf("bob's view lists %+v, want nothing of alice's tree", l.Requests)
	}
	if status, _, code := answerAt(t, bobView, req.ID, AnswerBody{Answer: protocol.AnswerApprove}); status != http.StatusForbidden || code != protocol.CodeUnauthorized {
		t.Fatalf("bob's approval: %d %s; want 403 UNAUTHORIZED", status, code)
	}
	if again := pendingOf(t, aliceView, run.ChildID); again.ID != req.ID {
		t.Fatalf("after bob's answer alice's view lists %+v, want %s pending", again, req.ID)
	}
	if status, rec, code := answerAt(t, aliceView, req.ID, AnswerBody{Answer: protocol.AnswerApprove}); status != http.StatusOK || rec.Answer.By.User != "alice" {
		t.Fatalf("alice's approval: %d %+v %s; want approved by alice", status, rec, code)
	}
	if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.txt")); err != nil {
		t.Fatalf("the approved write: %v", err)
	}
}

// TestBrowserApprovesAPendingRequest is issue 33's browser acceptance: a
// spawn child's write_file (approval by default) parks; the page shows the
// pending request (the child's label, the tool and its arguments, the
// deadline) and marks the child's node in the tree; clicking Approve
// resumes the child: the file is written and its turn completes, and the
// request leaves the panel and the mark the tree.
func TestBrowserApprovesAPendingRequest(t *testing.T) {
	s, srv := stackServer(t, Config{})
	b := newBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	b.do("open the page", chromedp.Navigate(srv.URL()))
	b.waitFor("the tree is live", `document.getElementById("status")?.textContent === "live"`)
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: s.Root(dir).Ref(), Label: "scribe",
		Prompt: protocol.Text(`call write_file {"path":"notes.txt","content":"approved on the page"}` + "\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	card := fmt.Sprintf(`#requests .request[data-session=%q]`, run.ChildID)
	b.waitFor("the pending request in the panel", sel("%s", card))
	b.waitFor("the panel shown", `document.getElementById("requests").hidden === false`)
	b.waitFor("the child's label on the card", sel("%s", card+" a.request-session")+`?.textContent === "scribe"`)
	if tool := b.eval(sel("%s", card+" .rtool") + `.textContent`); tool != "write_file" {
		t.Fatalf("the card names the tool %q", tool)
	}
	if args := b.eval(sel("%s", card+" pre.args") + `.textContent`); !strings.Contains(args, `"path": "notes.txt"`) {
		t.Fatalf("the card shows the arguments %q", args)
	}
	if h := b.eval(sel("%s", card+" .rhandler") + `.textContent`); h != "waits on you" {
		t.Fatalf("the card says whom it waits on: %q, want the user's (no agent was told)", h)
	}
	if dl := b.eval(sel("%s", card+" .deadline") + `.textContent`); !strings.HasPrefix(dl, "deadline ") {
		t.Fatalf("the card shows the deadline %q", dl)
	}
	b.waitFor("the child's node marked", sel(`.row[data-id=%q][data-requests="1"] .badge.request-pending`, run.ChildID))
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err == nil {
		t.Fatal("the file was written before the approval")
	}

	b.do("approve", chromedp.Click(chromedp.CSS(card+" button.approve")))
	b.waitFor("the page reports the approval", sel("%s", card+` .rresult[data-result="ok"]`)+`?.textContent === "approved"`)
	res, err := run.Result(ctx)
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("the approved child ended %+v, %v; want completed", res, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "notes.txt")); err != nil || string(got) != "approved on the page" {
		t.Fatalf("notes.txt: %q, %v", got, err)
	}
	b.waitFor("the mark gone from the tree", sel(`.row[data-id=%q]`, run.ChildID)+` && !`+sel(`.row[data-id=%q][data-requests]`, run.ChildID))
	b.waitFor("the request gone from the panel", `!`+sel("%s", card))

	// The child's conversation shows the request and its answer in order.
	b.do("open the child", chromedp.Navigate(srv.URL()+"#/s/"+run.ChildID))
	b.waitFor("the request in the log", sel(`#log [data-type="request/open"]`)+`?.textContent?.includes("asks for approval of write_file")`)
	b.waitFor("its answer in the log", sel(`#log [data-type="request/answer"]`)+`?.textContent?.includes("approved (by the user)")`)
	b.waitFor("the write's result", sel(`#log details.tool[data-tool="write_file"][data-result="ok"]`))
	b.waitFor("the turn completed", sel(`#log [data-type="turn/end"]`)+`?.textContent?.includes("completed")`)
}

// TestBrowserShowsARefusedAnswer: an answer the coordinator refuses shows
// its code on the card, and the request stays there to answer again: JSON
// a question's answerSchema refuses is INVALID_ARGUMENT; the right answer
// typed next resumes the child with it.
func TestBrowserShowsARefusedAnswer(t *testing.T) {
	s, srv := stackServer(t, Config{})
	b := newBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b.do("open the page", chromedp.Navigate(srv.URL()))
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: s.Root().Ref(), Label: "asker",
		Prompt: protocol.Text(`call ask {"question":"Which port?","answerSchema":{"type":"integer"}}` + "\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	card := fmt.Sprintf(`#requests .request[data-session=%q]`, run.ChildID)
	b.waitFor("the question in the panel", sel("%s", card+" .question")+`?.textContent === "Which port?"`)
	b.do("answer with a string", chromedp.SendKeys(card+" textarea.answer-json", `"eighty"`), chromedp.Click(chromedp.CSS(card+" button.answer")))
	b.waitFor("the refusal's code", sel("%s", card+` .rresult[data-code="INVALID_ARGUMENT"]`)+`?.textContent?.startsWith("INVALID_ARGUMENT: ")`)
	b.waitFor("the button usable again", sel("%s", card+" button.answer")+`.disabled === false`)
	b.eval(sel("%s", card+" textarea.answer-json") + `.value = "8080"; "set"`)
	b.do("answer with an integer", chromedp.Click(chromedp.CSS(card+" button.answer")))
	b.waitFor("the answer on the card", sel("%s", card+` .rresult[data-result="ok"]`)+`?.textContent === "answered: 8080"`)
	if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if d, ok := toolResult(s, run.ChildID, "ask"); !ok || protocol.PlainText(d.Content) != "8080" {
		t.Fatalf("ask result %+v, want 8080", d)
	}
}

// TestBrowserRaisesAPausedChild (issue 32, item 3: the web view shows a
// continuable child paused at its budget's cap): the child's node says
// paused, its card says which limit is spent; a raise on the page
// (modelRequests +1) continues the same turn, which completes, and the
// mark leaves the tree.
func TestBrowserRaisesAPausedChild(t *testing.T) {
	s, srv := stackServer(t, Config{})
	b := newBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b.do("open the page", chromedp.Navigate(srv.URL()))
	b.waitFor("the tree is live", `document.getElementById("status")?.textContent === "live"`)
	st, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: s.Root().Ref(), Label: "capped",
		Prompt: protocol.Text("call read_file {\"path\":\"nothing.txt\"}\nsay done"), Options: protocol.ContinuableOptions{Budget: &protocol.Budget{ModelRequests: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	card := fmt.Sprintf(`#requests .request[data-session=%q][data-kind="budget"]`, st.ChildID)
	b.waitFor("the paused child's card", sel("%s", card))
	if what := b.eval(sel("%s", card+" .question") + `.textContent`); !strings.Contains(what, "modelRequests limit of 1") {
		t.Fatalf("the card says %q; want the modelRequests limit spent", what)
	}
	b.waitFor("the child's node marked paused", sel(`.row[data-id=%q][data-paused="1"] .badge.state-paused`, st.ChildID))

	b.eval(sel("%s", card+" select.raise-limit") + `.value = "modelRequests"; "set"`)
	b.do("raise", chromedp.SendKeys(card+" input.raise-amount", "1"), chromedp.Click(chromedp.CSS(card+" button.raise")))
	b.waitFor("the page reports the raise", sel("%s", card+` .rresult[data-result="ok"]`)+`?.textContent === "raised: modelRequests +1; answered the budget pause of 1 turn: it goes on within about 2 s (until then it shows paused)"`)
	var end protocol.TurnEndData
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs := s.Log(st.ChildID)
		for _, ev := range evs {
			if ev.Type == protocol.EvTurnEnd && ev.Decode(&end) == nil {
				return true
			}
		}
		return false
	}, "the raised turn ends")
	if end.Turn != 1 || end.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("turn end %+v; want turn 1 completed", end)
	}
	b.waitFor("the mark gone from the tree", sel(`.row[data-id=%q]`, st.ChildID)+` && !`+sel(`.row[data-id=%q][data-paused]`, st.ChildID))
}
