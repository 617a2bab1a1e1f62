package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

func openRaw(t *testing.T, s *stack.Stack, req protocol.AgentsOpenRequest) (protocol.AgentsOpenReply, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var r protocol.AgentsOpenReply
	err := s.Client.Call(ctx, protocol.EpAgentsOpen, req, &r)
	return r, err
}

// A root opened with a lineage (the ACP agent behind the ACP bridge) is
// narrowed to it, and only ever narrowed: depth at least the parent's + 1,
// cap and ceiling no wider than the parent's.
func TestRootLineageOnlyNarrows(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	cwd := t.TempDir()
	p := s.Root()
	r1, err := openRaw(t, s, protocol.AgentsOpenRequest{Cwd: cwd, Lineage: &protocol.RootLineage{
		ParentSession: p.SessionID, DelegationDepth: 1, DepthCap: ptr(int64(2)), ToolCeiling: &protocol.ToolFilter{Allow: []string{"x", "y"}}}})
	if err != nil {
		t.Fatal(err)
	}
	h1, _ := s.Log(r1.SessionID)
	if h1.ParentSession != p.SessionID || h1.DelegationDepth != 1 || *h1.DepthCap != 2 || strings.Join(h1.ToolCeiling.Allow, ",") != "x,y" || h1.Origin != protocol.OriginSubagent {
		t.Fatalf("header %+v", h1)
	}
	// A claim wider than its parent's header gets the parent's bounds.
	r2, err := openRaw(t, s, protocol.AgentsOpenRequest{Cwd: cwd, Reopenable: true, Lineage: &protocol.RootLineage{
		ParentSession: r1.SessionID, DelegationDepth: 0, DepthCap: ptr(int64(9)), ToolCeiling: &protocol.ToolFilter{Allow: []string{"y", "z"}, Deny: []string{"w"}}}})
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := s.Log(r2.SessionID)
	if h2.DelegationDepth != 2 || *h2.DepthCap != 2 || strings.Join(h2.ToolCeiling.Allow, ",") != "y" || strings.Join(h2.ToolCeiling.Deny, ",") != "w" || h2.Origin != protocol.OriginReopenable {
		t.Fatalf("header %+v ceiling %+v", h2, h2.ToolCeiling)
	}
	for _, bad := range []protocol.RootLineage{
		{ParentSession: "nobody", DelegationDepth: 1},
		{ParentSession: p.SessionID, DelegationDepth: -1},
		{ParentSession: p.SessionID, DepthCap: ptr(int64(-2))},
		{ParentSession: "not a valid id"},
	} {
		if _, err := openRaw(t, s, protocol.AgentsOpenRequest{Cwd: cwd, Lineage: &bad}); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
			t.Errorf("lineage %+v: err %v", bad, err)
		}
	}
}

// A reopenable root can be made live again by id once no live agent holds
// it; the previous credential is dead from then on.
func TestReopenRoot(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.RootLease = 500 * time.Millisecond })
	cwd := t.TempDir()
	first, err := openRaw(t, s, protocol.AgentsOpenRequest{Cwd: cwd, Reopenable: true})
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.Client.UserGrant(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	grant := g.Grant
	// Without a user grant nobody takes a root's identity over.
	for _, bad := range []string{"", "forged"} {
		if _, err := openRaw(t, s, protocol.AgentsOpenRequest{SessionID: first.SessionID, Grant: bad}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("reopen with grant %q: %v", bad, err)
		}
	}
	if _, err := openRaw(t, s, protocol.AgentsOpenRequest{SessionID: first.SessionID, Grant: grant}); protocol.CodeOf(err) != protocol.CodeUnavailable || !strings.Contains(err.Error(), "is live in another process") {
		t.Fatalf("reopen while live: %v", err)
	}
	plain := s.Root()
	if _, err := openRaw(t, s, protocol.AgentsOpenRequest{SessionID: plain.SessionID, Grant: grant}); protocol.CodeOf(err) != protocol.CodeNotResumable {
		t.Fatalf("reopen a plain root: %v", err)
	}
	if _, err := openRaw(t, s, protocol.AgentsOpenRequest{SessionID: "NOSUCHSESSION", Grant: grant}); protocol.CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("reopen an unknown session: %v", err)
	}
	// Not renewed: the lease lapses and the root can be reopened.
	var second protocol.AgentsOpenReply
	testutil.Eventually(t, 5*time.Second, func() bool {
		second, err = openRaw(t, s, protocol.AgentsOpenRequest{SessionID: first.SessionID, Grant: grant})
		return err == nil
	}, "reopen after the lease lapsed (last error %v)", err)
	if second.SessionID != first.SessionID || second.Credential == first.Credential {
		t.Fatalf("reopened %+v", second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	old := protocol.ParentRef{SessionID: first.SessionID, Credential: first.Credential}
	if err := s.Client.Call(ctx, protocol.EpAgentsRenew, old, nil); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("the previous credential: %v", err)
	}
	cur := protocol.ParentRef{SessionID: second.SessionID, Credential: second.Credential}
	if err := s.Client.Call(ctx, protocol.EpAgentsClose, cur, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := openRaw(t, s, protocol.AgentsOpenRequest{SessionID: first.SessionID, Grant: grant}); err != nil {
		t.Fatalf("reopen after a close: %v", err)
	}
}
