package client_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestDisposeDescendants: descendants.dispose through the client disposes
// the calling agent's running continuable child and names it; another
// credential is UNAUTHORIZED.
func TestDisposeDescendants(t *testing.T) {
	nc, cl := connect()
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: os.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close(context.Background())
	start, err := cl.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "long", Prompt: protocol.Text("sleep 60s\nsay late"),
	})
	if err != nil {
		t.Fatal(err)
	}
	state := func() string {
		st, err := cl.State(ctx, protocol.ChildRef{ChildID: start.ChildID, Authority: root.Authority()})
		if err != nil {
			t.Fatal(err)
		}
		return st.State
	}
	testutil.Eventually(t, time.Minute, func() bool { return state() == protocol.StateRunning }, "the child does not run")

	forged := root.Ref()
	forged.Credential = "not-the-credential"
	if _, err := cl.DisposeDescendants(ctx, protocol.DescendantsDisposeRequest{Agent: forged}); !errors.Is(err, protocol.ErrUnauthorized) {
		t.Fatalf("with another credential: %v, want UNAUTHORIZED", err)
	}
	r, err := cl.DisposeDescendants(ctx, protocol.DescendantsDisposeRequest{Agent: root.Ref()})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Disposed, []string{start.ChildID}) || len(r.Failed) > 0 {
		t.Fatalf("disposed %v (failed %v), want [%s]", r.Disposed, r.Failed, start.ChildID)
	}
	testutil.Eventually(t, time.Minute, func() bool { return state() == protocol.StateNone }, "the child still has an activation")
}
