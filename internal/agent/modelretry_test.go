package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/fakeopenai"
	"github.com/brood-dev/brood/pkg/protocol"
)

// retryAgent is an agent on the openai adapter against srv, with a fast
// model retry backoff (10 ms, doubling, at most 40 ms) and turnTimeout.
func retryAgent(t *testing.T, srv *fakeopenai.Server, turnTimeout time.Duration) (*Agent, *memLog) {
	t.Helper()
	reg, err := NewRegistry(ListDirTool(AnyWorkspace))
	if err != nil {
		t.Fatal(err)
	}
	log := &memLog{}
	a, err := New(Config{
		Header: protocol.SessionHeader{ID: "S1", Cwd: t.TempDir()}, Log: log, Model: strictModel(t, srv), Tools: reg,
		Limits: Limits{TurnTimeout: turnTimeout, ModelRetryBackoff: 10 * time.Millisecond, ModelRetryBackoffMax: 40 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, log
}

// modelRetries returns the session's model/retry events.
func modelRetries(t *testing.T, evs []protocol.SessionEvent) []protocol.ModelRetryData {
	t.Helper()
	var out []protocol.ModelRetryData
	for _, ev := range evs {
		if ev.Type != protocol.EvModelRetry {
			continue
		}
		var d protocol.ModelRetryData
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

const rateLimitBody = `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`

// TestModelRetryPausesAndResumes is issue 32, item 3: a temporary model
// failure pauses the turn, logs a model/retry per failed attempt, and the
// turn completes once the model answers; a permanent one ends the turn
// error MODEL_ERROR at once.
func TestModelRetryPausesAndResumes(t *testing.T) {
	rateLimited := fakeopenai.Status(429, rateLimitBody)
	retryAfter1 := fakeopenai.Reply{Status: 429, Body: rateLimitBody, Header: map[string]string{"Retry-After": "1"}}
	tests := []struct {
		name     string
		replies  []fakeopenai.Reply
		wantKind string
		wantCode protocol.Code
		wantErr  string // a part of the turn's diagnostic
		// want are the model/retry events: status, waitMs, retryAfterMs
		want [][3]int64
		// minElapsed is the least the turn took (Retry-After honoured)
		minElapsed time.Duration
	}{
		{name: "429 twice, no Retry-After, then 200", replies: []fakeopenai.Reply{rateLimited, rateLimited, fakeopenai.Say("done")},
			wantKind: protocol.TurnCompleted, want: [][3]int64{{429, 10, 0}, {429, 20, 0}}},
		{name: "429 twice with Retry-After 1 s, then 200", replies: []fakeopenai.Reply{retryAfter1, retryAfter1, fakeopenai.Say("done")},
			wantKind: protocol.TurnCompleted, want: [][3]int64{{429, 1000, 1000}, {429, 1000, 1000}}, minElapsed: 2 * time.Second},
		{name: "503 then 200", replies: []fakeopenai.Reply{fakeopenai.Status(503, "upstream connect error"), fakeopenai.Say("done")},
			wantKind: protocol.TurnCompleted, want: [][3]int64{{503, 10, 0}}},
		{name: "500 three times then 200: the backoff doubles to its cap", replies: []fakeopenai.Reply{
			fakeopenai.Status(500, ""), fakeopenai.Status(500, ""), fakeopenai.Status(500, ""), fakeopenai.Status(500, ""), fakeopenai.Say("done")},
			wantKind: protocol.TurnCompleted, want: [][3]int64{{500, 10, 0}, {500, 20, 0}, {500, 40, 0}, {500, 40, 0}}},
		{name: "connection reset then 200", replies: []fakeopenai.Reply{{Reset: true}, fakeopenai.Say("done")},
			wantKind: protocol.TurnCompleted, want: [][3]int64{{0, 10, 0}}},
		{name: "400 ends the turn at once", replies: []fakeopenai.Reply{fakeopenai.Status(400, `{"error":{"message":"bad request"}}`), fakeopenai.Say("never")},
			wantKind: protocol.TurnError, wantCode: protocol.CodeModelError, wantErr: "HTTP 400 from"},
		{name: "401 ends the turn at once", replies: []fakeopenai.Reply{fakeopenai.Status(401, `{"error":{"message":"invalid api key"}}`), fakeopenai.Say("never")},
			wantKind: protocol.TurnError, wantCode: protocol.CodeModelError, wantErr: "HTTP 401 from"},
		{name: "429 then 404 ends the turn at the 404", replies: []fakeopenai.Reply{rateLimited, fakeopenai.Status(404, "no such model"), fakeopenai.Say("never")},
			wantKind: protocol.TurnError, wantCode: protocol.CodeModelError, wantErr: "HTTP 404 from", want: [][3]int64{{429, 10, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := fakeopenai.New(t, fakeopenai.Config{}, tt.replies...)
			a, log := retryAgent(t, srv, time.Minute)
			start := time.Now()
			out := a.RunTurn(context.Background(), userInput("hello"))
			elapsed := time.Since(start)
			if out.Reason.Kind != tt.wantKind || out.Reason.Code != tt.wantCode || !strings.Contains(out.Reason.Error, tt.wantErr) || out.Err != nil {
				t.Fatalf("outcome %+v, want %s %s %q", out, tt.wantKind, tt.wantCode, tt.wantErr)
			}
			if elapsed < tt.minElapsed {
				t.Errorf("the turn took %v, want at least %v (Retry-After honoured)", elapsed, tt.minElapsed)
			}
			evs := a.Events()
			got := modelRetries(t, evs)
			if len(got) != len(tt.want) {
				t.Fatalf("%d model/retry events %+v, want %d", len(got), got, len(tt.want))
			}
			for i, d := range got {
				w := tt.want[i]
				if d.Turn != 1 || d.Step != 1 || d.Attempt != int64(i+1) || d.Status != w[0] || !waitOK(d.WaitMs, w[1], w[2]) || d.RetryAfterMs != w[2] ||
					d.Diagnostic == "" || d.NextAt < evs[0].Time {
					t.Errorf("model/retry %d = %+v, want attempt %d status %d waitMs %d (less up to half its jitter) retryAfterMs %d", i, d, i+1, w[0], w[1], w[2])
				}
			}
			if n := len(srv.Requests()); n != len(tt.want)+1 {
				t.Errorf("%d model requests, want %d", n, len(tt.want)+1)
			}
			if r := srv.Rejections(); len(r) > 0 && tt.wantCode == "" {
				t.Errorf("the server refused requests: %q", r)
			}
			if err := sessionlog.ValidateReplay(evs, false); err != nil {
				t.Fatalf("the log does not replay: %v", err)
			}
			// Each retry is its own record, before the step's step/start.
			records := log.types()
			for i, r := range records[1 : 1+len(tt.want)] {
				if len(r) != 1 || r[0] != protocol.EvModelRetry {
					t.Fatalf("record %d = %v, want [model/retry]; records %v", i+1, r, records)
				}
			}
			if next := records[1+len(tt.want)]; next[0] != protocol.EvStepStart {
				t.Fatalf("the record after the retries starts with %s; records %v", next[0], records)
			}
			if tt.wantKind == protocol.TurnCompleted {
				if r := sessionlog.OneShotOutcome(evs, false, false); r.StopReason != protocol.StopCompleted || protocol.PlainText(r.Output) != "done" {
					t.Fatalf("result %+v", r)
				}
			}
			if a.ModelRetry() != nil {
				t.Errorf("ModelRetry %+v after the turn ended", a.ModelRetry())
			}
		})
	}
}

// TestModelRetryEndsAtTheTurnDeadline: a rate limit that never clears ends
// the turn with the turn time limit's reason (LIMIT_EXCEEDED) within a
// bound of the limit, its diagnostic naming the last model error, whether
// the deadline passes during a short pause or a long one (Retry-After 30 s).
func TestModelRetryEndsAtTheTurnDeadline(t *testing.T) {
	const limit = 400 * time.Millisecond
	const bound = 2 * time.Second // a loaded machine's slack past the limit
	tests := []struct {
		name  string
		reply fakeopenai.Reply
	}{
		{name: "429 forever", reply: fakeopenai.Reply{Status: 429, Body: rateLimitBody, Repeat: true}},
		{name: "429 forever, Retry-After past the deadline", reply: fakeopenai.Reply{Status: 429, Body: rateLimitBody, Repeat: true, Header: map[string]string{"Retry-After": "30"}}},
		{name: "503 forever", reply: fakeopenai.Reply{Status: 503, Body: "overloaded", Repeat: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := fakeopenai.New(t, fakeopenai.Config{}, tt.reply)
			a, _ := retryAgent(t, srv, limit)
			start := time.Now()
			out := a.RunTurn(context.Background(), userInput("hello"))
			elapsed := time.Since(start)
			r := out.Reason
			if r.Kind != protocol.TurnError || r.Code != protocol.CodeLimitExceeded ||
				!strings.Contains(r.Error, "the turn exceeded its 400ms limit") || !strings.Contains(r.Error, "the last model error") ||
				!strings.Contains(r.Error, "HTTP "+strings.Fields(tt.name)[0]+" from") {
				t.Fatalf("turn end %+v, want error LIMIT_EXCEEDED naming the last model error", r)
			}
			if elapsed < limit || elapsed > limit+bound {
				t.Errorf("the turn ended after %v, want within [%v, %v]", elapsed, limit, limit+bound)
			}
			evs := a.Events()
			if len(modelRetries(t, evs)) == 0 {
				t.Fatal("no model/retry logged")
			}
			if err := sessionlog.ValidateReplay(evs, false); err != nil {
				t.Fatalf("the log does not replay: %v", err)
			}
		})
	}
}

// TestModelRetryDisposedDuringThePause: the owner's cancellation during a
// model retry's pause ends the turn aborted with its cause at once, and the
// pause shows in ModelRetry while it lasts.
func TestModelRetryDisposedDuringThePause(t *testing.T) {
	srv := fakeopenai.New(t, fakeopenai.Config{},
		fakeopenai.Reply{Status: 429, Body: rateLimitBody, Repeat: true, Header: map[string]string{"Retry-After": "30"}})
	a, _ := retryAgent(t, srv, time.Minute)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan Outcome, 1)
	go func() { done <- a.RunTurn(ctx, userInput("hello")) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return a.ModelRetry() != nil }, "the turn pauses on a model retry")
	d := a.ModelRetry()
	if d.Attempt != 1 || d.Status != 429 || d.RetryAfterMs != 30000 || d.WaitMs != 30000 || !strings.Contains(d.Diagnostic, "Rate limit reached") {
		t.Fatalf("ModelRetry = %+v", d)
	}
	start := time.Now()
	cancel(&Cancel{Cause: protocol.CauseDisposed})
	var out Outcome
	select {
	case out = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the turn did not end within 5 s of its dispose")
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("the turn ended %v after its dispose, want promptly", el)
	}
	if out.Reason.Kind != protocol.TurnAborted || out.Reason.Cause != protocol.CauseDisposed {
		t.Fatalf("turn end %+v, want aborted disposed", out.Reason)
	}
	if a.ModelRetry() != nil {
		t.Errorf("ModelRetry %+v after the turn ended", a.ModelRetry())
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("%d model requests, want 1", n)
	}
	if err := sessionlog.ValidateReplay(a.Events(), false); err != nil {
		t.Fatalf("the log does not replay: %v", err)
	}
}

// TestModelRetryWait is the pause's arithmetic: doubling from
// ModelRetryBackoff to ModelRetryBackoffMax, a longer Retry-After wins up
// to ModelRetryAfterMax.
func TestModelRetryWait(t *testing.T) {
	l := DefaultLimits()
	tests := []struct {
		attempt    int64
		retryAfter time.Duration
		want       time.Duration
	}{
		{1, 0, 500 * time.Millisecond},
		{2, 0, time.Second},
		{6, 0, 16 * time.Second},
		{7, 0, 30 * time.Second},
		{1000, 0, 30 * time.Second},
		{1, 5 * time.Second, 5 * time.Second},
		{3, time.Second, 2 * time.Second},
		{1, time.Hour, 60 * time.Second},
	}
	for _, tt := range tests {
		if got := l.modelRetryWait(tt.attempt, tt.retryAfter); got != tt.want {
			t.Errorf("attempt %d retryAfter %v: wait %v, want %v", tt.attempt, tt.retryAfter, got, tt.want)
		}
	}
}

// waitOK says whether a logged pause is the backoff want with its jitter
// (want/2 … want), or exactly want when the Retry-After decided it.
func waitOK(got, want, retryAfter int64) bool {
	if retryAfter >= want {
		return got == want
	}
	return got >= max(want/2, retryAfter) && got <= want
}

// TestModelRetryJitter: a backoff pause is drawn from [wait/2, wait], never
// below the Retry-After, and a pause the Retry-After decided is kept whole;
// over many draws the pauses differ (children do not retry in step).
func TestModelRetryJitter(t *testing.T) {
	tests := []struct {
		name             string
		wait, retryAfter time.Duration
		lo, hi           time.Duration
	}{
		{"backoff", time.Second, 0, 500 * time.Millisecond, time.Second},
		{"odd nanoseconds", 3, 0, 1, 3},
		{"retry-after below half", time.Second, 100 * time.Millisecond, 500 * time.Millisecond, time.Second},
		{"retry-after above half", time.Second, 800 * time.Millisecond, 800 * time.Millisecond, time.Second},
		{"retry-after decided", 5 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{"zero", 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[time.Duration]bool{}
			for range 200 {
				got := jitter(tt.wait, tt.retryAfter)
				if got < tt.lo || got > tt.hi {
					t.Fatalf("jitter(%v, %v) = %v, want within [%v, %v]", tt.wait, tt.retryAfter, got, tt.lo, tt.hi)
				}
				seen[got] = true
			}
			if tt.hi-tt.lo > time.Millisecond && len(seen) < 2 {
				t.Errorf("jitter(%v, %v) gave one value in 200 draws: %v", tt.wait, tt.retryAfter, seen)
			}
		})
	}
}
