package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/fakeopenai"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestContinuableStateShowsAModelRetry is issue 32, item 3: a continuable
// child whose model answers 429 pauses its turn; continuable.state shows it
// running with modelRetry (the status, the next attempt) while it waits,
// and the same turn completes once the model answers, with its log naming
// the retry (model/retry).
func TestContinuableStateShowsAModelRetry(t *testing.T) {
	srv := fakeopenai.New(t, fakeopenai.Config{},
		fakeopenai.Reply{Status: 429, Body: `{"error":{"message":"Rate limit reached"}}`, Header: map[string]string{"Retry-After": "3"}},
		fakeopenai.Say("done"))
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Models = func() (model.Model, error) {
			return model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL, Model: "deepseek-chat", APIKey: fakeopenai.Key, HTTPClient: srv.HTTPClient()})
		}
	})
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "limited", Prompt: protocol.Text("hello")})
	if err != nil {
		t.Fatal(err)
	}
	ref := protocol.ChildRef{ChildID: c.ChildID, Authority: root.Authority()}
	var st protocol.StateReply
	testutil.Eventually(t, 20*time.Second, func() bool {
		st, err = s.Client.State(ctx, ref)
		return err == nil && st.ModelRetry != nil
	}, "continuable.state shows the model retry")
	if r := st.ModelRetry; st.State != protocol.StateRunning || r.Status != 429 || r.Attempt != 1 || r.RetryAfterMs != 3000 ||
		r.WaitMs != 3000 || r.Turn != 1 || r.Step != 1 || !strings.Contains(r.Diagnostic, "Rate limit reached") {
		t.Fatalf("state %+v modelRetry %+v", st, r)
	}
	var got protocol.SessionResultReply
	testutil.Eventually(t, 30*time.Second, func() bool {
		got, err = s.Client.SessionResult(ctx, protocol.SessionResultRequest{SessionID: c.ChildID, Authority: root.Authority()})
		return err == nil && got.Finished
	}, "the paused turn resumes and ends")
	if got.Turn != 1 || got.StopReason != protocol.StopCompleted || protocol.PlainText(got.Output) != "done" {
		t.Fatalf("sessions.result %+v; want turn 1 completed with done", got)
	}
	if st, err = s.Client.State(ctx, ref); err != nil || st.ModelRetry != nil {
		t.Fatalf("state %+v, %v after the turn; want no modelRetry", st, err)
	}
	_, evs := s.Log(c.ChildID)
	retries := 0
	for _, ev := range evs {
		if ev.Type == protocol.EvModelRetry {
			retries++
		}
	}
	if retries != 1 || len(srv.Requests()) != 2 {
		t.Fatalf("%d model/retry events, %d model requests; want 1 and 2", retries, len(srv.Requests()))
	}
}

// TestOneShotRunEndsAtItsTurnLimitWhileRetrying is issue 32, item 3's
// deadline: a one-shot run whose model answers 429 for ever (Retry-After
// past the deadline) ends at its start's turnTimeoutMs with the time
// limit's reason, LIMIT_EXCEEDED, the diagnostic naming the last model
// error, within a bound of the limit.
func TestOneShotRunEndsAtItsTurnLimitWhileRetrying(t *testing.T) {
	const limitMs = 1500
	srv := fakeopenai.New(t, fakeopenai.Config{},
		fakeopenai.Reply{Status: 429, Body: `{"error":{"message":"Rate limit reached"}}`, Header: map[string]string{"Retry-After": "30"}, Repeat: true})
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Models = func() (model.Model, error) {
			return model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL, Model: "deepseek-chat", APIKey: fakeopenai.Key, HTTPClient: srv.HTTPClient()})
		}
	})
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("hello"),
		Options: protocol.StartOptions{Limits: &protocol.TurnLimits{TurnTimeoutMs: limitMs}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeLimitExceeded ||
		!strings.Contains(res.Diagnostic, "the turn exceeded its 1.5s limit") || !strings.Contains(res.Diagnostic, "HTTP 429 from") {
		t.Fatalf("result %s %s %q; want error LIMIT_EXCEEDED naming the turn limit and the last model error", res.StopReason, res.ErrorCode, res.Diagnostic)
	}
	if limit := limitMs * time.Millisecond; elapsed < limit || elapsed > limit+10*time.Second {
		t.Errorf("the run settled %v after its start, want within [%v, %v]", elapsed, limit, limit+10*time.Second)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("%d model requests, want 1 (Retry-After 30 s honoured)", n)
	}
}
