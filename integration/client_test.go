package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// leastPrivilege is a server with a service user that may do anything and a
// client user "alice" that may only send requests to the coordinator on her
// own subject and subscribe under her own inbox prefix: no JetStream API, no
// stream subject, no other inbox (what docs/protocol.md §5.16 and
// docs/security.md say a client needs).
func leastPrivilege(t *testing.T) (*stack.Stack, *nats.Conn, *violations) {
	t.Helper()
	srv := testutil.ServerWithUsers(t, []*server.User{
		{Username: "svc", Password: "svcpw"},
		{Username: "alice", Password: "alicepw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"brood.v1.user.alice.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.alice.>"}},
		}},
	})
	host := strings.TrimPrefix(srv.ClientURL(), "nats://")
	s := stack.At(t, srv, "nats://svc:svcpw@"+host)
	s.AddCoordinator()
	s.AddSpawnWorker()
	v := &violations{}
	nc, err := nats.Connect("nats://"+host, nats.UserInfo("alice", "alicepw"), nats.CustomInboxPrefix(protocol.UserInboxPrefix("alice")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v.add(err) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return s, nc, v
}

type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) add(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

func (v *violations) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.errs...)
}

// TestClientNeedsOnlyCoordinatorRequestsAndItsInbox runs every verb of
// pkg/client as a NATS user without any JetStream permission, whose replies
// and streams all arrive under its own inbox prefix.
func TestClientNeedsOnlyCoordinatorRequestsAndItsInbox(t *testing.T) {
	s, nc, v := leastPrivilege(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The user really has no JetStream: reading a stream directly fails.
	js, _ := jetstream.New(nc)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := js.Stream(sctx, "BROOD_LOG"); err == nil {
		t.Fatal("alice reads JetStream directly; the test's permissions are too wide")
	}
	scancel()
	v.mu.Lock()
	v.errs = nil // that refusal was the point
	v.mu.Unlock()

	cl, err := client.New(nc, client.Options{AwaitFallback: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if p, err := cl.Providers(ctx); err != nil || p.Instances["spawn"] == 0 {
		t.Fatalf("providers %+v, %v", p, err)
	}
	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close(context.Background())
	follow, err := cl.Follow(ctx, protocol.EventsFollowRequest{Parent: root.SessionID, Descendants: true, Authority: root.Authority()})
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()

	run, err := cl.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say ok")})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(run.String(), "run ") {
		t.Fatal(run.String())
	}
	res, err := run.Result(ctx)
	if err != nil || res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "ok" {
		t.Fatalf("result %+v, %v", res, err)
	}
	for _, want := range []string{protocol.LifecycleStart, protocol.LifecycleEnd} {
		ev, err := follow.Next(ctx)
		if err != nil || ev.Type != want || ev.ID != run.ChildID {
			t.Fatalf("followed %+v, %v; want %s of %s", ev, err, want, run.ChildID)
		}
	}
	l, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: run.ChildID, Authority: root.Authority()})
	if err != nil || l.Header.ParentSession != root.SessionID || len(l.Events) == 0 {
		t.Fatalf("log %+v, %v", l.Header, err)
	}
	page, err := cl.Events(ctx, protocol.EventsReadRequest{Parent: root.SessionID, Authority: root.Authority()})
	if err != nil || len(page.Events) != 2 {
		t.Fatalf("events %+v, %v", page, err)
	}
	st, err := cl.Await(ctx, protocol.RunRef{RunID: run.RunID, Parent: ptrTo(root.Ref())})
	if err != nil || st.State != protocol.RunSettled {
		t.Fatalf("await %+v, %v", st, err)
	}

	// Three background children through the subagent tool's run_in_background,
	// acting with the root's credential: three settlement notices reach the
	// root's inbox, and its client reads them.
	tool := agent.SubagentTool(agent.SubagentConfig{Client: cl, Provider: "spawn", Background: agent.BackgroundStarter(cl, "spawn")})
	h, err := cl.Header(ctx, protocol.SessionGetRequest{SessionID: root.SessionID, Authority: root.Authority()})
	if err != nil {
		t.Fatal(err)
	}
	children := map[string]bool{}
	for i := 1; i <= 3; i++ {
		r := tool.Run(ctx, agent.ToolContext{Header: h, Credential: root.Credential, Turn: 1, Step: 1, CallID: fmt.Sprint(i)},
			fmt.Sprintf(`{"description":"job %d","prompt":"say result %d","run_in_background":true}`, i, i))
		if r.IsError || r.Meta["childId"] == "" {
			t.Fatalf("background start %d: %+v", i, r)
		}
		children[r.Meta["childId"]] = true
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		p, err := s.Client.Inbox(ctx, protocol.InboxReadRequest{SessionID: root.SessionID, Authority: s.Grant()})
		return err == nil && len(p.Items) == 3
	}, "three settlement notices in the root's inbox")

	// `brood inbox` shows them (on the service connection, whose user acts
	// on every user's sessions with --all-users: alice opened the root).
	out := broodOut(t, s, "inbox", "--all-users", root.SessionID)
	if n := strings.Count(out, protocol.SourceSubagentSettled); n != 3 {
		t.Fatalf("brood inbox shows %d notices:\n%s", n, out)
	}
	for id := range children {
		if !strings.Contains(out, id) {
			t.Fatalf("brood inbox does not name child %s:\n%s", id, out)
		}
	}

	var notices []protocol.InboxItem
	testutil.Eventually(t, 20*time.Second, func() bool {
		items, err := root.Notices(ctx, protocol.InboxReadRequest{WaitMs: 2_000})
		if err != nil {
			t.Fatal(err)
		}
		notices = append(notices, items...)
		return len(notices) >= 3
	}, "the root's client reads three notices")
	texts := map[string]bool{}
	for _, n := range notices {
		if n.Source.Kind != protocol.SourceSubagentSettled || !children[n.Source.SenderSessionID] {
			t.Fatalf("notice %+v", n)
		}
		texts[protocol.AllText(n.Content)] = true
	}
	for i := 1; i <= 3; i++ {
		found := false
		for text := range texts {
			found = found || strings.Contains(text, fmt.Sprintf("Closing message:\nresult %d", i))
		}
		if !found {
			t.Fatalf("no notice carries result %d: %v", i, texts)
		}
	}
	if p, err := root.Inbox(ctx, protocol.InboxReadRequest{}); err != nil || len(p.Items) != 0 {
		t.Fatalf("the root's inbox after reading: %+v, %v", p, err)
	}
	if out := broodOut(t, s, "inbox", "--all-users", root.SessionID); !strings.Contains(out, "(inbox empty)") {
		t.Fatalf("brood inbox after the client read it:\n%s", out)
	}

	// Continuable verbs: state, followup, interrupt, children.
	var child string
	for id := range children {
		child = id
		break
	}
	if st, err := cl.State(ctx, protocol.ChildRef{ChildID: child, Authority: root.Authority()}); err != nil || st.ChildID != child {
		t.Fatalf("state %+v, %v", st, err)
	}
	if r, err := cl.Followup(ctx, protocol.FollowupRequest{ChildID: child, Authority: root.Authority(), Message: protocol.Text("say more")}); err != nil || r.MessageID == "" {
		t.Fatalf("followup %+v, %v", r, err)
	}
	if _, err := cl.Interrupt(ctx, protocol.InterruptRequest{ChildID: child, Authority: root.Authority()}); err != nil {
		t.Fatal(err)
	}
	if list, err := cl.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: root.Authority()}); err != nil || len(list.Rows) != 4 {
		t.Fatalf("children %+v, %v", list, err)
	}
	// Errors are typed, with causes for what the client did itself.
	_, err = cl.Header(ctx, protocol.SessionGetRequest{SessionID: "nosuch", Authority: root.Authority()})
	if !errors.Is(err, protocol.ErrUnauthorized) {
		t.Fatalf("header of an unknown session: %v", err)
	}
	expired, ecancel := context.WithTimeout(ctx, time.Millisecond)
	defer ecancel()
	<-expired.Done()
	_, err = cl.Inbox(expired, protocol.InboxReadRequest{SessionID: root.SessionID, Authority: root.Authority(), WaitMs: 10_000})
	if !errors.Is(err, protocol.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request past its deadline: %v", err)
	}
	if vs := v.list(); len(vs) > 0 {
		t.Fatalf("permission violations:\n%s", strings.Join(vs, "\n"))
	}
}

func ptrTo[T any](v T) *T { return &v }

// broodOut runs a brood client verb against the stack (as its service user)
// and returns its stdout.
func broodOut(t *testing.T, s *stack.Stack, args ...string) string {
	t.Helper()
	cmd := exec.Command(broodBin, append(args, "--nats", s.URL)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("brood %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("brood %v: %v", args, err)
	}
	return string(out)
}
