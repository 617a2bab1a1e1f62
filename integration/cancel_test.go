package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// timedModel is the scripted model recording when each request was made and
// for which task (the text of its first user message), so a test can tell
// whether a session asked its model anything after a point in time.
type timedModel struct {
	model.Model
	mu    sync.Mutex
	calls []timedCall
	// before, when set, runs before a recorded request is passed on: a test
	// holds a session's request there until a condition holds.
	before func(ctx context.Context, task string)
}

type timedCall struct {
	at    time.Time
	first string
}

func (m *timedModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	m.mu.Lock()
	first := firstUserText(req)
	m.calls = append(m.calls, timedCall{at: time.Now(), first: first})
	before := m.before
	m.mu.Unlock()
	if before != nil {
		before(ctx, first)
	}
	return m.Model.Stream(ctx, req, onText)
}

// holdBefore sets the model's before hook.
func (m *timedModel) holdBefore(f func(ctx context.Context, task string)) {
	m.mu.Lock()
	m.before = f
	m.mu.Unlock()
}

// requests counts the requests for task made after since.
func (m *timedModel) requests(task string, since time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.calls {
		if c.first == task && c.at.After(since) {
			n++
		}
	}
	return n
}

// backgroundCall is a scripted `call subagent` line that starts prompt as a
// continuable child in the background.
func backgroundCall(t *testing.T, label, prompt string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"description": label, "prompt": prompt, "run_in_background": true})
	if err != nil {
		t.Fatal(err)
	}
	return "call subagent " + string(b)
}

// slowWork is a script of n steps, each a model request that waits d and
// then lists the workspace.
func slowWork(n int, d time.Duration, last string) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString("sleep " + d.String() + "\ncall list_dir {}\n")
	}
	return b.String() + "say " + last
}

// childrenOf returns the ids of parent's children (its child index).
func childrenOf(t *testing.T, s *stack.Stack, parent string) []string {
	t.Helper()
	idx, err := s.Store.ChildIndex(context.Background(), parent)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range idx {
		out = append(out, e.ChildID)
	}
	return out
}

func leaseOf(t *testing.T, s *stack.Stack, id string) (protocol.AgentRecord, bool) {
	t.Helper()
	rec, err := store.Get[protocol.AgentRecord](context.Background(), s.Store.Agents, store.LeaseKey("spawn", id))
	if errors.Is(err, store.ErrNotFound) {
		return protocol.AgentRecord{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.Value, true
}

// settlementNoticesFrom counts the events of evs about a settlement notice
// of sender: its enqueue, its claim as a user message.
func settlementNoticesFrom(evs []protocol.SessionEvent, sender string) int {
	n := 0
	for _, ev := range evs {
		var e protocol.InboxEnqueueData
		var u protocol.UserMessageData
		switch {
		case ev.Type == protocol.EvInboxEnqueue && ev.Decode(&e) == nil:
			if e.Source.Kind == protocol.SourceSubagentSettled && e.Source.SenderSessionID == sender {
				n++
			}
		case ev.Type == protocol.EvUserMessage && ev.Decode(&u) == nil:
			if u.Source.Kind == protocol.SourceSubagentSettled && u.Source.SenderSessionID == sender {
				n++
			}
		}
	}
	return n
}

// cancelStack is a coordinator (fast liveness sweep, so a resume would show
// quickly) and a spawn worker on a timed scripted model.
func cancelStack(t *testing.T) (*stack.Stack, *timedModel) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LivenessInterval = 100 * time.Millisecond })
	m := &timedModel{Model: model.NewScripted()}
	s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.Models = func() (model.Model, error) { return m, nil } })
	return s, m
}

// TestCancellingARunReachesEveryDescendant is issue 14, item 8: a one-shot
// run whose script starts a background subagent (which starts one of its
// own), each doing slow steps, is disposed (what Ctrl-C of `brood run`
// does). Once the dispose is answered every descendant has ended `aborted`
// (cause parent), the grandchild before the child, and none of them makes a
// model request or runs a tool again; the grandchild's end gives the child
// no settlement notice (no work for a session the same end disposes);
// nothing resumes them, and a followup to one is refused.
func TestCancellingARunReachesEveryDescendant(t *testing.T) {
	s, m := cancelStack(t)
	root := s.Root()
	// Work enough for the dispose to find both still working on a loaded
	// machine (about 9 s each, under the 64 steps of a turn; the dispose cuts it short): with 3 s, a
	// dispose that took that long under load met a turn already completed.
	grandchild := slowWork(60, 150*time.Millisecond, "grandchild done")
	child := backgroundCall(t, "grandchild", grandchild) + "\n" + slowWork(60, 150*time.Millisecond, "child done")
	parent := backgroundCall(t, "child", child) + "\nsleep 30s\nsay parent done"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text(parent), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		return m.requests(child, time.Time{}) >= 2 && m.requests(grandchild, time.Time{}) >= 2
	}, "the child and the grandchild are working")
	st, err := run.Dispose(ctx)
	acked := time.Now()
	if err != nil || st.Result == nil || st.Result.StopReason != protocol.StopAborted {
		t.Fatalf("dispose: %+v %v", st, err)
	}
	kids := childrenOf(t, s, run.ChildID)
	if len(kids) != 1 {
		t.Fatalf("the run has children %v", kids)
	}
	c := kids[0]
	grand := childrenOf(t, s, c)
	if len(grand) != 1 {
		t.Fatalf("the child has children %v", grand)
	}
	g := grand[0]
	// Already when the dispose was answered: both ended, aborted by their parent.
	for _, id := range []string{g, c} {
		if l, live := leaseOf(t, s, id); live {
			t.Fatalf("%s still has a lease after the dispose was answered: %+v", id, l)
		}
		_, evs := s.Log(id)
		if r := acpTurnEnd(t, evs); r.Kind != protocol.TurnAborted || r.Cause != protocol.CauseParent {
			t.Fatalf("%s's last turn ended %+v, want aborted by its parent", id, r)
		}
	}
	// The grandchild's end, caused by the run's, gave the child (disposed by
	// the same end) no settlement notice: a notice joining the child's turn
	// at its next step gave it work before its dispose came, and its turn
	// completed instead of ending aborted.
	_, cl := s.Log(c)
	if n := settlementNoticesFrom(cl, g); n > 0 {
		t.Fatalf("the child's log shows %d events of the grandchild's settlement notice: %s", n, eventTypes(cl))
	}
	// Child first: the grandchild's epoch ended before the child's.
	var ends []string
	for _, ev := range s.Lifecycle("*") {
		if ev.Type == protocol.LifecycleEnd && (ev.ID == c || ev.ID == g) {
			ends = append(ends, ev.ID)
			if ev.StopReason != protocol.StopAborted {
				t.Fatalf("subagent/end of %s: %s", ev.ID, ev.StopReason)
			}
		}
	}
	if !slices.Equal(ends, []string{g, c}) {
		t.Fatalf("subagent/end order %v, want grandchild %s then child %s", ends, g, c)
	}
	_, cevs := s.Log(c)
	_, gevs := s.Log(g)

	// A message that reaches the child's inbox after its ancestor ended (as
	// a start racing with the end would leave) is discarded, never run.
	mid, _, err := s.Store.Enqueue(ctx, testutil.ScopeOf(t, s.Store, c), c, store.InboxItem{Content: protocol.Text("say resumed"),
		Source: protocol.MessageSource{Kind: protocol.SourceUser}, Delivery: store.DeliveryNextTurn}, "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(c)
		for _, ev := range evs[len(cevs):] {
			var d protocol.InboxDiscardData
			if ev.Type == protocol.EvInboxDiscard && ev.Decode(&d) == nil && d.MessageID == mid && strings.Contains(d.Reason, "ended") {
				return true
			}
		}
		return false
	}, "the late message was discarded")
	// A followup with a user grant is refused.
	_, err = s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: c, Authority: grant(t, s), Message: protocol.Text("say again")})
	if protocol.CodeOf(err) != protocol.CodeNotResumable || !strings.Contains(err.Error(), run.ChildID) {
		t.Fatalf("followup after the run ended: %v, want NOT_RESUMABLE naming the run", err)
	}

	// Watch for as long as their scripts still had work (and many liveness
	// sweeps): absence of work has no event to wait for, so the window is
	// bounded instead. Neither asks its model anything nor runs a tool.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if n := m.requests(child, acked) + m.requests(grandchild, acked) + m.requests("say resumed", acked); n > 0 {
			t.Fatalf("%d model requests of descendants after the dispose was answered", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, evs := s.Log(g)
	if len(evs) != len(gevs) {
		t.Fatalf("the grandchild's log grew after the dispose was answered: %s", eventTypes(evs[len(gevs):]))
	}
	_, evs = s.Log(c)
	for _, ev := range evs[len(cevs):] {
		if ev.Type == protocol.EvStepStart || ev.Type == protocol.EvToolCall || ev.Type == protocol.EvTurnStart {
			t.Fatalf("the child worked after the dispose was answered: %s", eventTypes(evs[len(cevs):]))
		}
	}
}

// TestARunsEndDisposesItsBackgroundChildren: the rule holds for every end of
// a one-shot run, not only a cancel: a run that completes while its
// background child works has the child disposed before its result settles.
func TestARunsEndDisposesItsBackgroundChildren(t *testing.T) {
	s, m := cancelStack(t)
	root := s.Root()
	child := slowWork(50, 100*time.Millisecond, "child done")
	parent := backgroundCall(t, "child", child) + "\nsay parent done"
	// The parent's last request (the one that ends the run) waits until the
	// child works: a fixed sleep there let the run end, on a loaded
	// machine, before the child's turn began, and the child then had no
	// turn to abort.
	m.holdBefore(func(ctx context.Context, task string) {
		if task != parent || m.requests(parent, time.Time{}) < 2 {
			return
		}
		deadline := time.Now().Add(20 * time.Second)
		for m.requests(child, time.Time{}) < 2 && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	})
	run, res, err := s.Run(root.Ref(), "spawn", parent, protocol.StartOptions{})
	settled := time.Now()
	if err != nil || res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "parent done" {
		t.Fatalf("result %+v %v", res, err)
	}
	if n := m.requests(child, time.Time{}); n < 2 {
		t.Fatalf("the child made %d model requests before its parent's end, want it working (2)", n)
	}
	kids := childrenOf(t, s, run.ChildID)
	if len(kids) != 1 {
		t.Fatalf("children %v", kids)
	}
	if l, live := leaseOf(t, s, kids[0]); live {
		t.Fatalf("the child still has a lease after its parent's result: %+v", l)
	}
	_, evs := s.Log(kids[0])
	if r := acpTurnEnd(t, evs); r.Kind != protocol.TurnAborted || r.Cause != protocol.CauseParent {
		t.Fatalf("the child's turn ended %+v", r)
	}
	if n := m.requests(child, settled); n > 0 {
		t.Fatalf("%d model requests of the child after its parent's result", n)
	}
}

// TestCancelReachesAChildBeingCreated: the run is disposed while its
// background child's activation is still being created (its provider is
// stuck composing it). The child never makes a model request: the dispose
// that reaches its host before the activation exists is caught when the
// activation starts.
func TestCancelReachesAChildBeingCreated(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LivenessInterval = 100 * time.Millisecond })
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	slow := &timedModel{Model: model.NewScripted()}
	s.AddInProcessWorker(worker.InProcessDescriptor("slow", false), func(c *worker.InProcessConfig) {
		c.Models = func() (model.Model, error) {
			once.Do(func() { close(entered); <-release })
			return slow, nil
		}
	})
	s.AddSpawnWorker(func(c *worker.InProcessConfig) { c.SubagentProvider = "slow" })
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text(backgroundCall(t, "child", "say I should never run") + "\nsleep 30s\nsay parent done"), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the child's activation was never composed")
	}
	st, err := run.Dispose(ctx)
	if err != nil || st.Result == nil || st.Result.StopReason != protocol.StopAborted {
		t.Fatalf("dispose: %+v %v", st, err)
	}
	close(release)
	kids := childrenOf(t, s, run.ChildID)
	if len(kids) != 1 {
		t.Fatalf("children %v", kids)
	}
	c := kids[0]
	// The activation finishes its creation, finds its parent's run ended,
	// and settles without a turn; whatever reached its inbox is discarded.
	testutil.Eventually(t, 20*time.Second, func() bool {
		if _, live := leaseOf(t, s, c); live {
			return false
		}
		items, err := testutil.InboxOf(t, s.Store, c).Pending(ctx, 0)
		return err == nil && len(items) == 0
	}, "the child being created ended with nothing pending")
	deadline := time.Now().Add(time.Second) // several liveness sweeps
	for time.Now().Before(deadline) {
		if n := slow.requests("say I should never run", time.Time{}); n > 0 {
			t.Fatalf("the child made %d model requests", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, evs := s.Log(c)
	for _, ev := range evs {
		if ev.Type == protocol.EvTurnStart {
			t.Fatalf("the child ran a turn: %s", eventTypes(evs))
		}
	}
}

// TestInterruptingBroodRunStopsItsBackgroundChild is the issue's own input
// (issue 14, item 8): `brood run` of a script that starts a background
// subagent doing slow steps, interrupted (SIGINT) once the child works. The
// run ends aborted, and by the time `brood run` exited the child has ended
// too and makes no model request afterwards.
func TestInterruptingBroodRunStopsItsBackgroundChild(t *testing.T) {
	s, m := cancelStack(t)
	// About 9 s of work (as in TestCancellingARunReachesEveryDescendant):
	// SIGINT, brood run's dispose and the cascade must reach the child's
	// turn before it completes on its own, on a loaded machine too.
	child := slowWork(60, 150*time.Millisecond, "child done")
	script := backgroundCall(t, "slow child", child) + "\nsleep 30s\nsay parent done"
	cmd := exec.Command(broodBin, "run", "--nats", s.Server.ClientURL(), "--provider", "spawn", script)
	cmd.Dir = t.TempDir()
	var stderr strings.Builder
	cmd.Stderr = &lockedBuilder{b: &stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	testutil.Eventually(t, 20*time.Second, func() bool { return m.requests(child, time.Time{}) >= 2 }, "the background child works")
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("brood run did not exit after SIGINT; stderr:\n%s", stderr.String())
	}
	done := time.Now()
	if err == nil || !strings.Contains(stderr.String(), "aborted") {
		t.Fatalf("brood run: %v, stderr:\n%s", err, stderr.String())
	}
	var parent string
	for _, ev := range s.Lifecycle("*") {
		if ev.Type == protocol.LifecycleStart && ev.Mode == protocol.ModeOneShot {
			parent = ev.ID
		}
	}
	kids := childrenOf(t, s, parent)
	if len(kids) != 1 {
		t.Fatalf("the run %s has children %v", parent, kids)
	}
	if l, live := leaseOf(t, s, kids[0]); live {
		t.Fatalf("the background child is still live after brood run exited: %+v", l)
	}
	_, evs := s.Log(kids[0])
	if r := acpTurnEnd(t, evs); r.Kind != protocol.TurnAborted || r.Cause != protocol.CauseParent {
		t.Fatalf("the child's turn ended %+v", r)
	}
	deadline := time.Now().Add(time.Second) // the child's script had seconds of work left
	for time.Now().Before(deadline) {
		if n := m.requests(child, done); n > 0 {
			t.Fatalf("the child made %d model requests after brood run exited", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
