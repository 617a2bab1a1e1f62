package coordinator_test

import (
	"context"
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
	"github.com/brood-dev/brood/services/coordinator"
)

// pendingRequest waits for the one pending request the grant may answer.
func pendingRequest(t *testing.T, s *stack.Stack) protocol.RequestRecord {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant()})
		cancel()
		if err == nil && len(l.Requests) == 1 {
			return l.Requests[0]
		}
		if err != nil || len(l.Requests) > 1 || time.Now().After(deadline) {
			t.Fatalf("pending requests: %+v, %v; want one", l, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requestTrail returns the types of the child's write_file call, its
// request and its result, in log order, and the result.
func requestTrail(evs []protocol.SessionEvent) ([]string, protocol.ToolResultData) {
	var trail []string
	var res protocol.ToolResultData
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvToolCall, protocol.EvRequestOpen, protocol.EvRequestAnswer:
			trail = append(trail, ev.Type)
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) == nil && d.Name == "write_file" {
				trail, res = append(trail, ev.Type), d
			}
		}
	}
	return trail, res
}

// TestRequestsAreAnsweredOnce (issue 33, items 1 and 5): a child's
// write_file parks on a request; a stranger's answer is UNAUTHORIZED; the
// first answer (the user's, or the parent's as an ancestor) decides and the
// call runs or gets the denial; a second answer is ALREADY_ANSWERED; the log
// holds call, request, answer, result in that order.
func TestRequestsAreAnsweredOnce(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	tests := []struct {
		name     string
		byParent bool
		answer   string
		reason   string
		result   string // the write_file result contains
		written  bool
		by       string
	}{
		{"the user approves", false, protocol.AnswerApprove, "", "wrote 2 bytes", true, protocol.AnswererUser},
		{"the parent approves", true, protocol.AnswerApprove, "", "wrote 2 bytes", true, protocol.AnswererAgent},
		{"the user denies", false, protocol.AnswerDeny, "not in this repo", "denied by the user: not in this repo", false, protocol.AnswererUser},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			dir := t.TempDir()
			root, stranger := s.Root(dir), s.Root()
			run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(),
				Prompt: protocol.Text(`call write_file {"path":"x.txt","content":"hi"}` + "\nsay done")})
			if err != nil {
				t.Fatal(err)
			}
			req := pendingRequest(t, s)
			if req.SessionID != run.ChildID || req.Tool != "write_file" || req.Arguments != `{"path":"x.txt","content":"hi"}` || req.State != protocol.RequestPending {
				t.Fatalf("request %+v, want write_file of %s pending", req, run.ChildID)
			}
			if _, err := os.Stat(filepath.Join(dir, "x.txt")); err == nil {
				t.Fatal("the tool ran before its approval")
			}
			answer := func(auth protocol.Authority) (protocol.RequestRecord, error) {
				return s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: auth, Answer: tt.answer, Reason: tt.reason})
			}
			if _, err := answer(stranger.Authority()); protocol.CodeOf(err) != protocol.CodeUnauthorized {
				t.Fatalf("a stranger's answer = %v, want UNAUTHORIZED", err)
			}
			auth := s.Grant()
			if tt.byParent {
				auth = root.Authority()
			}
			got, err := answer(auth)
			if err != nil || got.Answer == nil || got.Answer.By.Kind != tt.by {
				t.Fatalf("answer = %+v, %v; want answered by %s", got, err, tt.by)
			}
			if _, err := answer(s.Grant()); protocol.CodeOf(err) != protocol.CodeAlreadyAnswered {
				t.Fatalf("a second answer = %v, want ALREADY_ANSWERED", err)
			}
			res, err := run.Result(ctx)
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("run: %+v, %v", res, err)
			}
			_, evs := s.Log(run.ChildID)
			trail, result := requestTrail(evs)
			want := []string{protocol.EvToolCall, protocol.EvRequestOpen, protocol.EvRequestAnswer, protocol.EvToolResult}
			if strings.Join(trail, " ") != strings.Join(want, " ") {
				t.Fatalf("log trail %v, want %v", trail, want)
			}
			if result.IsError == tt.written || !strings.Contains(protocol.PlainText(result.Content), tt.result) {
				t.Fatalf("write_file result (error %v) %q, want %q", result.IsError, protocol.PlainText(result.Content), tt.result)
			}
			if _, err := os.Stat(filepath.Join(dir, "x.txt")); (err == nil) != tt.written {
				t.Fatalf("x.txt written: %v, want %v", err == nil, tt.written)
			}
			if l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant()}); err != nil || len(l.Requests) != 0 {
				t.Fatalf("pending requests after the answer: %+v, %v", l, err)
			}
		})
	}
}

// TestRequestTimesOutAsADenial (issue 33, item 5): a request no one
// answers ends timed-out at its deadline: the call gets a denial that says
// it timed out, the log records the timeout (by: timeout, never a user),
// and a late answer is ALREADY_ANSWERED.
func TestRequestTimesOutAsADenial(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.RequestTimeout = time.Second })
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, res, err := s.Run(s.Root().Ref(), "spawn", `call run_command {"command":"echo hi"}`+"\nsay done", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %+v, %v", res, err)
	}
	_, evs := s.Log(run.ChildID)
	var ans protocol.RequestAnswerData
	var result protocol.ToolResultData
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvRequestAnswer:
			if err := ev.Decode(&ans); err != nil {
				t.Fatal(err)
			}
		case protocol.EvToolResult:
			if err := ev.Decode(&result); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ans.State != protocol.RequestTimedOut || ans.By.Kind != protocol.AnswererTimeout {
		t.Fatalf("request/answer %+v, want timed-out by the timeout", ans)
	}
	if !result.IsError || !strings.Contains(protocol.PlainText(result.Content), "timed out") || strings.Contains(protocol.PlainText(result.Content), "hi\n") {
		t.Fatalf("run_command result (error %v) %q, want a timeout denial", result.IsError, protocol.PlainText(result.Content))
	}
	_, err = s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: ans.RequestID, Authority: s.Grant(), Answer: protocol.AnswerApprove})
	if protocol.CodeOf(err) != protocol.CodeAlreadyAnswered || !strings.Contains(err.Error(), protocol.RequestTimedOut) {
		t.Fatalf("a late answer = %v, want ALREADY_ANSWERED naming timed-out", err)
	}
}

// TestEqualAnswersAtOnceAreOneAnswer (issue 33, item 5): the same answer
// given many times at once, by one user (equal verbs, equal answerers,
// often in one millisecond), is taken once; every other is
// ALREADY_ANSWERED. (Equal records once read as a retry of the first's
// write, and every such answer was taken.)
func TestEqualAnswersAtOnceAreOneAnswer(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: s.Root(t.TempDir()).Ref(),
		Prompt: protocol.Text(`call write_file {"path":"x.txt","content":"hi"}` + "\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	req := pendingRequest(t, s)
	const n = 8
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			_, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove})
			errs <- err
		}()
	}
	close(start)
	taken := 0
	for range n {
		switch err := <-errs; {
		case err == nil:
			taken++
		case protocol.CodeOf(err) != protocol.CodeAlreadyAnswered:
			t.Fatalf("an answer: %v", err)
		}
	}
	if taken != 1 {
		t.Fatalf("%d of %d equal answers taken, want 1", taken, n)
	}
	if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %+v, %v", res, err)
	}
}

// TestRequestsListFindsThePendingAmongADaysRecords: requests.list reads the
// pending requests from their index, not from the first 256 records the
// bucket holds, so a request that opens after more than RequestsListMax
// answered ones of the day is still listed (it was not, when the listing
// read the oldest 256 records); an index key whose record is gone or no
// longer pending is removed by the listing that finds it.
func TestRequestsListFindsThePendingAmongADaysRecords(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	now := time.Now().UnixMilli()
	const stale = 5
	for i := range protocol.RequestsListMax + 10 + stale {
		rec := protocol.RequestRecord{Version: 1, ID: fmt.Sprintf("r%024x", i), SessionID: fmt.Sprintf("S%d", i), Kind: protocol.RequestApproval,
			CallID: "c", Tool: "write_file", Arguments: "{}", State: protocol.RequestPending, CreatedAt: now, Deadline: now + 60_000}
		rev, err := s.Store.CreateRequest(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		rec.State, rec.Answer = protocol.RequestApproved, &protocol.RequestAnswer{State: protocol.RequestApproved, By: protocol.Answerer{Kind: protocol.AnswererUser}, At: now}
		if i < protocol.RequestsListMax+10 { // answered; the last few an index key a crash left behind, of records gone
			_, err = s.Store.AnswerRequest(ctx, rec, rev)
		} else {
			err = store.Delete(ctx, s.Store.Agents, store.RequestKey(rec.ID), 0)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// The answered ones leave the index a second after their answer.
	pendingIndex := func(want int) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() bool {
			ids, _, err := s.Store.PendingRequestIDs(ctx, 1000)
			return err == nil && len(ids) == want
		}, "%d keys in the pending index", want)
	}
	pendingIndex(stale)
	root := s.Root(t.TempDir())
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(),
		Prompt: protocol.Text(`call write_file {"path":"x.txt","content":"hi"}` + "\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	if req := pendingRequest(t, s); req.SessionID != run.ChildID {
		t.Fatalf("listed %+v, want the request of %s", req, run.ChildID)
	}
	pendingIndex(1) // the stale keys went with the first listing
	req := pendingRequest(t, s)
	if _, err := s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove}); err != nil {
		t.Fatal(err)
	}
	if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %+v, %v", res, err)
	}
	pendingIndex(0)
	if l, err := s.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.Grant(), All: true}); err != nil || !l.More {
		t.Fatalf("all requests: %d, more %v, %v; want more than one page", len(l.Requests), l.More, err)
	}
}
