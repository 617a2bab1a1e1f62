package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/fakeopenai"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// openAIOn returns a model factory of the openai adapter on a fake server.
func openAIOn(srv *fakeopenai.Server) worker.ModelFactory {
	return func() (model.Model, error) {
		return model.NewOpenAI(model.OpenAIConfig{
			BaseURL: srv.URL, Model: "deepseek-chat", APIKey: fakeopenai.Key, HTTPClient: srv.HTTPClient(),
			StreamIdleTimeout: 10 * time.Second,
		})
	}
}

func turnEnds(evs []protocol.SessionEvent) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == protocol.EvTurnEnd {
			n++
		}
	}
	return n
}

// TestForkOfASessionWhoseServerRepeatsCallIDs is issue 14, item 2: a server
// that numbers its calls call_0 in every step is accepted while the turn
// runs; a later fork of that session must not fail with "the parent's
// history does not replay … tool call id call_0 used twice".
func TestForkOfASessionWhoseServerRepeatsCallIDs(t *testing.T) {
	srv := fakeopenai.New(t, fakeopenai.Config{DuplicateIDs: true},
		// The continuable child's first turn: call_0 in each step.
		fakeopenai.Calls(fakeopenai.Call{ID: "call_0", Name: "list_dir", Arguments: "{}"}),
		fakeopenai.Calls(fakeopenai.Call{ID: "call_0", Name: "list_dir", Arguments: "{}"}),
		fakeopenai.Say("looked twice"),
		// Its second turn forks it; the fork child answers, then the parent.
		fakeopenai.Calls(fakeopenai.Call{ID: "call_0", Name: "subagent", Arguments: `{"description":"fork it","prompt":"go on"}`}),
		fakeopenai.Say("forked"),
		fakeopenai.Say("done"),
	)
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker(func(c *worker.InProcessConfig) {
		c.Models, c.SubagentProvider, c.SubagentInherits = openAIOn(srv), "fork", true
	})
	s.AddForkWorker(func(c *worker.InProcessConfig) { c.Models = openAIOn(srv) })
	root := s.Root()
	start := startCont(t, s, root.Ref(), "look around")
	testutil.Eventually(t, 20*time.Second, func() bool { _, evs := s.Log(start.ChildID); return turnEnds(evs) == 1 }, "turn 1 ended")
	followup(t, s, start.ChildID, ref(root), "now fork yourself")
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 20*time.Second, func() bool { _, evs = s.Log(start.ChildID); return turnEnds(evs) == 2 }, "turn 2 ended")
	var res *protocol.ToolResultData
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "subagent" {
			res = &d
		}
	}
	if res == nil || res.IsError || protocol.PlainText(res.Content) != "forked" {
		t.Fatalf("the fork's result %+v", res)
	}
	if err := sessionlog.ValidateReplay(evs, false); err != nil {
		t.Fatalf("the session does not replay: %v", err)
	}
	for _, r := range srv.Requests() {
		seen := map[string]bool{}
		for _, m := range r.Messages {
			for _, c := range m.ToolCalls {
				if seen[c.ID] {
					t.Fatalf("a request repeated tool call id %s", c.ID)
				}
				seen[c.ID] = true
			}
		}
	}
	if rej := srv.Rejections(); len(rej) > 0 {
		t.Fatalf("rejected: %s", strings.Join(rej, "; "))
	}
}
