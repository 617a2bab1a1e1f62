package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

type coordinatorConfig = coordinator.Config

func storeItem(text string) store.InboxItem {
	return store.InboxItem{Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}
}

func contStack(t *testing.T) *testutil.Stack {
	s := testutil.NewStack(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	return s
}

func ref(r *client.Root) protocol.Authority {
	p := r.Ref()
	return protocol.Authority{Parent: &p}
}

func startCont(t *testing.T, s *testutil.Stack, parent protocol.ParentRef, prompt string) protocol.ContinuableStartReply {
	t.Helper()
	r, err := s.Client.StartContinuable(context.Background(), protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: parent, Label: "worker", Prompt: protocol.Text(prompt),
	})
	if err != nil {
		t.Fatalf("continuable.start: %v", err)
	}
	return r
}

func followup(t *testing.T, s *testutil.Stack, child string, auth protocol.Authority, text string) string {
	t.Helper()
	mid, err := s.Client.Followup(context.Background(), protocol.FollowupRequest{ChildID: child, Authority: auth, Message: protocol.Text(text)})
	if err != nil {
		t.Fatalf("followup %q: %v", text, err)
	}
	return mid
}

func state(t *testing.T, s *testutil.Stack, child string, auth protocol.Authority) string {
	t.Helper()
	st, err := s.Client.State(context.Background(), child, auth)
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	return st.State
}

func waitState(t *testing.T, s *testutil.Stack, child string, auth protocol.Authority, want string, d time.Duration) {
	t.Helper()
	testutil.Eventually(t, d, func() bool { return state(t, s, child, auth) == want }, "state of %s is %s", child, want)
}

// turnsOf returns, per turn, the claimed messageIds and the answers.
func turnsOf(evs []protocol.SessionEvent) (claims []string, answers []string, ends []string) {
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvInboxDequeue:
			var d protocol.InboxDequeueData
			_ = ev.Decode(&d)
			claims = append(claims, d.MessageID)
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			_ = ev.Decode(&d)
			if t := protocol.PlainText(d.Message.Content); t != "" {
				answers = append(answers, t)
			}
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			_ = ev.Decode(&d)
			ends = append(ends, d.Reason.Kind)
		}
	}
	return
}

func TestFollowupsWhileRunningBecomeSeparateTurnsInOrder(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	start := startCont(t, s, root.Ref(), "sleep 400ms\nsay one")
	m2 := followup(t, s, start.ChildID, ref(root), "say two")
	m3 := followup(t, s, start.ChildID, ref(root), "say three")
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 15*time.Second)
	_, evs := s.Log(start.ChildID)
	claims, answers, ends := turnsOf(evs)
	if strings.Join(claims, ",") != strings.Join([]string{start.MessageID, m2, m3}, ",") {
		t.Fatalf("claims = %v, want [%s %s %s]", claims, start.MessageID, m2, m3)
	}
	if strings.Join(answers, ",") != "one,two,three" || strings.Join(ends, ",") != "completed,completed,completed" {
		t.Fatalf("answers = %v, ends = %v", answers, ends)
	}
}

func TestColdResumeStartsANewEpochWithOneDescriptor(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	start := startCont(t, s, root.Ref(), "say one")
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	followup(t, s, start.ChildID, ref(root), "say two")
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(start.ChildID)
		_, answers, _ := turnsOf(evs)
		return len(answers) == 2
	}, "second turn")
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	_, evs := s.Log(start.ChildID)
	descriptors := 0
	for _, ev := range evs {
		if ev.Type == protocol.EvSubagentDescriptor {
			descriptors++
		}
	}
	if descriptors != 1 {
		t.Fatalf("%d descriptors; a cold resume never appends another", descriptors)
	}
	var runs []string
	testutil.Eventually(t, 5*time.Second, func() bool {
		runs = nil
		for _, ev := range lifecycleOf(t, s, root.SessionID) {
			if ev.Type == protocol.LifecycleStart && ev.ID == start.ChildID {
				runs = append(runs, ev.RunID)
			}
		}
		return len(runs) == 2
	}, "two epochs")
	if runs[0] == runs[1] {
		t.Fatal("the resumed epoch reused the first epoch's runId")
	}
}

func TestParentWaitsForItsRunningGrandchild(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	start := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"g\",\"prompt\":\"sleep 1500ms\\nsay grand\",\"run_in_background\":true}\nsay started")
	testutil.Eventually(t, 5*time.Second, func() bool {
		return state(t, s, start.ChildID, ref(root)) == protocol.StateWaiting
	}, "the child waits for the grandchild it owns")
	// The grandchild settles; its notice wakes the child, which then settles too.
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 15*time.Second)
	var childEnd, grandEnd time.Time
	_, evs := s.Log(start.ChildID)
	var grand string
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil {
			grand = d.Meta["childId"]
		}
	}
	if grand == "" {
		t.Fatal("no background grandchild recorded")
	}
	var notice bool
	for _, ev := range evs {
		var d protocol.UserMessageData
		if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil && d.Source.Kind == protocol.SourceSubagentSettled && d.Source.SenderSessionID == grand {
			notice = true
		}
	}
	if !notice {
		t.Fatal("the child never received the grandchild's settlement notice")
	}
	for _, ev := range lifecycleOf(t, s, root.SessionID) {
		if ev.Type == protocol.LifecycleEnd && ev.ID == start.ChildID {
			childEnd = time.UnixMilli(ev.Time)
		}
	}
	for _, ev := range lifecycleOf(t, s, start.ChildID) {
		if ev.Type == protocol.LifecycleEnd && ev.ID == grand {
			grandEnd = time.UnixMilli(ev.Time)
		}
	}
	if childEnd.IsZero() || grandEnd.IsZero() || childEnd.Before(grandEnd) {
		t.Fatalf("child ended %v, grandchild %v: the child must settle only after it", childEnd, grandEnd)
	}
}

func TestFollowupAuthority(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	stranger := s.Root()
	start := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"g\",\"prompt\":\"sleep 30s\",\"run_in_background\":true}\nsay started")
	sibling := startCont(t, s, root.Ref(), "say sib")
	waitState(t, s, sibling.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	waitState(t, s, start.ChildID, ref(root), protocol.StateWaiting, 10*time.Second)
	_, evs := s.Log(start.ChildID)
	before := len(evs)
	grand := ""
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil {
			grand = d.Meta["childId"]
		}
	}
	// A sibling and a grandchild act through their own tools, with their own credentials.
	followup(t, s, sibling.ChildID, ref(root), "call send_message {\"subagent_id\":\""+start.ChildID+"\",\"message\":\"say hijack\"}")
	waitState(t, s, sibling.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	_, sevs := s.Log(sibling.ChildID)
	var sres protocol.ToolResultData
	for _, ev := range sevs {
		if ev.Type == protocol.EvToolResult {
			_ = ev.Decode(&sres)
		}
	}
	if !sres.IsError || !strings.Contains(protocol.PlainText(sres.Content), "UNAUTHORIZED") {
		t.Fatalf("sibling send_message = %+v", sres)
	}
	stale := root.Ref()
	if err := root.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		auth protocol.Authority
	}{
		{"stranger", ref(stranger)},
		{"stale parent credential", protocol.Authority{Parent: &stale}},
		{"forged grant", protocol.Authority{Grant: "forged"}},
		{"grandchild claims to be the parent", protocol.Authority{Parent: &protocol.ParentRef{SessionID: grand, Credential: "x"}}},
		{"nobody", protocol.Authority{}},
	}
	for _, tt := range tests {
		_, err := s.Client.Followup(context.Background(), protocol.FollowupRequest{ChildID: start.ChildID, Authority: tt.auth, Message: protocol.Text("say no")})
		if protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Errorf("%s: err = %v, want UNAUTHORIZED", tt.name, err)
		}
	}
	_, evs = s.Log(start.ChildID)
	if len(evs) != before {
		t.Fatalf("refused followups logged %d events in the child", len(evs)-before)
	}
	// A user grant works, even with the parent gone.
	g, err := s.Client.UserGrant(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	mid := followup(t, s, start.ChildID, protocol.Authority{Grant: g.Grant}, "say granted")
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(start.ChildID)
		claims, _, _ := turnsOf(evs)
		return len(claims) > 0 && claims[len(claims)-1] == mid
	}, "the granted message is claimed")
}

func TestNotResumable(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	g, _ := s.Client.UserGrant(context.Background())
	run, _, err := s.Run(root.Ref(), "spawn", "say once", protocol.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]string{"unknown id": "NOPE", "one-shot child": run.ChildID} {
		_, err := s.Client.Followup(context.Background(), protocol.FollowupRequest{ChildID: id, Authority: protocol.Authority{Grant: g.Grant}, Message: protocol.Text("say x")})
		if protocol.CodeOf(err) != protocol.CodeNotResumable {
			t.Errorf("%s: err = %v, want NOT_RESUMABLE", name, err)
		}
	}
	if items, _ := s.Store.InboxOf(run.ChildID).Pending(context.Background(), 0); len(items) != 0 {
		t.Fatal("a refused followup left an item in the inbox")
	}
}

func TestPendingItemsWithoutActivationAreResumed(t *testing.T) {
	s := testutil.NewStack(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 200 * time.Millisecond })
	s.AddSpawnWorker()
	root := s.Root()
	start := startCont(t, s, root.Ref(), "say one")
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	// An item accepted while no activation was live (a host died after the
	// inbox accepted it): nobody sends another followup.
	mid, _, err := s.Store.Enqueue(context.Background(), start.ChildID, storeItem("say resumed"), "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(start.ChildID)
		claims, _, _ := turnsOf(evs)
		return len(claims) == 2 && claims[1] == mid
	}, "the pending item is claimed by a resumed activation")
}
