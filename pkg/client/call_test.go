package client_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// These tests run the client against a core nats-server (no JetStream) and a
// hand-written responder in place of the coordinator: what the client does
// with each kind of answer, and with none.

// coreServer starts a core nats-server on a free loopback port, with users
// when given (none: anyone connects); it stops at the end of the test.
func coreServer(t *testing.T, users ...*server.User) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL()
}

func dial(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// respond serves subject on its own connection with answer until the test
// ends (answer nil: it receives and never replies).
func respond(t *testing.T, url, subject string, answer func(m *nats.Msg) *nats.Msg) {
	t.Helper()
	nc := dial(t, url)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if answer == nil {
			return
		}
		if r := answer(m); r != nil {
			r.Subject = m.Reply
			_ = nc.PublishMsg(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func body(t *testing.T, enc protocol.Encoding, v any) []byte {
	t.Helper()
	data, err := protocol.Marshal(enc, v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func header(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// TestCallMapsEveryAnswerToTheCatalogue is the contract of client.Call
// (docs/protocol.md §2): a reply in either encoding is decoded; an error
// reply is a *protocol.Error with its code (from the body, else from the
// Nats-Service-Error header); no responder, a deadline, a cancelled context
// and an undecodable reply are UNAVAILABLE, CANCELLED or INTERNAL with their
// cause.
func TestCallMapsEveryAnswerToTheCatalogue(t *testing.T) {
	url := coreServer(t)
	nc := dial(t, url)
	want := protocol.ProvidersListReply{Providers: []protocol.ProviderDescriptor{{Name: "spawn"}}, Instances: map[string]int{"spawn": 2}}
	notFound := protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "run r1"})
	tests := []struct {
		name    string
		answer  func(m *nats.Msg) *nats.Msg // nil: nobody serves the subject
		silent  bool                        // served, never answered
		ctx     func() (context.Context, context.CancelFunc)
		code    protocol.Code // "" for success
		cause   error
		message string
	}{
		{name: "msgpack reply", answer: func(*nats.Msg) *nats.Msg {
			return &nats.Msg{Data: body(t, protocol.Msgpack, want)}
		}},
		{name: "JSON reply", answer: func(*nats.Msg) *nats.Msg {
			return &nats.Msg{Header: header(protocol.HeaderContentType, protocol.ContentTypeJSON), Data: body(t, protocol.JSON, want)}
		}},
		{name: "error reply with its body", answer: func(*nats.Msg) *nats.Msg {
			return &nats.Msg{Header: header(protocol.HeaderServiceErrorCode, "1020", protocol.HeaderServiceError, "NOT_FOUND: whatever"),
				Data: body(t, protocol.Msgpack, notFound)}
		}, code: protocol.CodeNotFound, message: notFound.Message},
		{name: "error reply with headers only", answer: func(*nats.Msg) *nats.Msg {
			return &nats.Msg{Header: header(protocol.HeaderServiceErrorCode, "1011", protocol.HeaderServiceError, "DRAINING: admission is closed")}
		}, code: protocol.CodeDraining, message: "admission is closed"},
		{name: "error header without a code", answer: func(*nats.Msg) *nats.Msg {
			return &nats.Msg{Header: header(protocol.HeaderServiceErrorCode, "500", protocol.HeaderServiceError, "boom")}
		}, code: protocol.CodeInternal, message: "error 500: boom"},
		{name: "undecodable reply", answer: func(*nats.Msg) *nats.Msg {
			return &nats.Msg{Data: []byte{0xc1}} // a reserved MessagePack code
		}, code: protocol.CodeInternal},
		{name: "no responder", code: protocol.CodeUnavailable, cause: nats.ErrNoResponders},
		{name: "no answer before the deadline", silent: true, ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, code: protocol.CodeUnavailable, cause: context.DeadlineExceeded},
		{name: "cancelled", silent: true, ctx: func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx, cancel
		}, code: protocol.CodeCancelled, cause: context.Canceled},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subject := "test.call." + string(rune('a'+i))
			switch {
			case tt.answer != nil:
				respond(t, url, subject, tt.answer)
			case tt.silent:
				respond(t, url, subject, nil)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			var got protocol.ProvidersListReply
			err := client.Call(ctx, nc, subject, protocol.Empty{}, &got)
			if tt.code == "" {
				if err != nil {
					t.Fatalf("Call: %v", err)
				}
				if len(got.Providers) != 1 || got.Providers[0].Name != "spawn" || got.Instances["spawn"] != 2 {
					t.Fatalf("reply decoded as %+v", got)
				}
				return
			}
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != tt.code {
				t.Fatalf("Call: %v (%T), want a %s *protocol.Error", err, err, tt.code)
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("Call: %v does not wrap %v", err, tt.cause)
			}
			if tt.message != "" && pe.Message != tt.message {
				t.Errorf("message %q, want %q", pe.Message, tt.message)
			}
		})
	}
}

// TestErrorOfTellsRepliesFromErrors: only a message with the micro error
// headers is an error.
func TestErrorOfTellsRepliesFromErrors(t *testing.T) {
	tests := []struct {
		msg  *nats.Msg
		code protocol.Code
	}{
		{&nats.Msg{Data: []byte{0x80}}, ""},
		{&nats.Msg{Header: header(protocol.HeaderContentType, protocol.ContentTypeJSON), Data: []byte(`{}`)}, ""},
		{&nats.Msg{Header: header(protocol.HeaderServiceError, "UNAUTHORIZED: no")}, protocol.CodeUnauthorized},
		{&nats.Msg{Header: header(protocol.HeaderServiceErrorCode, "1005", protocol.HeaderContentType, protocol.ContentTypeJSON),
			Data: []byte(`{"code":"UNAUTHORIZED","message":"not authorized: x"}`)}, protocol.CodeUnauthorized},
	}
	for i, tt := range tests {
		got := client.ErrorOf(tt.msg)
		switch {
		case tt.code == "" && got != nil:
			t.Errorf("%d: a reply read as error %v", i, got)
		case tt.code != "" && (got == nil || got.Code != tt.code):
			t.Errorf("%d: ErrorOf = %v, want %s", i, got, tt.code)
		}
	}
}

// TestResultErrorIsTyped: a completed result is no error; any other is a
// *client.RunError carrying the result and wrapping the *protocol.Error of
// its code (the result's errorCode; CANCELLED for aborted; INTERNAL else).
func TestResultErrorIsTyped(t *testing.T) {
	tests := []struct {
		res  protocol.SubagentResult
		code protocol.Code
		is   error
	}{
		{protocol.SubagentResult{StopReason: protocol.StopCompleted}, "", nil},
		{protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeHostLost, Diagnostic: "host h1 stopped heartbeating"}, protocol.CodeHostLost, protocol.ErrHostLost},
		{protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeDurabilityFailed}, protocol.CodeDurabilityFailed, protocol.ErrDurabilityFailed},
		{protocol.SubagentResult{StopReason: protocol.StopAborted}, protocol.CodeCancelled, protocol.ErrCancelled},
		{protocol.SubagentResult{StopReason: protocol.StopMaxTokens}, protocol.CodeInternal, protocol.ErrInternal},
		{protocol.SubagentResult{StopReason: protocol.StopRefusal, Diagnostic: "declined"}, protocol.CodeInternal, protocol.ErrInternal},
	}
	for _, tt := range tests {
		err := client.ResultError(tt.res)
		if tt.code == "" {
			if err != nil {
				t.Errorf("%s: ResultError = %v, want nil", tt.res.StopReason, err)
			}
			continue
		}
		var re *client.RunError
		if !errors.As(err, &re) || re.StopReason() != tt.res.StopReason || re.Result.Diagnostic != tt.res.Diagnostic {
			t.Fatalf("%s: ResultError = %#v, want a *client.RunError with the result", tt.res.StopReason, err)
		}
		if re.Code() != tt.code || protocol.CodeOf(err) != tt.code || !errors.Is(err, tt.is) {
			t.Errorf("%s: code %s (CodeOf %s), want %s", tt.res.StopReason, re.Code(), protocol.CodeOf(err), tt.code)
		}
		if !strings.HasPrefix(err.Error(), string(tt.code)+": run ended with stopReason "+string(tt.res.StopReason)) ||
			!strings.Contains(err.Error(), tt.res.Diagnostic) {
			t.Errorf("%s: message %q", tt.res.StopReason, err.Error())
		}
	}
}

// fakeCoordinator answers runs.start (recording the notify subject the
// client chose) and runs.await (with settled, counting the calls).
type fakeCoordinator struct {
	notify  chan string
	awaited atomic.Int32
	settled protocol.RunStatus
}

func newFakeCoordinator(t *testing.T, url string, subj protocol.Subjects, settled protocol.RunStatus) *fakeCoordinator {
	f := &fakeCoordinator{notify: make(chan string, 1), settled: settled}
	respond(t, url, subj.Coord(protocol.EpRunsStart), func(m *nats.Msg) *nats.Msg {
		var r protocol.RunStartRequest
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &r); err != nil {
			t.Errorf("runs.start body: %v", err)
			return nil
		}
		f.notify <- r.Notify
		return &nats.Msg{Data: body(t, protocol.Msgpack, protocol.RunStartReply{RunID: settled.RunID, ChildID: settled.ChildID})}
	})
	respond(t, url, subj.Coord(protocol.EpRunsAwait), func(m *nats.Msg) *nats.Msg {
		f.awaited.Add(1)
		return &nats.Msg{Data: body(t, protocol.Msgpack, f.settled)}
	})
	return f
}

// TestRunResultFromNoticeOrAwait: a run's result comes from its notice on
// the notify subject the client chose under its own inbox prefix; when no
// notice comes within AwaitFallback, from runs.await.
func TestRunResultFromNoticeOrAwait(t *testing.T) {
	url := coreServer(t)
	subj := protocol.MustSubjects("")
	res := protocol.SubagentResult{StopReason: protocol.StopCompleted, Output: protocol.Text("done")}
	settled := protocol.RunStatus{RunID: "r1", ChildID: "r1", State: protocol.RunSettled, Result: &res}
	parent := protocol.ParentRef{SessionID: "root1", Credential: "cred"}
	for _, notice := range []bool{true, false} {
		name := map[bool]string{true: "notice", false: "await"}[notice]
		t.Run(name, func(t *testing.T) {
			f := newFakeCoordinator(t, url, subj, settled)
			nc := dial(t, url, nats.CustomInboxPrefix("_INBOX_test_"+name))
			cl, err := client.New(nc, client.Options{AwaitFallback: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			run, err := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: parent, Prompt: protocol.Text("x"), Notify: "somewhere.else"})
			if err != nil {
				t.Fatal(err)
			}
			if run.RunID != "r1" || run.ChildID != "r1" {
				t.Fatalf("run %+v", run)
			}
			subject := <-f.notify
			if !strings.HasPrefix(subject, "_INBOX_test_"+name+".") {
				t.Fatalf("notify subject %q is not under the connection's inbox prefix", subject)
			}
			if notice {
				n := protocol.RunNotice{RunID: "r1", ChildID: "r1", Result: res}
				if err := dial(t, url).Publish(subject, body(t, protocol.Msgpack, n)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := run.Result(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got.StopReason != protocol.StopCompleted || protocol.PlainText(got.Output) != "done" {
				t.Fatalf("result %+v", got)
			}
			if awaited := f.awaited.Load(); (awaited > 0) == notice {
				t.Errorf("runs.await called %d times with notice=%v", awaited, notice)
			}
		})
	}
}

// TestRunResultCancelled: a cancelled wait is CANCELLED with its cause.
func TestRunResultCancelled(t *testing.T) {
	url := coreServer(t)
	subj := protocol.MustSubjects("")
	f := newFakeCoordinator(t, url, subj, protocol.RunStatus{RunID: "r2", ChildID: "r2", State: protocol.RunRunning})
	cl, err := client.New(dial(t, url), client.Options{AwaitFallback: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	run, err := cl.StartRun(context.Background(), protocol.RunStartRequest{Provider: "spawn", Prompt: protocol.Text("x")})
	if err != nil {
		t.Fatal(err)
	}
	<-f.notify
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = run.Result(ctx)
	if !errors.Is(err, protocol.ErrCancelled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Result after the deadline: %v", err)
	}
	if f.awaited.Load() == 0 {
		t.Error("a run still running was never asked about with runs.await")
	}
}

// TestRunResultAgainAfterACancelledWait: a wait cut short leaves the run's
// notice subscribed, so asking again gets the notice as it comes, not
// after AwaitFallback (the subagent tool's wait after a budget's deadline
// took its whole 10 s: the first wait had dropped the subscription).
func TestRunResultAgainAfterACancelledWait(t *testing.T) {
	url := coreServer(t)
	subj := protocol.MustSubjects("")
	f := newFakeCoordinator(t, url, subj, protocol.RunStatus{RunID: "r3", ChildID: "r3", State: protocol.RunRunning})
	cl, err := client.New(dial(t, url), client.Options{AwaitFallback: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	run, err := cl.StartRun(context.Background(), protocol.RunStartRequest{Provider: "spawn", Prompt: protocol.Text("x")})
	if err != nil {
		t.Fatal(err)
	}
	subject := <-f.notify
	cut, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := run.Result(cut); !errors.Is(err, protocol.ErrCancelled) {
		t.Fatalf("Result with a cancelled context: %v", err)
	}
	res := protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeBudgetExhausted, Diagnostic: "the budget's deadline passed"}
	if err := dial(t, url).Publish(subject, body(t, protocol.Msgpack, protocol.RunNotice{RunID: "r3", ChildID: "r3", Result: res})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := run.Result(ctx)
	if err != nil {
		t.Fatalf("Result again after the notice: %v", err)
	}
	if got.ErrorCode != protocol.CodeBudgetExhausted || got.Diagnostic != res.Diagnostic {
		t.Fatalf("result %+v, want the notice's", got)
	}
	if n := f.awaited.Load(); n != 0 {
		t.Errorf("runs.await called %d times; the notice should have answered", n)
	}
}

// TestNewRefusesABadPrefix: an invalid subject prefix is INVALID_ARGUMENT.
func TestNewRefusesABadPrefix(t *testing.T) {
	_, err := client.New(nil, client.Options{Prefix: "no spaces"})
	if !errors.Is(err, protocol.ErrInvalidArgument) {
		t.Fatalf("New with a bad prefix: %v", err)
	}
}

// TestARefusedRequestIsPermissionDenied (issue 37, item 7): a service's
// request that NATS refuses (its user may not publish the subject, as a
// worker whose role lacks <p>.v1.inboxremove.<provider>.> asking for an
// inbox item's removal) is PERMISSION_DENIED, naming the subject, not
// UNAVAILABLE: no retry mends it. Before, it waited for its deadline and
// ended UNAVAILABLE ("no reply ... in time; retry later").
func TestARefusedRequestIsPermissionDenied(t *testing.T) {
	const refused = "brood.v1.inboxremove.spawn.child-1"
	url := coreServer(t, &server.User{Username: "worker", Password: "pw", Permissions: &server.Permissions{
		Publish: &server.SubjectPermission{Deny: []string{"brood.v1.inboxremove.>"}}}})
	respond(t, strings.Replace(url, "nats://", "nats://worker:pw@", 1), "brood.v1.inboxremove.>", func(m *nats.Msg) *nats.Msg { return &nats.Msg{Data: m.Data} })
	nc := dial(t, strings.Replace(url, "nats://", "nats://worker:pw@", 1), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := client.Call(ctx, nc, refused, protocol.InboxRemoveRequest{Seqs: []protocol.Seq{1}}, &protocol.InboxAckReply{})
	if !errors.Is(err, protocol.ErrPermissionDenied) || !strings.Contains(err.Error(), refused) {
		t.Fatalf("a request NATS refused: %v; want PERMISSION_DENIED naming %s", err, refused)
	}
	// A request the user may make, unanswered, stays UNAVAILABLE.
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if err := client.Call(ctx2, nc, "brood.v1.nobody.serves.this", protocol.Empty{}, nil); !errors.Is(err, protocol.ErrUnavailable) {
		t.Fatalf("an unanswered request: %v; want UNAVAILABLE", err)
	}
}
