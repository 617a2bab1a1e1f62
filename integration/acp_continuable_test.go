package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

func acpSessions(evs []protocol.SessionEvent) []protocol.ACPSessionData {
	var out []protocol.ACPSessionData
	for _, ev := range evs {
		var d protocol.ACPSessionData
		if ev.Type == protocol.EvACPSession && ev.Decode(&d) == nil {
			out = append(out, d)
		}
	}
	return out
}

// TestContinuableACPChildren (docs/design.md §6, issue point 3): a followup to a
// resident ACP child prompts the same ACP session again; a cold resume loads
// it with session/load when the agent offers it, and is NOT_RESUMABLE when it
// does not.
func TestContinuableACPChildren(t *testing.T) {
	acpDep(t, tsSDK)
	script := acpDep(t, tsAgentScript)
	example := acpDep(t, goExampleAgent)
	s := acpStack(t, realAgentOptions(t),
		acpbridge.AgentConfig{Name: "ts", Command: "node", Args: []string{script}, Env: map[string]string{"TS_AGENT_STATE_DIR": t.TempDir()}},
		acpbridge.AgentConfig{Name: "example", Command: example, Permission: acpbridge.PolicyAllow})
	root := s.Root()
	ctx := context.Background()

	t.Run("resident followup and cold resume with session/load", func(t *testing.T) {
		start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
			Provider: "ts", Parent: root.Ref(), Label: "ts child", Prompt: protocol.Text("slow 800"),
		})
		if err != nil {
			t.Fatal(err)
		}
		// Sent while the first prompt runs: the resident ACP session gets a second session/prompt.
		m2 := followup(t, s, start.ChildID, ref(root), "turns")
		waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 30*time.Second)
		_, evs := s.Log(start.ChildID)
		claims, answers, _ := turnsOf(evs)
		if strings.Join(claims, ",") != start.MessageID+","+m2 || len(answers) != 2 || answers[1] != "turns before this one: 1" {
			t.Fatalf("claims %v answers %v", claims, answers)
		}
		if got := acpSessions(evs); len(got) != 1 || got[0].Loaded || !got[0].LoadSession {
			t.Fatalf("acp/session events %+v: one ACP session for both turns", got)
		}
		// The activation settled and its process is gone: a new followup loads the session.
		followup(t, s, start.ChildID, ref(root), "turns")
		testutil.Eventually(t, 30*time.Second, func() bool {
			_, evs := s.Log(start.ChildID)
			_, answers, _ := turnsOf(evs)
			return len(answers) == 3
		}, "the third turn after a cold resume")
		_, evs = s.Log(start.ChildID)
		_, answers, _ = turnsOf(evs)
		got := acpSessions(evs)
		if len(got) != 2 || !got[1].Loaded || got[1].SessionID != got[0].SessionID || answers[2] != "turns before this one: 2" {
			t.Fatalf("after the cold resume: acp sessions %+v, answers %v", got, answers)
		}
	})

	t.Run("no session/load: NOT_RESUMABLE", func(t *testing.T) {
		start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
			Provider: "example", Parent: root.Ref(), Label: "example child", Prompt: protocol.Text("hello"),
		})
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 60*time.Second)
		_, err = s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: ref(root), Message: protocol.Text("again")})
		if protocol.CodeOf(err) != protocol.CodeNotResumable || !strings.Contains(err.Error(), "session/load") {
			t.Fatalf("followup = %v, want NOT_RESUMABLE naming session/load", err)
		}
	})

	t.Run("options an ACP child cannot honour are refused", func(t *testing.T) {
		p := "x"
		_, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
			Provider: "ts", Parent: root.Ref(), Label: "x", Prompt: protocol.Text("hi"), Options: protocol.ContinuableOptions{Persona: &p},
		})
		if protocol.CodeOf(err) != protocol.CodeUnsupportedCapability {
			t.Fatalf("persona on an ACP child = %v", err)
		}
	})
}
