package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestAOneShotRunContinuesOnAnotherWorkerAfterItsHostIsKilled (issue 31,
// item 2, the first acceptance point): a one-shot child's worker is killed
// (SIGKILL) in the middle of its turn, with two calls of its second step in
// flight (their results are logged together, once both are done):
// read_file (idempotent) and run_command (not idempotent, a sleep of 30
// s). A second worker is live. The run completes on it with the same runId and its parent gets
// the result; the log holds each completed step once (one step/start per
// step, one result per call, one turn); read_file is run again (its result
// holds what the file says after the first worker died), run_command is
// reported to the model as
// interrupted by a host loss; the run record and its one subagent/end
// count one takeover.
func TestAOneShotRunContinuesOnAnotherWorkerAfterItsHostIsKilled(t *testing.T) {
	continuesAfterKill(t, "spawn", 0)
}

// TestAForkChildContinuesOnAnotherWorkerAfterItsHostIsKilled (issue 31,
// item 2: "the same for a fork child"): the run of the previous test on the
// fork provider, its child seeded with two completed turns of its
// parent's: its fork worker is killed in the middle of its own turn and
// the run completes on the other fork worker as the spawn child's does;
// the seed stays as it was and each of the child's own steps is logged
// once.
func TestAForkChildContinuesOnAnotherWorkerAfterItsHostIsKilled(t *testing.T) {
	continuesAfterKill(t, "fork", 2)
}

// continuesAfterKill runs the scenario of
// TestAOneShotRunContinuesOnAnotherWorkerAfterItsHostIsKilled on provider
// (spawn-worker or fork-worker processes), the root's log holding
// seedTurns completed turns first (a fork child's seed).
func continuesAfterKill(t *testing.T, provider string, seedTurns int) {
	s := stack.New(t)
	coord := s.AddCoordinator(func(c *coordinatorConfig) { c.ContinueWaitMax = 20 * time.Second })
	worker := func() *proc {
		return startProc(t, provider+"-worker", "--nats", s.Server.ClientURL(), "--log-level", "info", "--model", "scripted",
			"--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String(), "--workspace-root", "/")
	}
	w1 := worker()
	s.WaitProvider(provider)
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe.txt")
	if err := os.WriteFile(probe, []byte("before the loss"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := s.Root(dir)
	if seedTurns > 0 {
		parentHistory(t, s, root, seedTurns, false)
	}
	n := watchNotices(t, s.NC, "cont")
	script := "call list_dir {}\nsleep 0s\n" +
		`call read_file {"path":"probe.txt"}` + "\n" + `call run_command {"command":"sleep 30"}` + "\nsay done"
	var r protocol.RunStartReply
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{
		Provider: provider, Parent: root.Ref(), Prompt: protocol.Text(script), Notify: "test.notify.cont.1",
		Options: protocol.StartOptions{AutoApprove: []string{"run_command"}},
	}, &r); err != nil {
		t.Fatalf("runs.start: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		h, evs := s.Log(r.ChildID)
		return countOf(ownOf(h, evs), protocol.EvToolCall) == 3
	}, "the second step's calls logged")
	first, err := s.Store.Run(ctx, r.RunID)
	if err != nil || first.Value.HostID == "" {
		t.Fatalf("run record %+v, %v", first.Value, err)
	}
	// The second worker comes up only now, so the first one took the run.
	worker()
	testutil.Eventually(t, 10*time.Second, func() bool {
		p, err := s.Client.Providers(ctx)
		return err == nil && p.Instances[provider] == 2
	}, "two instances of %s", provider)

	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-w1.done
	// Written after the first worker died and before its expiry passed: a
	// read_file result that says it was run after the loss.
	if err := os.WriteFile(probe, []byte("after the loss"), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return len(n.get(r.RunID)) > 0 }, "the parent's notice")
	res := n.get(r.RunID)[0].Result
	if res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "done" {
		t.Fatalf("result = %+v; want completed with done", res)
	}
	rec, err := s.Store.Run(ctx, r.RunID)
	if err != nil || rec.Value.State != protocol.RunSettled || rec.Value.Takeovers != 1 ||
		rec.Value.SettledBy == first.Value.HostID || rec.Value.SettledBy == coord.ID() || !strings.HasPrefix(rec.Value.SettledBy, provider+".") {
		t.Fatalf("run record %+v, %v; want it settled by the second worker, with one takeover", rec.Value, err)
	}
	h, all := s.Log(r.ChildID)
	if h.SeedLength != int64(6*seedTurns) {
		t.Fatalf("seedLength = %d; want %d", h.SeedLength, 6*seedTurns)
	}
	if err := sessionlog.ValidateReplay(all, false); err != nil {
		t.Fatalf("the continued log does not replay: %v", err)
	}
	evs := ownOf(h, all)
	if c := countOf(evs, protocol.EvTurnStart); c != 1 || countOf(evs, protocol.EvTurnEnd) != 1 || countOf(evs, protocol.EvAgentTakeover) != 1 {
		t.Fatalf("%d turn/start, %d turn/end, %d agent/takeover; want one each: %v", c, countOf(evs, protocol.EvTurnEnd), countOf(evs, protocol.EvAgentTakeover), eventTypes(evs))
	}
	steps := map[int64]int{}
	results := map[string][]protocol.ToolResultData{}
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvStepStart:
			var d protocol.StepData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			steps[d.Step]++
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			results[d.Name] = append(results[d.Name], d)
		}
	}
	if len(steps) != 3 || steps[1] != 1 || steps[2] != 1 || steps[3] != 1 {
		t.Errorf("steps logged %v; want steps 1-3 once each", steps)
	}
	if len(results["list_dir"]) != 1 || len(results["read_file"]) != 1 || len(results["run_command"]) != 1 {
		t.Fatalf("results %v; want one per call", results)
	}
	if d := results["read_file"][0]; d.IsError || protocol.PlainText(d.Content) != "after the loss" {
		t.Errorf("read_file's result = %+v; want it run again after the loss", d)
	}
	if d := results["run_command"][0]; !d.IsError || !strings.Contains(protocol.PlainText(d.Content), "may or may not have taken effect") {
		t.Errorf("run_command's result = %+v; want it reported interrupted by a host loss", d)
	}
	testutil.Consistently(t, time.Second, func() bool {
		return len(n.get(r.RunID)) == 1 && endEvents(t, s, root.SessionID)[r.RunID] == 1
	}, "settled once")
	for _, ev := range s.Lifecycle(root.SessionID) {
		if ev.Type == protocol.LifecycleEnd && ev.RunID == r.RunID && ev.Takeovers != 1 {
			t.Errorf("subagent/end counts %d takeovers; want 1", ev.Takeovers)
		}
	}
}

// ownOf returns a session's own events, after its seed.
func ownOf(h protocol.SessionHeader, evs []protocol.SessionEvent) []protocol.SessionEvent {
	if h.SeedLength > 0 && h.SeedLength <= int64(len(evs)) {
		return evs[h.SeedLength:]
	}
	return evs
}

func countOf(evs []protocol.SessionEvent, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// TestAContinuableChildsTurnContinuesOnAnotherWorkerAfterItsHostIsKilled
// (issue 31, item 2: "the same for a continuable child's turn"): the
// worker hosting a continuable child is killed (SIGKILL) with read_file
// and run_command of its turn's second step in flight, a second worker
// live; a followup is sent while no host holds the child. The epoch is not
// ended HOST_LOST: the other worker takes the lease at the next epoch and
// continues the turn in the same epoch (each step logged once, read_file
// run again, run_command reported interrupted), then claims the followup;
// the epoch settles once, completed, by the second worker, its record and
// its one subagent/end counting one takeover, and the parent's view holds
// no HOST_LOST.
func TestAContinuableChildsTurnContinuesOnAnotherWorkerAfterItsHostIsKilled(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.ContinueWaitMax = 20 * time.Second })
	worker := func() *proc {
		return startProc(t, "spawn-worker", "--nats", s.Server.ClientURL(), "--log-level", "info", "--model", "scripted",
			"--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String(), "--workspace-root", "/")
	}
	w1 := worker()
	s.WaitProvider("spawn")
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe.txt")
	if err := os.WriteFile(probe, []byte("before the loss"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := s.Root(dir)
	script := "call list_dir {}\nsleep 0s\n" +
		`call read_file {"path":"probe.txt"}` + "\n" + `call run_command {"command":"sleep 30"}` + "\nsay done"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "worker", Prompt: protocol.Text(script),
		Options: protocol.ContinuableOptions{AutoApprove: []string{"run_command"}},
	})
	if err != nil {
		t.Fatalf("continuable.start: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, evs := s.Log(r.ChildID)
		return countOf(evs, protocol.EvToolCall) == 3
	}, "the second step's calls logged")
	first, err := s.Store.Lease(ctx, r.ChildID)
	if err != nil {
		t.Fatal(err)
	}
	worker()
	testutil.Eventually(t, 10*time.Second, func() bool {
		p, err := s.Client.Providers(ctx)
		return err == nil && p.Instances["spawn"] == 2
	}, "two instances of spawn")
	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-w1.done
	if err := os.WriteFile(probe, []byte("after the loss"), 0o600); err != nil {
		t.Fatal(err)
	}
	m2 := followup(t, s, r.ChildID, ref(root), "say two")
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, evs := s.Log(r.ChildID)
		return countOf(evs, protocol.EvTurnEnd) == 2
	}, "both turns ended")
	waitState(t, s, r.ChildID, ref(root), protocol.StateNone, 10*time.Second)

	_, evs := s.Log(r.ChildID)
	claims, answers, ends := turnsOf(evs)
	if strings.Join(claims, ",") != r.MessageID+","+m2 || strings.Join(answers, ",") != "done,two" ||
		strings.Join(ends, ",") != protocol.TurnCompleted+","+protocol.TurnCompleted {
		t.Fatalf("claims %v, answers %v, ends %v; want the first turn continued to done, then two", claims, answers, ends)
	}
	if c := countOf(evs, protocol.EvAgentTakeover); c != 1 {
		t.Fatalf("%d agent/takeover; want 1: %v", c, eventTypes(evs))
	}
	steps := map[int64]int{}
	results := map[string][]protocol.ToolResultData{}
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvStepStart:
			var d protocol.StepData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			if d.Turn == 1 {
				steps[d.Step]++
			}
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if err := ev.Decode(&d); err != nil {
				t.Fatal(err)
			}
			results[d.Name] = append(results[d.Name], d)
		}
	}
	if len(steps) != 3 || steps[1] != 1 || steps[2] != 1 || steps[3] != 1 {
		t.Errorf("steps of turn 1 logged %v; want steps 1-3 once each", steps)
	}
	if len(results["list_dir"]) != 1 || len(results["read_file"]) != 1 || len(results["run_command"]) != 1 {
		t.Fatalf("results %v; want one per call", results)
	}
	if d := results["read_file"][0]; d.IsError || protocol.PlainText(d.Content) != "after the loss" {
		t.Errorf("read_file's result = %+v; want it run again after the loss", d)
	}
	if d := results["run_command"][0]; !d.IsError || !strings.Contains(protocol.PlainText(d.Content), "may or may not have taken effect") {
		t.Errorf("run_command's result = %+v; want it reported interrupted by a host loss", d)
	}
	if err := sessionlog.ValidateReplay(evs, false); err != nil {
		t.Fatalf("the continued log does not replay: %v", err)
	}
	rec, err := s.Store.Run(ctx, first.Value.RunID)
	if err != nil || rec.Value.State != protocol.RunSettled || rec.Value.Takeovers != 1 || rec.Value.Result == nil ||
		rec.Value.Result.StopReason != protocol.StopCompleted || rec.Value.SettledBy == first.Value.HostID || !strings.HasPrefix(rec.Value.SettledBy, "spawn.") {
		t.Fatalf("epoch record %+v, %v; want it settled completed by the second worker, with one takeover", rec.Value, err)
	}
	testutil.Consistently(t, time.Second, func() bool {
		ends := 0
		for _, ev := range s.Lifecycle(root.SessionID) {
			if ev.Type == protocol.LifecycleEnd && ev.ID == r.ChildID {
				ends++
				if ev.RunID != first.Value.RunID || ev.StopReason != protocol.StopCompleted || ev.ErrorCode != "" || ev.Takeovers != 1 {
					t.Errorf("subagent/end %+v; want the one epoch's, completed, with one takeover", ev)
				}
			}
		}
		return ends == 1
	}, "one epoch, ended once")
}
