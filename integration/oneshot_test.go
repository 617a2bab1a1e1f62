package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// notices counts run notifications published under test.notify.<tag>.<i>.
type notices struct {
	mu   sync.Mutex
	byID map[string][]protocol.RunNotice
	sub  *nats.Subscription
}

func watchNotices(t *testing.T, nc *nats.Conn, tag string) *notices {
	t.Helper()
	n := &notices{byID: map[string][]protocol.RunNotice{}}
	sub, err := nc.Subscribe("test.notify."+tag+".*", func(m *nats.Msg) {
		var rn protocol.RunNotice
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &rn); err != nil {
			t.Errorf("bad notice: %v", err)
			return
		}
		n.mu.Lock()
		n.byID[rn.RunID] = append(n.byID[rn.RunID], rn)
		n.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	n.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return n
}

func (n *notices) get(runID string) []protocol.RunNotice {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]protocol.RunNotice(nil), n.byID[runID]...)
}

func (n *notices) total() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, v := range n.byID {
		c += len(v)
	}
	return c
}

// startRaw sends runs.start with a notify subject of the test's own.
func startRaw(t *testing.T, s *stack.Stack, parent protocol.ParentRef, prompt, notify string) protocol.RunStartReply {
	t.Helper()
	var reply protocol.RunStartReply
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: "spawn", Parent: parent, Prompt: protocol.Text(prompt), Notify: notify,
	}, &reply)
	if err != nil {
		t.Fatalf("runs.start: %v", err)
	}
	return reply
}

// endEvents counts subagent/end events per run id under parent.
func endEvents(t *testing.T, s *stack.Stack, parent string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, ev := range s.Lifecycle(parent) {
		if ev.Type == protocol.LifecycleEnd {
			out[ev.RunID]++
		}
	}
	return out
}

func TestConcurrentRunsOnReplicas(t *testing.T) {
	const runs = 200
	s := stack.New(t)
	// All 200 children of one root may be live at once: the limit must not
	// refuse any (the default 64 would, now that concurrent starts respect it).
	roomy := func(c *coordinatorConfig) { c.LiveChildrenMax = runs }
	s.AddCoordinator(roomy)
	s.AddCoordinator(roomy)
	s.AddSpawnWorker()
	s.AddSpawnWorker()
	testutil.Eventually(t, 5*time.Second, func() bool {
		r, err := s.Client.Providers(context.Background())
		return err == nil && r.Instances["spawn"] == 2
	}, "two spawn instances")
	root := s.Root()
	n := watchNotices(t, s.NC, "conc")
	replies := make([]protocol.RunStartReply, runs)
	var wg sync.WaitGroup
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = startRaw(t, s, root.Ref(), fmt.Sprintf("say run-%d", i), fmt.Sprintf("test.notify.conc.%d", i))
		}()
	}
	wg.Wait()
	testutil.Eventually(t, 60*time.Second, func() bool { return n.total() >= runs }, "%d notices", runs)
	hosts := map[string]int{}
	for i, r := range replies {
		got := n.get(r.RunID)
		if len(got) != 1 {
			t.Fatalf("run %d got %d notices", i, len(got))
		}
		res := got[0].Result
		if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != fmt.Sprintf("run-%d", i) {
			t.Fatalf("run %d result = %+v", i, res)
		}
		rec, err := s.Store.Run(context.Background(), r.RunID)
		if err != nil || rec.Value.State != protocol.RunSettled {
			t.Fatalf("run record %d = %+v, %v", i, rec, err)
		}
		hosts[rec.Value.SettledBy]++
	}
	if len(hosts) != 2 {
		t.Errorf("runs were settled by %v; both workers should have served", hosts)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(endEvents(t, s, root.SessionID)) == runs }, "end events")
	for id, c := range endEvents(t, s, root.SessionID) {
		if c != 1 {
			t.Fatalf("run %s has %d subagent/end events", id, c)
		}
	}
	// Nothing more arrives later: every run was completed exactly once.
	testutil.Consistently(t, time.Second, func() bool { return n.total() == runs }, "%d notices for %d runs", n.total(), runs)
}

// lastTurnEnd decodes the last event of a log, which must be a turn/end.
func lastTurnEnd(t *testing.T, evs []protocol.SessionEvent) protocol.TurnEndData {
	t.Helper()
	last := evs[len(evs)-1]
	var d protocol.TurnEndData
	if last.Type != protocol.EvTurnEnd || last.Decode(&d) != nil {
		t.Fatalf("log ends with %s", last.Type)
	}
	return d
}

// TestWorkerKilledMidRunIsSettledHostLost: the only spawn worker is killed
// in the middle of a one-shot child's turn; no instance can continue the
// run, so after the coordinator's ContinueWaitMax it ends HOST_LOST, once.
func TestWorkerKilledMidRunIsSettledHostLost(t *testing.T) {
	s := stack.New(t)
	m := telemetry.NewMetrics("test")
	coord := s.AddCoordinator(func(c *coordinatorConfig) { c.Metrics = m })
	w := spawnWorkerProc(t, s.Server.ClientURL())
	s.WaitProvider("spawn")
	root := s.Root()
	n := watchNotices(t, s.NC, "kill")
	r := startRaw(t, s, root.Ref(), "call list_dir {}\nsleep 30s\nsay never", "test.notify.kill.1")
	testutil.Eventually(t, 5*time.Second, func() bool { _, evs := s.Log(r.ChildID); return len(evs) >= 7 }, "first step logged")

	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	testutil.Eventually(t, stack.HostExpiry+5*time.Second, func() bool { return len(n.get(r.RunID)) > 0 }, "HOST_LOST settlement")
	if d := time.Since(killed); d > stack.HostExpiry+stack.ContinueWaitMax+3*time.Second {
		t.Errorf("settled %s after the kill; expected within the expiry and the wait for an instance, plus a margin", d)
	}
	res := n.get(r.RunID)[0].Result
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeHostLost {
		t.Fatalf("result = %+v", res)
	}
	rec, _ := s.Store.Run(context.Background(), r.RunID)
	if rec.Value.SettledBy != coord.ID() {
		t.Fatalf("settled by %q, want coordinator %s", rec.Value.SettledBy, coord.ID())
	}
	_, evs := s.Log(r.ChildID)
	if end := lastTurnEnd(t, evs); end.Reason.Kind != protocol.TurnInterrupted {
		t.Fatalf("turn end = %+v", end)
	}
	// With no other instance of spawn, the run waited for one to continue
	// it (issue 31, item 2): the takeover fenced the log and left the turn
	// open, and closed it once ContinueWaitMax had passed.
	if fence := evs[len(evs)-2]; fence.Type != protocol.EvAgentTakeover || evs[len(evs)-1].Time-fence.Time < stack.ContinueWaitMax.Milliseconds() {
		t.Fatalf("the log ends %s at %d, turn/end at %d; want agent/takeover, then the turn's end at least %s later", fence.Type, fence.Time, evs[len(evs)-1].Time, stack.ContinueWaitMax)
	}
	if !strings.Contains(res.Diagnostic, "(ContinueWaitMax, brood coordinator --continue-wait-max)") {
		t.Errorf("diagnostic %q does not say that no instance continued the run in time, naming the bound and its flag", res.Diagnostic)
	}
	// A second settlement would come from another party racing the takeover
	// (TestSettlement* in internal/worker and services/coordinator contend
	// for it); here nothing may arrive later.
	testutil.Consistently(t, time.Second, func() bool {
		return len(n.get(r.RunID)) == 1 && endEvents(t, s, root.SessionID)[r.RunID] == 1
	}, "settled once")
	if len(n.get(r.RunID)) != 1 || endEvents(t, s, root.SessionID)[r.RunID] != 1 {
		t.Fatalf("settled more than once: %d notices, %d end events", len(n.get(r.RunID)), endEvents(t, s, root.SessionID)[r.RunID])
	}
	if _, err := store.Get[protocol.AgentRecord](context.Background(), s.Store.Agents, store.LeaseKey("spawn", r.ChildID)); err == nil {
		t.Error("the lease of the settled session is still held")
	}
	// The coordinator that took the session over counts it (the killed
	// worker counted nothing: it had no metrics, and it is gone).
	f := gathered(t, m)
	one := []string{"provider", "spawn", "mode", protocol.ModeOneShot}
	wantSample(t, f, 1, "brood_runs_started_total", one...)
	wantSample(t, f, 1, "brood_takeovers_total", "mode", protocol.ModeOneShot)
	wantSample(t, f, 1, "brood_host_lost_total", one...)
	wantSample(t, f, 1, "brood_runs_settled_total", append(one, "stop_reason", "error", "error_code", "HOST_LOST")...)
	wantSample(t, f, 1, "brood_delegation_duration_seconds_count", one...)
}

func TestWorkerPausedPastExpiryPublishesNothing(t *testing.T) {
	s := stack.New(t)
	coord := s.AddCoordinator()
	w := spawnWorkerProc(t, s.Server.ClientURL())
	s.WaitProvider("spawn")
	root := s.Root()
	n := watchNotices(t, s.NC, "pause")
	r := startRaw(t, s, root.Ref(), "sleep 3s\nsay late", "test.notify.pause.1")

	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, stack.HostExpiry+5*time.Second, func() bool { return len(n.get(r.RunID)) > 0 }, "HOST_LOST settlement")
	res := n.get(r.RunID)[0].Result
	if res.StopReason != protocol.StopError || res.ErrorCode != protocol.CodeHostLost {
		t.Fatalf("result = %+v", res)
	}
	rec, _ := s.Store.Run(context.Background(), r.RunID)
	if rec.Value.SettledBy != coord.ID() {
		t.Fatalf("settled by %q, want the coordinator", rec.Value.SettledBy)
	}
	_, before := s.Log(r.ChildID)
	if end := lastTurnEnd(t, before); end.Reason.Kind != protocol.TurnInterrupted {
		t.Fatalf("turn end = %+v", end)
	}

	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The resumed worker notices it lost the session and stops the agent.
	w.waitStderr(t, "agent stopped without publishing", 10*time.Second)
	_, after := s.Log(r.ChildID)
	if len(after) != len(before) {
		t.Fatalf("the resumed worker appended %d events", len(after)-len(before))
	}
	testutil.Consistently(t, time.Second, func() bool {
		return len(n.get(r.RunID)) == 1 && endEvents(t, s, root.SessionID)[r.RunID] == 1
	}, "published once")
	if len(n.get(r.RunID)) != 1 || endEvents(t, s, root.SessionID)[r.RunID] != 1 {
		t.Fatalf("published again: %d notices, %d end events", len(n.get(r.RunID)), endEvents(t, s, root.SessionID)[r.RunID])
	}
	// The worker is alive again and serves new runs.
	_, res2, err := s.Run(root.Ref(), "spawn", "say again", protocol.StartOptions{})
	if err != nil || protocol.PlainText(res2.Output) != "again" {
		t.Fatalf("run after resume = %+v, %v", res2, err)
	}
	if strings.Contains(w.Stderr(), "panic") {
		t.Fatal("worker panicked")
	}
}

// lifecycleOf reads every lifecycle event under parent.
func lifecycleOf(t *testing.T, s *stack.Stack, parent string) []protocol.LifecycleEvent {
	t.Helper()
	return s.Lifecycle(parent)
}
