package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

type coordinatorConfig = coordinator.Config

func storeItem(text string) store.InboxItem {
	return store.InboxItem{Content: protocol.Text(text), Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}
}

func contStack(t *testing.T) *stack.Stack {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	return s
}

// meteredStack is contStack whose coordinator and worker count in m, as in
// one `brood dev` process.
func meteredStack(t *testing.T) (*stack.Stack, *telemetry.Metrics) {
	m := telemetry.NewMetrics("test")
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.Metrics = m })
	s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.Metrics = m })
	return s, m
}

// eventuallySample waits until sum(name{labels}) == v (absent counts as 0):
// gauges follow the components' state a moment after clients see it.
func eventuallySample(t *testing.T, m *telemetry.Metrics, v float64, name string, labels ...string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		got, _ := gathered(t, m).Sum(name, labels...)
		return got == v
	}, "%s%v = %v", name, labels, v)
}

func gathered(t *testing.T, m *telemetry.Metrics) telemetry.Families {
	t.Helper()
	f, err := m.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func ref(r *client.Root) protocol.Authority {
	p := r.Ref()
	return protocol.Authority{Parent: &p}
}

func startCont(t *testing.T, s *stack.Stack, parent protocol.ParentRef, prompt string) protocol.ContinuableStartReply {
	t.Helper()
	r, err := s.Client.StartContinuable(context.Background(), protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: parent, Label: "worker", Prompt: protocol.Text(prompt),
	})
	if err != nil {
		t.Fatalf("continuable.start: %v", err)
	}
	return r
}

func followup(t *testing.T, s *stack.Stack, child string, auth protocol.Authority, text string) string {
	t.Helper()
	mid, err := s.Client.Followup(context.Background(), protocol.FollowupRequest{ChildID: child, Authority: auth, Message: protocol.Text(text)})
	if err != nil {
		t.Fatalf("followup %q: %v", text, err)
	}
	return mid.MessageID
}

func state(t *testing.T, s *stack.Stack, child string, auth protocol.Authority) string {
	t.Helper()
	st, err := s.Client.State(context.Background(), protocol.ChildRef{ChildID: child, Authority: auth})
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	return st.State
}

func waitState(t *testing.T, s *stack.Stack, child string, auth protocol.Authority, want string, d time.Duration) {
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
	s, m := meteredStack(t)
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
	// Both followups found the activation resident; one epoch ran them all.
	f := gathered(t, m)
	wantSample(t, f, 2, "brood_followup_accept_duration_seconds_count", "route", telemetry.RouteResident)
	wantSample(t, f, 0, "brood_followup_accept_duration_seconds_count", "route", telemetry.RouteCold)
	wantSample(t, f, 1, "brood_runs_started_total", "mode", protocol.ModeContinuable)
	wantSample(t, f, 1, "brood_runs_settled_total", "mode", protocol.ModeContinuable, "stop_reason", "completed")
	wantSample(t, f, 3, "brood_model_requests_total", "adapter", "scripted")
}

func TestColdResumeStartsANewEpochWithOneDescriptor(t *testing.T) {
	s, m := meteredStack(t)
	root := s.Root()
	start := startCont(t, s, root.Ref(), "say one")
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	waitListedInactive(t, s, root, start.ChildID)
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
	f := gathered(t, m)
	cont := []string{"provider", "spawn", "mode", protocol.ModeContinuable}
	wantSample(t, f, 1, "brood_followup_accept_duration_seconds_count", "route", telemetry.RouteCold)
	wantSample(t, f, 2, "brood_runs_started_total", cont...)
	wantSample(t, f, 2, "brood_runs_settled_total", append(cont, "stop_reason", "completed")...)
	wantSample(t, f, 2, "brood_delegation_duration_seconds_count", cont...)
	eventuallySample(t, m, 0, "brood_activations_live")
}

// waitListedInactive waits until the coordinator lists child (of root)
// inactive. A followup is routed by the coordinator's lease cache
// (residentCached), which its watch of brood_agents updates a moment after
// the bucket: `state` reads the bucket, so it can answer none while the cache
// still shows the epoch that ended live, and a followup sent then goes the
// resident route (the liveness sweep resumes the child), not the cold one.
// The listing reads the same cache (childRow).
func waitListedInactive(t *testing.T, s *stack.Stack, root *client.Root, child string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		list, err := s.Client.Children(context.Background(), protocol.ChildrenListRequest{Parent: root.SessionID, Authority: ref(root)})
		if err != nil {
			return false
		}
		for _, r := range list.Rows {
			if r.ID == child {
				return r.Kind == protocol.RowChild && r.Activity == protocol.ActivityInactive
			}
		}
		return false
	}, "the coordinator lists %s inactive", child)
}

// TestParentWaitsForItsRunningGrandchild: a continuable child that started a
// background grandchild waits for it (docs/design.md §7, Ownership), takes its
// settlement notice in the same epoch, and settles only after it.
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
	// One epoch each: the child waited for the notice rather than settling
	// and being resumed by it.
	childRun := onlyEpoch(t, s, root.SessionID, start.ChildID)
	grandRun := onlyEpoch(t, s, start.ChildID, grand)
	// Settlement order is the order of the epochs' run records in
	// brood_runs (one stream, so its revisions order them), not that of the
	// subagent/end timestamps: an epoch's end is published after it
	// released its parent's ownership edge (docs/design.md §7), so a parent that
	// settles at once can stamp its end a moment before its child's.
	c, g := settledRun(t, s, childRun), settledRun(t, s, grandRun)
	if c.Revision <= g.Revision {
		t.Fatalf("the child's epoch %s settled at revision %d, before the grandchild's %s at %d: the child must settle only after it",
			childRun, c.Revision, grandRun, g.Revision)
	}
}

// onlyEpoch waits for child's subagent/end among parent's lifecycle events
// and returns the runId of its one epoch; more than one epoch fails.
func onlyEpoch(t *testing.T, s *stack.Stack, parent, child string) string {
	t.Helper()
	var starts, ends []string
	testutil.Eventually(t, 10*time.Second, func() bool {
		starts, ends = nil, nil
		for _, ev := range lifecycleOf(t, s, parent) {
			switch {
			case ev.ID != child:
			case ev.Type == protocol.LifecycleStart:
				starts = append(starts, ev.RunID)
			case ev.Type == protocol.LifecycleEnd:
				ends = append(ends, ev.RunID)
			}
		}
		return len(ends) > 0 && len(ends) == len(starts)
	}, "the subagent/end of %s", child)
	if len(starts) != 1 || !slices.Equal(starts, ends) {
		t.Fatalf("%s had epochs %v ending %v, want one", child, starts, ends)
	}
	return starts[0]
}

// settledRun returns the settled run record of runID.
func settledRun(t *testing.T, s *stack.Stack, runID string) store.Record[protocol.RunRecord] {
	t.Helper()
	rec, err := s.Store.Run(context.Background(), runID)
	if err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
	if rec.Value.State != protocol.RunSettled {
		t.Fatalf("run %s is %s, want settled", runID, rec.Value.State)
	}
	return rec
}

func TestFollowupAuthority(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	stranger := s.Root()
	start := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"g\",\"prompt\":\"say g\",\"run_in_background\":true}\nsay started")
	sibling := startCont(t, s, root.Ref(), "say sib")
	waitState(t, s, sibling.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	_, evs := s.Log(start.ChildID)
	before := len(evs)
	grand := ""
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Meta["childId"] != "" {
			grand = d.Meta["childId"]
		}
	}
	if grand == "" {
		t.Fatal("no grandchild")
	}
	user := grant(t, s)
	// A sibling and the grandchild act through their own tools, with their own
	// live credentials: neither is the child's parent.
	for name, actor := range map[string]string{"sibling": sibling.ChildID, "grandchild": grand} {
		followup(t, s, actor, user, "call send_message {\"subagent_id\":\""+start.ChildID+"\",\"message\":\"say hijack\"}")
		var res protocol.ToolResultData
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, aevs := s.Log(actor)
			for _, ev := range aevs {
				var d protocol.ToolResultData
				if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "send_message" {
					res = d
					return true
				}
			}
			return false
		}, "%s's send_message ran", name)
		if !res.IsError || !strings.Contains(protocol.PlainText(res.Content), "UNAUTHORIZED") {
			t.Fatalf("%s send_message = %+v", name, res)
		}
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
		{"forged parent credential", protocol.Authority{Parent: &protocol.ParentRef{SessionID: root.SessionID, Credential: "x"}}},
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
	items, err := testutil.InboxOf(t, s.Store, run.ChildID).Pending(context.Background(), 0)
	if err != nil {
		t.Fatalf("read the inbox of %s: %v", run.ChildID, err)
	}
	if len(items) != 0 {
		t.Fatal("a refused followup left an item in the inbox")
	}
}

func TestPendingItemsWithoutActivationAreResumed(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 200 * time.Millisecond })
	s.AddSpawnWorker()
	root := s.Root()
	start := startCont(t, s, root.Ref(), "say one")
	waitState(t, s, start.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	// An item accepted while no activation was live (a host died after the
	// inbox accepted it): nobody sends another followup.
	mid, _, err := s.Store.Enqueue(context.Background(), testutil.ScopeOf(t, s.Store, start.ChildID), start.ChildID, storeItem("say resumed"), "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(start.ChildID)
		claims, _, _ := turnsOf(evs)
		return len(claims) == 2 && claims[1] == mid
	}, "the pending item is claimed by a resumed activation")
}

func grant(t *testing.T, s *stack.Stack) protocol.Authority {
	t.Helper()
	g, err := s.Client.UserGrant(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return protocol.Authority{Grant: g.Grant}
}

func TestDrainScopes(t *testing.T) {
	// The liveness sweep, which would resume a drained child's queued work
	// if the drain did not hold it, runs every 100 ms, so the checks that
	// nothing resumes span many sweeps.
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = sweepInterval })
	s.AddSpawnWorker()
	ctx := context.Background()
	user := grant(t, s)
	long := "sleep 30s\nsay never"

	t.Run("children of one parent", func(t *testing.T) {
		root := s.Root()
		c1 := startCont(t, s, root.Ref(), long)
		c2 := startCont(t, s, root.Ref(), long)
		waitState(t, s, c1.ChildID, ref(root), protocol.StateRunning, 5*time.Second)
		p := root.Ref()
		r, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: protocol.Authority{Parent: &p}, Parent: root.SessionID, Children: []string{c1.ChildID}})
		if err != nil || len(r.Disposed) != 1 || r.Disposed[0] != c1.ChildID {
			t.Fatalf("drain = %+v, %v", r, err)
		}
		if st := state(t, s, c1.ChildID, ref(root)); st != protocol.StateNone {
			t.Fatalf("drained child is %s", st)
		}
		if st := state(t, s, c2.ChildID, ref(root)); st != protocol.StateRunning {
			t.Fatalf("the sibling was touched: %s", st)
		}
		// A stranger may not drain them.
		other := s.Root().Ref()
		if _, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: protocol.Authority{Parent: &other}, Parent: root.SessionID, Children: []string{c2.ChildID}}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("stranger drain = %v", err)
		}
	})

	t.Run("descendants of a parent", func(t *testing.T) {
		root := s.Root()
		elsewhere := s.Root()
		c := startCont(t, s, root.Ref(), "call subagent {\"description\":\"g\",\"prompt\":\"sleep 30s\",\"run_in_background\":true}\nsay started")
		unrelated := startCont(t, s, elsewhere.Ref(), long)
		waitState(t, s, c.ChildID, ref(root), protocol.StateWaiting, 5*time.Second)
		r, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: user, Parents: []string{root.SessionID}})
		if err != nil || len(r.Disposed) != 2 {
			t.Fatalf("drain = %+v, %v", r, err)
		}
		if r.Disposed[1] != c.ChildID {
			t.Fatalf("disposal order %v: the grandchild must go first", r.Disposed)
		}
		if st := state(t, s, unrelated.ChildID, ref(elsewhere)); st != protocol.StateRunning {
			t.Fatalf("an unrelated tree was touched: %s", st)
		}
		// Admission below the draining root answers DRAINING while it stays live.
		_, err = s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "x", Prompt: protocol.Text("say x")})
		if protocol.CodeOf(err) != protocol.CodeDraining {
			t.Fatalf("start below a draining root = %v", err)
		}
		// The durable session stays resumable from elsewhere (a grant, once the root is gone).
		_ = root.Close(ctx)
		followup(t, s, c.ChildID, user, "say back")
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, evs := s.Log(c.ChildID)
			_, answers, _ := turnsOf(evs)
			return len(answers) > 0 && answers[len(answers)-1] == "back"
		}, "resumed after the drain")
	})

	t.Run("everything", func(t *testing.T) {
		root := s.Root()
		a := startCont(t, s, root.Ref(), long)
		b := startCont(t, s, root.Ref(), long)
		queued := followup(t, s, b.ChildID, ref(root), "say queued")
		// Both first turns run (their prompts claimed) before the drain: a
		// prompt still unclaimed would stay queued, and after the lift its
		// 30 s turn would come first (issue 16, fault 6: a running activation
		// is not yet a running turn on a loaded machine).
		for _, id := range []string{a.ChildID, b.ChildID} {
			testutil.Eventually(t, 15*time.Second, func() bool {
				_, evs := s.Log(id)
				claims, _, _ := turnsOf(evs)
				return len(claims) == 1
			}, "the first turn of %s runs", id)
		}
		r, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: user})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, id := range r.Disposed {
			got[id] = true
		}
		if !got[a.ChildID] || !got[b.ChildID] {
			t.Fatalf("drain disposed %v", r.Disposed)
		}
		for _, id := range []string{a.ChildID, b.ChildID} {
			if st := state(t, s, id, ref(root)); st != protocol.StateNone {
				t.Fatalf("%s is %s after the drain", id, st)
			}
		}
		// Drains need a user grant.
		p := root.Ref()
		if _, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: protocol.Authority{Parent: &p}}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("drain without a grant = %v", err)
		}
		// Admission stays closed: no new child; a followup is accepted but
		// held, like the queued item, until the lift.
		if _, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "x", Prompt: protocol.Text("say x")}); protocol.CodeOf(err) != protocol.CodeDraining {
			t.Fatalf("start during a global drain = %v", err)
		}
		held, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: a.ChildID, Authority: ref(root), Message: protocol.Text("say held")})
		if err != nil || held.MessageID == "" || !strings.Contains(held.Held, "drain") {
			t.Fatalf("followup during a global drain = %+v, %v; want accepted and held", held, err)
		}
		testutil.Consistently(t, 20*sweepInterval, func() bool {
			for _, id := range []string{a.ChildID, b.ChildID} {
				_, evs := s.Log(id)
				if claims, _, _ := turnsOf(evs); len(claims) != 1 || state(t, s, id, ref(root)) != protocol.StateNone {
					return false
				}
			}
			return true
		}, "a drained child resumed its queued work while drained")
		// Lifted: the queued item, never dropped, runs now.
		if _, err := s.Client.Drain(ctx, protocol.DrainRequest{Authority: user, Lift: true}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 15*time.Second, func() bool {
			_, evs := s.Log(b.ChildID)
			claims, _, _ := turnsOf(evs)
			return len(claims) == 2 && claims[1] == queued
		}, "the queued item runs after the lift")
		testutil.Eventually(t, 15*time.Second, func() bool {
			_, evs := s.Log(a.ChildID)
			claims, _, _ := turnsOf(evs)
			return len(claims) == 2 && claims[1] == held.MessageID
		}, "the held followup runs after the lift")
	})
}

// sweepInterval is the liveness sweep's period in tests that check that a
// sweep does not resume work (20 of them pass in such a check).
const sweepInterval = 100 * time.Millisecond

func TestInterruptParksTheQueue(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = sweepInterval })
	s.AddSpawnWorker()
	root := s.Root()
	c := startCont(t, s, root.Ref(), "sleep 30s\nsay never")
	queued := followup(t, s, c.ChildID, ref(root), "say queued")
	testutil.Eventually(t, 5*time.Second, func() bool {
		_, evs := s.Log(c.ChildID)
		return len(evs) >= 4
	}, "the first turn runs")
	if _, err := s.Client.Interrupt(context.Background(), protocol.InterruptRequest{ChildID: c.ChildID, Authority: grant(t, s)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		_, evs := s.Log(c.ChildID)
		_, _, ends := turnsOf(evs)
		return len(ends) == 1
	}, "the turn is interrupted")
	// The queued message stays parked: nothing runs until the next send,
	// whether the activation re-checks its inbox or the sweep looks.
	testutil.Consistently(t, 20*sweepInterval, func() bool {
		_, evs := s.Log(c.ChildID)
		claims, _, _ := turnsOf(evs)
		return len(claims) == 1
	}, "the parked item was claimed before the next send")
	_, evs := s.Log(c.ChildID)
	claims, _, ends := turnsOf(evs)
	if len(claims) != 1 || ends[0] != protocol.TurnAborted {
		t.Fatalf("after the interrupt: claims %v ends %v", claims, ends)
	}
	if st := state(t, s, c.ChildID, ref(root)); st == protocol.StateNone {
		t.Fatal("the parked child settled and dropped its queue")
	}
	after := followup(t, s, c.ChildID, ref(root), "say after")
	waitState(t, s, c.ChildID, ref(root), protocol.StateNone, 10*time.Second)
	_, evs = s.Log(c.ChildID)
	claims, answers, _ := turnsOf(evs)
	if strings.Join(claims[1:], ",") != queued+","+after || strings.Join(answers, ",") != "queued,after" {
		t.Fatalf("claims %v answers %v: the parked item runs first, then the new one", claims, answers)
	}
}

// TestInterruptRefusesNonAncestorsWhetherOrNotTheChildRuns: another root's
// credential is refused on an idle child as on a running one (chaos seed 1
// found it answered {interrupted: false} as if it had authority), an
// unknown child answers the same UNAUTHORIZED (authority before existence,
// issue 17: a credential learns nothing about ids outside its subtree), and
// the parent's own interrupt of its idle child has nothing to stop.
func TestInterruptRefusesNonAncestorsWhetherOrNotTheChildRuns(t *testing.T) {
	s := contStack(t)
	owner, other := s.Root(), s.Root()
	c := startCont(t, s, owner.Ref(), "say idle")
	waitState(t, s, c.ChildID, ref(owner), protocol.StateNone, 10*time.Second)
	ctx := context.Background()
	if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: c.ChildID, Authority: ref(other)}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("another root interrupts an idle child: %v, want UNAUTHORIZED", err)
	}
	if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: "no-such-child", Authority: ref(owner)}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("interrupt of an unknown child: %v, want UNAUTHORIZED", err)
	}
	// A grant over every session learns that the id names nothing, as
	// continuable.state tells it (docs/protocol.md §5.11; issue 37, item 6:
	// it answered {interrupted: false}).
	if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: "no-such-child", Authority: grant(t, s)}); protocol.CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("interrupt of an unknown child with a grant over every session: %v, want NOT_FOUND", err)
	}
	if r, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: c.ChildID, Authority: grant(t, s)}); err != nil || r.Interrupted {
		t.Fatalf("a grant interrupts an idle child: %+v, %v; want nothing to stop", r, err)
	}
	r, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: c.ChildID, Authority: ref(owner)})
	if err != nil || r.Interrupted {
		t.Fatalf("the parent interrupts its idle child: %+v, %v; want nothing to stop", r, err)
	}
	busy := startCont(t, s, owner.Ref(), "sleep 30s\nsay busy")
	waitState(t, s, busy.ChildID, ref(owner), protocol.StateRunning, 10*time.Second)
	if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: busy.ChildID, Authority: ref(other)}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("another root interrupts a running child: %v, want UNAUTHORIZED", err)
	}
}

func TestDurabilityFailedWhenTheLogRefusesTheFinalFlush(t *testing.T) {
	s, m := meteredStack(t)
	ctx := context.Background()
	root := s.Root()
	// The turn sleeps long enough for the stream to be frozen before it ends,
	// even on a loaded machine (the wait below is a condition, this margin is
	// not one).
	c := startCont(t, s, root.Ref(), "sleep 3s\nsay done")
	testutil.Eventually(t, 20*time.Second, func() bool { _, evs := s.Log(c.ChildID); return len(evs) >= 3 }, "turn opened")
	// The log stream stops accepting writes; core NATS and the other streams stay up.
	logStream, err := s.Store.LogStream(ctx, testutil.ScopeOf(t, s.Store, c.ChildID))
	if err != nil {
		t.Fatal(err)
	}
	info, err := logStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.MaxMsgs = int64(info.State.Msgs)
	if _, err := s.Store.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var end protocol.LifecycleEvent
	testutil.Eventually(t, 40*time.Second, func() bool {
		for _, ev := range lifecycleOf(t, s, root.SessionID) {
			if ev.Type == protocol.LifecycleEnd && ev.ID == c.ChildID {
				end = ev
				return true
			}
		}
		return false
	}, "subagent/end")
	if end.StopReason != protocol.StopError || end.ErrorCode != protocol.CodeDurabilityFailed {
		t.Fatalf("end = %+v", end)
	}
	rec, err := s.Store.Run(ctx, end.RunID)
	if err != nil || rec.Value.Result.ErrorCode != protocol.CodeDurabilityFailed {
		t.Fatalf("epoch record = %+v, %v", rec.Value.Result, err)
	}
	// The host keeps the lease until it closed the turn the failure left
	// open, once the log takes writes again (TestDurabilityFailedEpochClosesItsTurnOnceTheLogTakesWrites).
	if _, err := store.Get[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", c.ChildID)); err != nil {
		t.Fatalf("the lease went before the open turn was closed: %v", err)
	}
	if _, err := s.Store.JS.UpdateStream(ctx, info.Config); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, c.ChildID, ref(root), protocol.StateNone, 30*time.Second)
	if _, err := store.Get[protocol.AgentRecord](ctx, s.Store.Agents, store.LeaseKey("spawn", c.ChildID)); err == nil {
		t.Fatal("the activation still holds its lease")
	}
	f := gathered(t, m)
	cont := []string{"provider", "spawn", "mode", protocol.ModeContinuable}
	wantSample(t, f, 1, "brood_runs_started_total", cont...)
	wantSample(t, f, 1, "brood_durability_failed_total", cont...)
	wantSample(t, f, 1, "brood_runs_settled_total", append(cont, "stop_reason", "error", "error_code", "DURABILITY_FAILED")...)
	wantSample(t, f, 1, "brood_delegation_start_duration_seconds_count", cont...)
	eventuallySample(t, m, 0, "brood_activations_live", "provider", "spawn")
}

func TestReportsAndListing(t *testing.T) {
	s := contStack(t)
	ctx := context.Background()
	root := s.Root()
	// The child starts a grandchild in the background, then the grandchild
	// reports to it and the child lists its own children.
	c := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"reporter\",\"prompt\":\"call report {\\\"output\\\":\\\"found it\\\"}\\nsay reported\",\"run_in_background\":true}\nsay started")
	waitState(t, s, c.ChildID, ref(root), protocol.StateNone, 15*time.Second)
	_, evs := s.Log(c.ChildID)
	var report, notice bool
	for _, ev := range evs {
		var d protocol.UserMessageData
		if ev.Type != protocol.EvUserMessage || ev.Decode(&d) != nil {
			continue
		}
		switch d.Source.Kind {
		case protocol.SourceSubagentReport:
			report = strings.Contains(protocol.PlainText(d.Content), "found it")
		case protocol.SourceSubagentSettled:
			notice = report // the report precedes the settlement notice
		}
	}
	if !report || !notice {
		t.Fatalf("report %v, notice after it %v", report, notice)
	}
	followup(t, s, c.ChildID, ref(root), "call list_agents {}\nsay listed")
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(c.ChildID)
		_, answers, _ := turnsOf(evs)
		return len(answers) > 0 && answers[len(answers)-1] == "listed"
	}, "list_agents ran")
	_, evs = s.Log(c.ChildID)
	var listing string
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "list_agents" {
			listing = protocol.PlainText(d.Content)
		}
	}
	if !strings.Contains(listing, "— reporter") || !strings.Contains(listing, "[ready]") {
		t.Fatalf("list_agents = %q", listing)
	}
	// A damaged child (events of its own logged, none a descriptor that
	// decodes) is a diagnostic row, not a failed list; a child whose start
	// never logged anything of its own is a refused start, listed as
	// not-started with its mode and provider (docs/protocol.md §5.14).
	for _, id := range []string{"DAMAGED", "NEVERSTARTED"} {
		h := protocol.SessionHeader{Version: 1, ID: id, CreatedAt: 1, ParentSession: root.SessionID, Origin: protocol.OriginSubagent}
		if err := s.Store.PutHeader(ctx, h); err != nil {
			t.Fatal(err)
		}
		if err := s.Store.PutChildIndex(ctx, root.SessionID, protocol.ChildIndexRecord{ChildID: id, CreatedAt: 1, Mode: protocol.ModeContinuable, Provider: "spawn"}); err != nil {
			t.Fatal(err)
		}
	}
	turn, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.NewLogWriter(protocol.ScopeRoot, "DAMAGED", 0, 0).Append(ctx, turn); err != nil {
		t.Fatal(err)
	}
	list, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: ref(root), Descendants: true})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, r := range list.Rows {
		kinds[r.ID] = r.Kind + "/" + r.Mode + r.Reason
		if r.ID == c.ChildID && (!r.HasChildren || r.Depth != 1) {
			t.Errorf("row of the child = %+v", r)
		}
	}
	if kinds[c.ChildID] != "child/continuable" || kinds["DAMAGED"] != "diagnostic/corrupt" ||
		kinds["NEVERSTARTED"] != "diagnostic/continuable"+protocol.DiagnosticNotStarted || len(list.Rows) != 4 {
		t.Fatalf("list.Rows = %+v", list.Rows)
	}
	// Only the parent (or the user) lists its children.
	stranger := s.Root()
	if _, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: ref(stranger)}); protocol.CodeOf(err) != protocol.CodeUnauthorized {
		t.Fatalf("stranger listing = %v", err)
	}
}

func TestSendMessageAndInterruptTools(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	// The child starts a slow grandchild, interrupts it, then sends it a
	// message, each through its own tool. They are separate turns of the
	// child: the interrupted grandchild settles at once (nothing queued), and
	// its settlement notice, joining the child's running turn at its next
	// step, ends that turn there (the scripted model answers the newest user
	// message), so a send in the same turn may never happen.
	c := startCont(t, s, root.Ref(),
		"call subagent {\"description\":\"slow\",\"prompt\":\"sleep 30s\\nsay never\",\"run_in_background\":true}\nsay started")
	waitState(t, s, c.ChildID, ref(root), protocol.StateWaiting, 20*time.Second)
	_, evs := s.Log(c.ChildID)
	grand := ""
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil {
			grand = d.Meta["childId"]
		}
	}
	defer func() {
		if t.Failed() {
			t.Logf("the child:%s\nthe grandchild:%s", explainLog(t, s, c.ChildID), explainLog(t, s, grand))
		}
	}()
	g := grant(t, s)
	followup(t, s, c.ChildID, g, "call interrupt_agent {\"agent_id\":\""+grand+"\"}\nsay interrupted")
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, gevs := s.Log(grand)
		ends := turnEndReasons(gevs)
		return len(ends) > 0
	}, "the grandchild's first turn ends")
	_, gevs := s.Log(grand)
	if end := turnEndReasons(gevs)[0]; end.Kind != protocol.TurnAborted || end.Cause != protocol.CauseParent {
		t.Fatalf("the grandchild's first turn ended %+v; the interrupt must abort it (cause parent)", end)
	}
	// The grandchild's settlement notice reaches the child after its turn
	// ends; the send waits until the child has taken it, or the notice
	// joins the send's turn and the scripted model answers it instead (the
	// flake "the grandchild ran the message its parent sent" under load).
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, evs := s.Log(c.ChildID)
		for _, ev := range evs {
			var d protocol.UserMessageData
			if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil && d.Source.Kind == protocol.SourceSubagentSettled && d.Source.SenderSessionID == grand {
				return true
			}
		}
		return false
	}, "the child takes the grandchild's settlement notice")
	followup(t, s, c.ChildID, g, "call send_message {\"subagent_id\":\""+grand+"\",\"message\":\"say woken\"}\nsay sent")
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, gevs := s.Log(grand)
		_, answers, _ := turnsOf(gevs)
		return len(answers) > 0 && answers[len(answers)-1] == "woken"
	}, "the grandchild ran the message its parent sent")
	waitState(t, s, c.ChildID, ref(root), protocol.StateNone, 20*time.Second)
}

// explainLog renders a session's events for a failure message: each event's
// type, with tool results, turn ends and messages, and its pending items.
func explainLog(t *testing.T, s *stack.Stack, id string) string {
	t.Helper()
	var b strings.Builder
	_, evs := s.Log(id)
	for _, ev := range evs {
		b.WriteString("\n  " + ev.Type)
		switch ev.Type {
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) == nil {
				fmt.Fprintf(&b, " %s error=%v %.200q", d.Name, d.IsError, protocol.PlainText(d.Content))
			}
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			if ev.Decode(&d) == nil {
				fmt.Fprintf(&b, " %+v", d.Reason)
			}
		case protocol.EvUserMessage:
			var d protocol.UserMessageData
			if ev.Decode(&d) == nil {
				fmt.Fprintf(&b, " %s %.120q", d.Source.Kind, protocol.PlainText(d.Content))
			}
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			if ev.Decode(&d) == nil {
				fmt.Fprintf(&b, " %.120q", protocol.PlainText(d.Message.Content))
			}
		}
	}
	items, err := testutil.InboxOf(t, s.Store, id).Pending(context.Background(), 0)
	fmt.Fprintf(&b, "\n  pending inbox items: %d (%v)", len(items), err)
	return b.String()
}

// turnEndReasons returns the reason of every turn/end of a log, in order.
func turnEndReasons(evs []protocol.SessionEvent) []protocol.TurnEndReason {
	var out []protocol.TurnEndReason
	for _, ev := range evs {
		var d protocol.TurnEndData
		if ev.Type == protocol.EvTurnEnd && ev.Decode(&d) == nil {
			out = append(out, d.Reason)
		}
	}
	return out
}

// TestInterruptRacesTheTurnAboutToRun (issue 16, fault 5): an interrupt
// answered {} takes effect on the turn running or about to run at that
// moment, also while the first message is being picked up, and a message
// sent after it returns always runs. Random delays (seeded; BROOD_TEST_SEED
// replays a run) separate the start, two followups and the interrupt, which
// comes before, between or after the followups. The first message's turn
// sleeps 3 s, so whenever the interrupt comes it is running or about to run:
// it must end aborted (cause user), and every other message must run once,
// in order: the parked followups first, then the one sent after.
func TestInterruptRacesTheTurnAboutToRun(t *testing.T) {
	s := contStack(t)
	root := s.Root()
	user := grant(t, s)
	seed := time.Now().UnixNano()
	if v := os.Getenv("BROOD_TEST_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("BROOD_TEST_SEED: %v", err)
		}
	}
	t.Logf("seed %d (BROOD_TEST_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	const iterations = 60
	type plan struct {
		interruptAfter int              // followups sent before the interrupt (0, 1 or 2)
		delays         [4]time.Duration // before each of: followup, followup, interrupt (in plan order), last message
	}
	plans := make([]plan, iterations)
	for i := range plans {
		plans[i].interruptAfter = rng.IntN(3)
		for j := range plans[i].delays {
			if rng.IntN(3) > 0 { // a third of the steps follow at once
				plans[i].delays[j] = time.Duration(rng.IntN(25)) * time.Millisecond
			}
		}
	}
	for i, p := range plans {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := startCont(t, s, root.Ref(), "sleep 3s\nsay one")
			want := []string{c.MessageID}
			step := 0
			for k, text := range []string{"say two", "say three"} {
				if k == p.interruptAfter {
					time.Sleep(p.delays[step])
					step++
					if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: c.ChildID, Authority: user}); err != nil {
						t.Fatalf("interrupt: %v", err)
					}
				}
				time.Sleep(p.delays[step])
				step++
				want = append(want, followup(t, s, c.ChildID, ref(root), text))
			}
			if p.interruptAfter == 2 {
				time.Sleep(p.delays[step])
				if _, err := s.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: c.ChildID, Authority: user}); err != nil {
					t.Fatalf("interrupt: %v", err)
				}
			}
			time.Sleep(p.delays[3])
			want = append(want, followup(t, s, c.ChildID, ref(root), "say after"))
			testutil.Eventually(t, 20*time.Second, func() bool {
				_, evs := s.Log(c.ChildID)
				claims, _, _ := turnsOf(evs)
				return len(claims) >= len(want) && len(turnEndReasons(evs)) >= len(want)
			}, "every message is claimed and its turn ends (plan %+v)", p)
			_, evs := s.Log(c.ChildID)
			claims, answers, _ := turnsOf(evs)
			ends := turnEndReasons(evs)
			if strings.Join(claims, ",") != strings.Join(want, ",") {
				t.Fatalf("plan %+v: claims %v, want %v", p, claims, want)
			}
			if ends[0].Kind != protocol.TurnAborted || ends[0].Cause != protocol.CauseUser {
				t.Fatalf("plan %+v: the first turn ended %+v; the interrupt must abort the turn running or about to run", p, ends[0])
			}
			if strings.Join(answers, ",") != "two,three,after" {
				t.Fatalf("plan %+v: answers %v, want two,three,after", p, answers)
			}
		})
	}
}
