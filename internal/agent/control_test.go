package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestABackgroundStartSaysWhetherItQueued: the subagent tool's background
// start tells the model what continuable.start answered: a child started,
// or one whose start waits in the caller's start queue (state queued, the
// caller at its live-children limit), which send_message cannot reach yet.
// Before, a queued child was "started ... can message it with
// send_message", and the model's message was refused UNAVAILABLE.
func TestABackgroundStartSaysWhetherItQueued(t *testing.T) {
	s := testutil.Server(t)
	cl, err := client.New(testutil.Connect(t, s.ClientURL()), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	srv := rpc.NewServer(testutil.Connect(t, s.ClientURL()), 8, testutil.Logger(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Stop(ctx)
	})
	state := make(chan string, 1)
	if err := srv.Handle(cl.Subjects().Coord(protocol.EpContinuableStart), rpc.Typed(func(_ context.Context, _ rpc.Request, r protocol.ContinuableStartRequest) (protocol.ContinuableStartReply, error) {
		return protocol.ContinuableStartReply{ChildID: r.ChildID, MessageID: "m1", State: <-state}, nil
	})); err != nil {
		t.Fatal(err)
	}
	tool := SubagentTool(SubagentConfig{Client: cl, Provider: "spawn", Background: BackgroundStarter(cl, "spawn")})
	tc := ToolContext{Header: protocol.SessionHeader{ID: "parent-1", DelegationDepth: 1}, Credential: "cred"}
	for _, tt := range []struct {
		state, lead, want, not string
	}{
		{"", "started subagent ", " in the background; you will get a notice when it settles, and can message it with send_message", "queued"},
		{protocol.StateQueued, "queued subagent ", ": you are at your limit of live subagents, so it starts in the background when one of them ends; " +
			"you will get a notice when it settles; send_message to it is refused until it started", "can message it"},
	} {
		state <- tt.state
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r := tool.Run(ctx, tc, `{"description":"bg","prompt":"work","run_in_background":true}`)
		cancel()
		text := protocol.PlainText(r.Content)
		if want := tt.lead + r.Meta["childId"] + tt.want; r.IsError || r.Meta["childId"] == "" || !strings.HasPrefix(text, want) || strings.Contains(text, tt.not) {
			t.Errorf("state %q: result %q (error %v); want %q without %q", tt.state, text, r.IsError, want, tt.not)
		}
		if r.Meta["state"] != tt.state {
			t.Errorf("state %q: meta %v", tt.state, r.Meta)
		}
	}
}
