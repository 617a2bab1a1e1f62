package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestDescendantsDisposeActsOnlyForTheAgentItself: descendants.dispose (an
// agent ending its own continuable descendants, internal/worker/ending.go)
// answers the agent's own credential, read fresh from its lease, and
// refuses every other caller UNAUTHORIZED: another credential, none, a
// session with no agent, a malformed id, and the agent's credential once a
// coordinator took its lease over (docs/design.md §7, Authority).
func TestDescendantsDisposeActsOnlyForTheAgentItself(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dispose := func(agent protocol.ParentRef) error {
		var reply protocol.DrainReply
		return s.Client.Call(ctx, protocol.EpDescendantsDispose, protocol.DescendantsDisposeRequest{Agent: agent}, &reply)
	}
	forged := root.Ref()
	forged.Credential = protocol.NewCredential()
	noCredential := root.Ref()
	noCredential.Credential = ""
	tests := []struct {
		name  string
		agent protocol.ParentRef
		want  protocol.Code
	}{
		{"the agent's own credential", root.Ref(), ""},
		{"another credential", forged, protocol.CodeUnauthorized},
		{"no credential", noCredential, protocol.CodeUnauthorized},
		{"a session with no agent", protocol.ParentRef{SessionID: "NOSUCHSESSION", Credential: root.Ref().Credential}, protocol.CodeUnauthorized},
		{"a malformed session id", protocol.ParentRef{SessionID: "not/an id", Credential: root.Ref().Credential}, protocol.CodeUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := dispose(tt.agent); protocol.CodeOf(err) != tt.want {
				t.Fatalf("descendants.dispose: %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("the agent's credential after a takeover of its lease", func(t *testing.T) {
		key := store.RootLeaseKey(root.SessionID)
		l, err := store.GetLatest[protocol.AgentRecord](ctx, s.Store.Agents, key)
		if err != nil {
			t.Fatal(err)
		}
		l.Value.TakenOverBy = "coordinator-that-took-it-over"
		if _, err := store.Update(ctx, s.Store.Agents, key, l.Value, l.Revision); err != nil {
			t.Fatal(err)
		}
		if err := dispose(root.Ref()); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("descendants.dispose with a lease taken over: %v, want UNAUTHORIZED", err)
		}
	})
}

// TestChildrenListAuthority: children.list of a parent answers a user grant
// and the parent's own live credential, and refuses UNAUTHORIZED another
// agent (even one whose subtree holds the parent: an agent lists only its
// own children), a forged credential and no authority at all.
func TestChildrenListAuthority(t *testing.T) {
	r := newReadStack(t)
	ctx := context.Background()
	forged := r.root.Ref()
	forged.Credential = protocol.NewCredential()
	tests := []struct {
		name   string
		parent string
		auth   protocol.Authority
		want   protocol.Code
	}{
		{"a grant lists the root's children", r.root.SessionID, r.grant, ""},
		{"a grant lists a child's children", r.child, r.grant, ""},
		{"the root lists its own children", r.root.SessionID, r.rootAuth, ""},
		{"the root does not list its child's children", r.child, r.rootAuth, protocol.CodeUnauthorized},
		{"another root does not list them", r.root.SessionID, r.otherAuth, protocol.CodeUnauthorized},
		{"a forged credential lists nothing", r.root.SessionID, protocol.Authority{Parent: &forged}, protocol.CodeUnauthorized},
		{"no authority lists nothing", r.root.SessionID, protocol.Authority{}, protocol.CodeUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reply, err := r.s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: tt.parent, Authority: tt.auth})
			if protocol.CodeOf(err) != tt.want {
				t.Fatalf("children.list: %v, want %q", err, tt.want)
			}
			if tt.want != "" {
				return
			}
			want := r.child
			if tt.parent == r.child {
				want = r.grandchild
			}
			if len(reply.Rows) != 1 || reply.Rows[0].ID != want {
				t.Fatalf("rows %+v, want the one child %s", reply.Rows, want)
			}
		})
	}
}

// TestAUserGrantActsOnlyOnItsUsersTrees: a grant minted by a user
// (authority.user on that user's subject) reads the roots that user opened
// and their descendants, and nothing else: another user's root and child,
// and a session that does not exist, are refused alike (UNAUTHORIZED, so the
// grant learns nothing of other users' sessions), for sessions.get, the
// log, a root's inbox and continuable.state; what acts on the whole
// deployment (continuable.drains) it may not do at all (docs/security.md).
func TestAUserGrantActsOnlyOnItsUsersTrees(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice, bob := userClient(t, s, "alice"), userClient(t, s, "bob")
	aliceRoot, err := openAs(ctx, t, alice)
	if err != nil {
		t.Fatal(err)
	}
	bobRoot, err := openAs(ctx, t, bob)
	if err != nil {
		t.Fatal(err)
	}
	children := map[string]string{}
	for who, root := range map[string]protocol.ParentRef{"alice": aliceRoot.Ref(), "bob": bobRoot.Ref()} {
		run, res, err := s.Run(root, "spawn", "say hi", protocol.StartOptions{})
		if err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("%s's run: %v %+v", who, err, res)
		}
		children[who] = run.ChildID
	}
	g, err := alice.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grant := protocol.Authority{Grant: g.Grant}
	// What acts on the whole deployment needs a grant over every session.
	if _, err := s.Client.Drains(ctx, protocol.DrainsListRequest{Authority: grant}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("continuable.drains with a user's grant: %v, want UNAUTHORIZED", err)
	}
	if _, err := s.Client.Drains(ctx, protocol.DrainsListRequest{Authority: s.Grant()}); err != nil {
		t.Fatalf("continuable.drains with a grant over every session: %v", err)
	}
	tests := []struct {
		name  string
		id    string
		want  protocol.Code
		inbox bool // a root: its inbox is read too
	}{
		{"alice's root", aliceRoot.SessionID, "", true},
		{"alice's child", children["alice"], "", false},
		{"bob's root", bobRoot.SessionID, protocol.CodeUnauthorized, true},
		{"bob's child", children["bob"], protocol.CodeUnauthorized, false},
		{"a session that does not exist", "NOSUCHSESSION", protocol.CodeUnauthorized, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := s.Client.Header(ctx, protocol.SessionGetRequest{SessionID: tt.id, Authority: grant})
			if protocol.CodeOf(err) != tt.want || (tt.want == "" && h.ID != tt.id) {
				t.Fatalf("sessions.get: %+v, %v; want %q", h, err, tt.want)
			}
			if _, err := s.Client.LogPage(ctx, protocol.LogReadRequest{SessionID: tt.id, Authority: grant}); protocol.CodeOf(err) != tt.want {
				t.Fatalf("sessions.log: %v, want %q", err, tt.want)
			}
			if tt.inbox {
				if _, err := s.Client.Inbox(ctx, protocol.InboxReadRequest{SessionID: tt.id, Authority: grant}); protocol.CodeOf(err) != tt.want {
					t.Fatalf("inbox.read: %v, want %q", err, tt.want)
				}
			}
			if tt.want != "" {
				if _, err := s.Client.State(ctx, protocol.ChildRef{ChildID: tt.id, Authority: grant}); protocol.CodeOf(err) != tt.want {
					t.Fatalf("continuable.state: %v, want %q", err, tt.want)
				}
			}
		})
	}
}

// TestAUserGrantDisposesItsUsersContinuableChildren: `brood dispose CHILD`
// (continuable.drain of given children) works with the grant a client
// mints on its own subject for the children in its own trees, and with
// nothing else: another user's child and an unknown id are UNAUTHORIZED
// alike, and are left running (issue 17, point 8: as the client role it was
// refused for every child, needing a grant over every session).
func TestAUserGrantDisposesItsUsersContinuableChildren(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alice, bob := userClient(t, s, "alice"), userClient(t, s, "bob")
	children := map[string]string{}
	for who, cl := range map[string]*client.Client{"alice": alice, "bob": bob} {
		root, err := openAs(ctx, t, cl)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cl.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: who, Prompt: protocol.Text("sleep 60s\nsay late")})
		if err != nil {
			t.Fatal(err)
		}
		children[who] = r.ChildID
		testutil.Eventually(t, 30*time.Second, func() bool {
			_, err := s.Store.LeaseLatest(ctx, r.ChildID)
			return err == nil
		}, "%s's child live", who)
	}
	g, err := alice.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grant := protocol.Authority{Grant: g.Grant}
	for _, id := range []string{children["bob"], "NOSUCHSESSION"} {
		if _, err := alice.Drain(ctx, protocol.DrainRequest{Authority: grant, Children: []string{id}}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("dispose %s with alice's grant: %v, want UNAUTHORIZED", id, err)
		}
	}
	r, err := alice.Drain(ctx, protocol.DrainRequest{Authority: grant, Children: []string{children["alice"]}})
	if err != nil || len(r.Disposed) != 1 || r.Disposed[0] != children["alice"] {
		t.Fatalf("dispose alice's child with her grant: %+v, %v", r, err)
	}
	if _, err := s.Store.LeaseLatest(ctx, children["bob"]); err != nil {
		t.Fatalf("bob's child after alice's attempt: %v, want it live", err)
	}
}

// TestOnlyAChildsParentOrAGrantActsOnIt: continuable.state (a query) and
// continuable.followup act on a continuable child for its exact live parent
// or a grant over it; another agent, a forged credential and no authority
// are refused UNAUTHORIZED, and to another agent an unknown id answers the
// same (it learns nothing of sessions it may not act on). A grant over every
// session learns what an id is: an unknown one is NOT_FOUND to a query and
// NOT_RESUMABLE to a followup, and a root is INVALID_ARGUMENT to a query and
// NOT_RESUMABLE to a followup. A malformed id is INVALID_ARGUMENT.
func TestOnlyAChildsParentOrAGrantActsOnIt(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root, other := s.Root(), s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "acted on", Prompt: protocol.Text("say hi"),
	})
	if err != nil {
		t.Fatal(err)
	}
	forged := root.Ref()
	forged.Credential = protocol.NewCredential()
	parent, grant := root.Authority(), s.Grant()
	tests := []struct {
		name                string
		id                  string
		auth                protocol.Authority
		wantState, wantSend protocol.Code
	}{
		{"its parent", start.ChildID, parent, "", ""},
		{"a grant", start.ChildID, grant, "", ""},
		{"another agent", start.ChildID, other.Authority(), protocol.CodeUnauthorized, protocol.CodeUnauthorized},
		{"a forged credential", start.ChildID, protocol.Authority{Parent: &forged}, protocol.CodeUnauthorized, protocol.CodeUnauthorized},
		{"no authority", start.ChildID, protocol.Authority{}, protocol.CodeUnauthorized, protocol.CodeUnauthorized},
		{"an agent asking of an unknown id", "NOSUCHSESSION", parent, protocol.CodeUnauthorized, protocol.CodeUnauthorized},
		{"a grant asking of an unknown id", "NOSUCHSESSION", grant, protocol.CodeNotFound, protocol.CodeNotResumable},
		{"a grant asking of a root", root.SessionID, grant, protocol.CodeInvalidArgument, protocol.CodeNotResumable},
		{"a malformed id", "not/an id", grant, protocol.CodeInvalidArgument, protocol.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Client.State(ctx, protocol.ChildRef{ChildID: tt.id, Authority: tt.auth}); protocol.CodeOf(err) != tt.wantState {
				t.Fatalf("continuable.state: %v, want %q", err, tt.wantState)
			}
			if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: tt.id, Authority: tt.auth, Message: protocol.Text("say again")}); protocol.CodeOf(err) != tt.wantSend {
				t.Fatalf("continuable.followup: %v, want %q", err, tt.wantSend)
			}
		})
	}
}
