package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Tests of a turn parked on a request across the death of every process
// (issue 33, item 1; docs/protocol.md §5.21, "After a restart").

// inBackground is a subagent call that starts prompt as a background
// (continuable) child.
func inBackground(t *testing.T, prompt string) string {
	t.Helper()
	p, err := json.Marshal(prompt)
	if err != nil {
		t.Fatal(err)
	}
	return `call subagent {"description":"helper","prompt":` + string(p) + `,"run_in_background":true}`
}

// parkedTrail returns, of a log, the types of its request-related events
// in order (tool/call of tool, request/open, agent/takeover,
// request/answer, tool/result of tool), its turn/start count and its
// turn/end reasons, and the results of tool.
func parkedTrail(evs []protocol.SessionEvent, tool string) (trail []string, starts int, ends []string, results []protocol.ToolResultData) {
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvTurnStart:
			starts++
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			_ = ev.Decode(&d)
			ends = append(ends, d.Reason.Kind)
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if ev.Decode(&d) == nil && d.Name == tool {
				trail = append(trail, ev.Type)
			}
		case protocol.EvRequestOpen, protocol.EvRequestAnswer, protocol.EvAgentTakeover:
			trail = append(trail, ev.Type)
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) == nil && d.Name == tool {
				trail, results = append(trail, ev.Type), append(results, d)
			}
		}
	}
	return trail, starts, ends, results
}

// TestAParkedTurnContinuesAfterItsWorkerIsKilled: a grandchild (root →
// continuable child → continuable grandchild) parks a run_command call on
// a request; its worker is killed (SIGKILL) while another instance is
// alive; the takeover leaves the parked turn open and the grandchild is
// resumed on the live instance, parked again on the same request; the
// approval then continues the same turn: the command runs once (it appends
// a line to a file), and the log holds call, request/open, the takeover,
// request/answer and the result in order, in one turn that completes.
func TestAParkedTurnContinuesAfterItsWorkerIsKilled(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinatorConfig) { c.LivenessInterval = 300 * time.Millisecond })
	worker := func() *proc {
		return startProc(t, "spawn-worker", "--nats", s.Server.ClientURL(), "--log-level", "info", "--model", "scripted",
			"--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String(), "--workspace-root", "/")
	}
	w1 := worker()
	s.WaitProvider("spawn")
	ws := t.TempDir()
	root := s.Root(ws)
	grandchild := `call run_command {"command":"echo ran >> ran.txt"}` + "\nsay done"
	child := startCont(t, s, root.Ref(), inBackground(t, grandchild)+"\nsay started")
	var req protocol.RequestRecord
	testutil.Eventually(t, 30*time.Second, func() bool {
		l, err := s.Client.Requests(context.Background(), protocol.RequestsListRequest{Authority: s.Grant()})
		if err != nil || len(l.Requests) != 1 {
			return false
		}
		req = l.Requests[0]
		return true
	}, "the grandchild's request is pending")
	if req.SessionID == child.ChildID || req.Tool != "run_command" {
		t.Fatalf("request %+v; want the grandchild's run_command", req)
	}
	gc := req.SessionID
	before, err := s.Store.LeaseLatest(context.Background(), gc)
	if err != nil {
		t.Fatalf("the parked grandchild's lease: %v", err)
	}
	worker() // another instance, alive when the first dies
	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The takeover resumes the grandchild on the live instance, parked
	// again, before anyone answers.
	testutil.Eventually(t, 30*time.Second, func() bool {
		l, err := s.Store.LeaseLatest(context.Background(), gc)
		return err == nil && l.Value.RunID != before.Value.RunID && l.Value.HostID != before.Value.HostID && l.Value.TakenOverBy == ""
	}, "the grandchild is resident again on the live instance")
	_, evs := s.Log(gc)
	if trail, _, ends, _ := parkedTrail(evs, "run_command"); len(ends) != 0 || strings.Join(trail, " ") != "tool/call request/open agent/takeover" {
		t.Fatalf("after the takeover: trail %v, ends %v; want the turn still open, parked", trail, ends)
	}
	if _, err := os.Stat(filepath.Join(ws, "ran.txt")); err == nil {
		t.Fatal("the command ran before its approval")
	}
	if _, err := s.Client.AnswerRequest(context.Background(), protocol.RequestAnswerRequest{RequestID: req.ID, Authority: s.Grant(), Answer: protocol.AnswerApprove}); err != nil {
		t.Fatalf("approve: %v", err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, evs := s.Log(gc)
		_, _, ends, _ := parkedTrail(evs, "run_command")
		return len(ends) > 0
	}, "the continued turn ends")
	_, evs = s.Log(gc)
	trail, starts, ends, results := parkedTrail(evs, "run_command")
	want := "tool/call request/open agent/takeover request/answer tool/result"
	if strings.Join(trail, " ") != want || starts != 1 || strings.Join(ends, ",") != protocol.TurnCompleted {
		t.Fatalf("trail %v, %d turns, ends %v; want %s in one turn that completed", trail, starts, ends, want)
	}
	if results[0].IsError {
		t.Fatalf("run_command result: %s", protocol.PlainText(results[0].Content))
	}
	got, err := os.ReadFile(filepath.Join(ws, "ran.txt"))
	if err != nil || string(got) != "ran\n" {
		t.Fatalf("ran.txt = %q, %v; want the command run exactly once", got, err)
	}
}

// broodAt runs `brood args... --nats url` in dir and returns its stdout;
// it fails the test when the verb does not exit 0 within 2 minutes.
func broodAt(t *testing.T, dir, url string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, broodBin, append(args, "--nats", url)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("brood %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// devLog reads a session's log through the coordinator at url, with the
// user's grant.
func devLog(t *testing.T, url, id string) []protocol.SessionEvent {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := c.UserGrant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Log(ctx, protocol.LogReadRequest{SessionID: id, Authority: protocol.Authority{Grant: g.Grant}})
	if err != nil {
		t.Fatalf("log of %s: %v", id, err)
	}
	return l.Events
}

// TestDevRestartedWhileAGrandchildWaitsForApproval (issue 33's first
// acceptance): a grandchild asks to run write_file (approval by default);
// `brood dev` is killed with -9 (or stopped with Ctrl-C: its drain leaves
// the turn parked) and started again on the same data; `brood requests`
// lists the request; `brood approve` continues exactly one turn; the tool
// runs once; the log shows request, answer and tool result in order, and
// no second turn began.
func TestDevRestartedWhileAGrandchildWaitsForApproval(t *testing.T) {
	for _, tt := range []struct {
		name string
		sig  syscall.Signal
	}{{"killed with -9", syscall.SIGKILL}, {"stopped with Ctrl-C", syscall.SIGINT}} {
		t.Run(tt.name, func(t *testing.T) { devRestartWhileParked(t, tt.sig) })
	}
}

func devRestartWhileParked(t *testing.T, sig syscall.Signal) {
	data, ws := t.TempDir(), t.TempDir()
	d := startDev(t, "--data", data)
	grandchild := `call write_file {"path":"x.txt","content":"hi"}` + "\nsay done"
	broodAt(t, ws, d.natsURL, "start", "--provider", "spawn", inBackground(t, grandchild)+"\nsay started")
	var reqs []protocol.RequestRecord
	testutil.Eventually(t, 30*time.Second, func() bool {
		reqs = nil
		return json.Unmarshal([]byte(broodAt(t, ws, d.natsURL, "requests", "--json")), &reqs) == nil && len(reqs) == 1
	}, "brood requests lists the grandchild's request")
	req := reqs[0]
	if req.Tool != "write_file" || req.State != protocol.RequestPending {
		t.Fatalf("request %+v; want write_file pending", req)
	}
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		t.Fatalf("brood dev still runs a minute after %v", sig)
	}

	d2 := startDev(t, "--data", data)
	url := d2.natsURL
	testutil.Eventually(t, 30*time.Second, func() bool {
		reqs = nil
		return json.Unmarshal([]byte(broodAt(t, ws, url, "requests", "--json")), &reqs) == nil && len(reqs) == 1 && reqs[0].ID == req.ID
	}, "brood requests lists the request after the restart")
	if _, err := os.Stat(filepath.Join(ws, "x.txt")); err == nil {
		t.Fatal("the tool ran before its approval")
	}
	if out := broodAt(t, ws, url, "approve", req.ID); !strings.Contains(out, "approved") {
		t.Fatalf("brood approve printed %q", out)
	}
	var evs []protocol.SessionEvent
	testutil.Eventually(t, 60*time.Second, func() bool {
		evs = devLog(t, url, req.SessionID)
		_, _, ends, _ := parkedTrail(evs, "write_file")
		return len(ends) > 0
	}, "the grandchild's turn ends after the approval")
	trail, starts, ends, results := parkedTrail(evs, "write_file")
	if starts != 1 || strings.Join(ends, ",") != protocol.TurnCompleted {
		t.Fatalf("%d turns, ends %v; want the one turn, continued and completed", starts, ends)
	}
	// A takeover's fence (after -9) stands between the request and its
	// answer; the order of the rest is the contract.
	var order []string
	for _, typ := range trail {
		if typ != protocol.EvAgentTakeover {
			order = append(order, typ)
		}
	}
	if want := "tool/call request/open request/answer tool/result"; strings.Join(order, " ") != want {
		t.Fatalf("log trail %v; want %s", trail, want)
	}
	if len(results) != 1 || results[0].IsError {
		t.Fatalf("write_file results %+v; want one that wrote the file", results)
	}
	if got, err := os.ReadFile(filepath.Join(ws, "x.txt")); err != nil || string(got) != "hi" {
		t.Fatalf("x.txt = %q, %v", got, err)
	}
	rec := decodeRequest(t, broodAt(t, ws, url, "requests", "--all", "--json"), req.ID)
	if rec.State != protocol.RequestApproved || rec.Answer == nil || rec.Answer.By.Kind != protocol.AnswererUser {
		t.Fatalf("the request after the turn: %+v", rec)
	}
}

// decodeRequest returns request id of a `brood requests --json` output.
func decodeRequest(t *testing.T, out, id string) protocol.RequestRecord {
	t.Helper()
	var reqs []protocol.RequestRecord
	if err := json.Unmarshal([]byte(out), &reqs); err != nil {
		t.Fatalf("brood requests --json: %v\n%s", err, out)
	}
	for _, r := range reqs {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("request %s not in %s", id, out)
	return protocol.RequestRecord{}
}
