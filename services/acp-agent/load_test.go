package acpagent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestConcurrentLoadsOfOneSessionAreOne (issue 37, item 7): an editor (or
// the ACP bridge, retrying) sends several session/load of one session at
// once to one `brood acp-agent`: they are served as one load, each answered
// with the session open here, and the session then takes prompts. Before,
// each reopened the root and all but one failed UNAVAILABLE: "session ... is
// live in another process", that process being this one.
func TestConcurrentLoadsOfOneSessionAreOne(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: dir, Reopenable: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Close(ctx); err != nil {
		t.Fatal(err)
	}
	conn := serve(t, s, nil)
	const loads = 4
	errs := make([]error, loads)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: acp.SessionId(root.SessionID), Cwd: dir, McpServers: []acp.McpServer{}})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("session/load %d of %d at once: %v", i+1, loads, err)
		}
	}
	r, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: acp.SessionId(root.SessionID), Prompt: []acp.ContentBlock{acp.TextBlock("say hi")}})
	if err != nil || r.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("a prompt after the loads: %+v, %v", r, err)
	}
}
