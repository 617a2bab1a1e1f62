package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
	"github.com/brood-dev/brood/services/webui"
)

// TestRequestVerbs (issue 33, item 4): `brood requests --wait` gives up
// at --timeout with none pending, and lists a child's parked run_command; `brood approve` lets it run, once; a second
// answer is ALREADY_ANSWERED; `brood deny --reason` gives the call the
// denial with the reason.
func TestRequestVerbs(t *testing.T) {
	c := newCLI(t)
	tests := []struct {
		name   string
		verb   []string
		state  string
		result string
	}{
		{"approve", []string{"approve"}, protocol.RequestApproved, "ran-after-approval"},
		{"deny", []string{"deny", "--reason", "not today"}, protocol.RequestDenied, "denied by the user: not today"},
	}
	// Nothing pending: --wait gives up at --timeout, CANCELLED (issue 33;
	// it once waited forever).
	start := time.Now()
	if o := c.fails("CANCELLED", "requests", "--wait", "--timeout", "1s"); o.out != "" || !strings.Contains(o.err, "within 1s (--timeout)") {
		t.Fatalf("requests --wait with none pending: stdout %q, stderr %q", o.out, o.err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("requests --wait --timeout 1s took %s", took)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			child := field(t, c.ok("start", "--provider", "spawn", "--label", tt.name,
				`call run_command {"command":"echo ran-after-approval"}`+"\nsay done").out, "childId")
			list := decodeJSON[[]protocol.RequestRecord](t, c.ok("requests", "--wait", "--json", "--timeout", "60s").out)
			if len(list) != 1 || list[0].SessionID != child || list[0].Tool != "run_command" {
				t.Fatalf("requests = %+v, want the run_command of %s", list, child)
			}
			id := list[0].ID
			o := c.ok(append(tt.verb, id)...)
			if !strings.Contains(o.out, id+" "+tt.state) {
				t.Fatalf("%s printed %q", tt.verb[0], o.out)
			}
			c.fails("ALREADY_ANSWERED", "approve", id)
			deadline := time.Now().Add(60 * time.Second)
			for {
				_, evs := c.stack.Log(child)
				var res *protocol.ToolResultData
				for _, ev := range evs {
					var d protocol.ToolResultData
					if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil {
						res = &d
					}
				}
				if res != nil {
					if !strings.Contains(protocol.PlainText(res.Content), tt.result) {
						t.Fatalf("run_command result %q, want %q", protocol.PlainText(res.Content), tt.result)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the parked call never got its result")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if got := c.ok("requests").out; !strings.Contains(got, "(no requests)") {
				t.Fatalf("requests after the answer printed %q", got)
			}
		})
	}
}

// TestBudgetPauseAnswers: brood requests shows a continuable child paused
// at its budget's cap as TOOL (budget); brood approve and deny of that
// request say what the turn does now (they printed "approved: - of - in
// CHILD", the fields of a tool call it has not): approved with nothing
// raised, it pauses again on a new request; denied, it ends
// BUDGET_EXHAUSTED (docs/protocol.md §5.5, "Pause and raise").
func TestBudgetPauseAnswers(t *testing.T) {
	c := newCLI(t)
	child := c.startChild("--budget", "modelRequests=1", "call list_dir {}\nsay done")
	pending := func(not string) string {
		var id string
		c.eventually("the child's budget request is pending", func() bool {
			for _, r := range decodeJSON[[]protocol.RequestRecord](t, c.ok("requests", "--json").out) {
				if r.SessionID == child && r.Kind == protocol.RequestBudget && r.State == protocol.RequestPending && r.ID != not {
					id = r.ID
				}
			}
			return id != ""
		})
		return id
	}
	first := pending("")
	if got := c.ok("requests").out; !strings.Contains(got, "(budget)  budget of "+child+": its modelRequests limit of 1 model requests is reached (1 used)  ") {
		t.Fatalf("requests printed %q, want the budget pause of %s", got, child)
	}
	want := first + " approved: the budget pause of " + child + "; its turn reserves again with nothing raised, and pauses again unless room was made (raise: brood budget " + child + " --raise tokens=+N)\n"
	if got := c.ok("approve", first).out; got != want {
		t.Fatalf("approve printed %q, want %q", got, want)
	}
	second := pending(first)
	want = second + " denied: the budget pause of " + child + "; its turn ends BUDGET_EXHAUSTED\n"
	if got := c.ok("deny", second).out; got != want {
		t.Fatalf("deny printed %q, want %q", got, want)
	}
	if o := c.run("result", "--wait", child); o.code != 1 || !strings.Contains(o.err, "\nBUDGET_EXHAUSTED: turn 1 of "+child) ||
		!strings.Contains(o.err, "ended denied by the user") {
		t.Fatalf("result after the denial: exit %d, stderr %q; want BUDGET_EXHAUSTED, denied by the user", o.code, o.err)
	}
}

// TestBudgetRaiseSaysWhatItAnswered: brood budget --raise of a child
// paused at its cap prints the ledger raised and, on stderr, the pause it
// answered and that the turn goes on when it next looks (it printed
// "resumed 1 turn" while brood state still said paused for up to 2 s)
// and the ledger's raises; the same turn then completes, and brood budget
// says the ledger was raised once, by the user.
func TestBudgetRaiseSaysWhatItAnswered(t *testing.T) {
	c := newCLI(t)
	child := c.startChild("--budget", "modelRequests=1", "call list_dir {}\nsay done")
	var id string
	c.eventually("the child's budget request is pending", func() bool {
		for _, r := range decodeJSON[[]protocol.RequestRecord](t, c.ok("requests", "--json").out) {
			if r.SessionID == child && r.Kind == protocol.RequestBudget && r.State == protocol.RequestPending {
				id = r.ID
			}
		}
		return id != ""
	})
	// brood state names the limit used up in its hint (it said tokens=+N
	// whatever the limit).
	if o := c.ok("state", child); o.out != "paused\n" || o.err != "turn 1 paused at its budget's cap on request "+id+"; raise it: brood budget "+child+" --raise modelRequests=+N\n" {
		t.Fatalf("brood state printed %q, stderr %q; want paused and the modelRequests raise", o.out, o.err)
	}
	o := c.ok("budget", child, "--raise", "modelRequests=+1")
	if want := "raised; answered the budget pause of 1 turn: " + id + " (each goes on when it next looks, within about 2s; until then brood state says paused)\n"; o.err != want ||
		!strings.Contains(o.out, child+"  modelRequests  2") {
		t.Fatalf("brood budget --raise printed %q, stderr %q; want the ledger raised to 2 and %q", o.out, o.err, want)
	}
	raised := child + ": raised 1 time, last by the user\n"
	if !strings.HasSuffix(o.out, raised) {
		t.Fatalf("brood budget --raise printed %q; want it to end %q", o.out, raised)
	}
	if o := c.run("result", "--wait", child); o.code != 0 || !strings.Contains(o.out, "done") {
		t.Fatalf("result after the raise: exit %d, stdout %q, stderr %q; want the turn completed", o.code, o.out, o.err)
	}
	if got := c.ok("budget", child).out; !strings.HasSuffix(got, raised) {
		t.Fatalf("brood budget printed %q; want the ledger's raises, %q", got, raised)
	}
}

// parkedRequest starts a child whose run_command parks on a request and
// returns the request's id once it is pending.
func (c *cli) parkedRequest() string {
	c.t.Helper()
	child := c.startChild(`call run_command {"command":"true"}` + "\nsay done")
	var id string
	c.eventually("the child's request is pending", func() bool {
		for _, r := range decodeJSON[[]protocol.RequestRecord](c.t, c.ok("requests", "--json").out) {
			if r.SessionID == child {
				id = r.ID
			}
		}
		return id != ""
	})
	return id
}

// askResult waits for the result of child's ask call.
func (c *cli) askResult(child string) protocol.ToolResultData {
	c.t.Helper()
	var res *protocol.ToolResultData
	c.eventually("the ask call gets its result", func() bool {
		_, evs := c.stack.Log(child)
		for _, ev := range evs {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.Name == "ask" {
				res = &d
			}
		}
		return res != nil
	})
	return *res
}

// TestAnswerVerb (issue 33, items 2(b) and 4): `brood requests` shows a
// child's question and its choices; `brood answer ID TEXT` answers it
// with one of them and `brood answer ID --json FILE` (or - for stdin) with
// JSON its answerSchema accepts; the answer is the ask call's result; an
// answer the question refuses is INVALID_ARGUMENT and leaves it pending,
// and approve of a question is refused; a second answer is
// ALREADY_ANSWERED.
func TestAnswerVerb(t *testing.T) {
	c := newCLI(t)
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	if err := os.WriteFile(good, []byte("{\"n\": 3}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"n":"three"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	const schema = `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`
	tests := []struct {
		name   string
		ask    string
		shows  string   // brood requests shows
		wrong  []string // an answer refused INVALID_ARGUMENT
		says   string
		answer []string
		stdin  string
		prints string
		result string
	}{
		{"a choice", `{"question":"Which database?","choices":["postgres","sqlite"]}`, "ask   Which database? [postgres | sqlite]",
			[]string{"mysql"}, "is not one of the choices", []string{"sqlite"}, "", "answered in %s: sqlite", "sqlite"},
		{"free text of several words", `{"question":"What next?"}`, "ask   What next?",
			nil, "", []string{"write", "the", "tests"}, "", "answered in %s: write the tests", "write the tests"},
		{"JSON from a file", `{"question":"How many?","answerSchema":` + schema + `}`, "ask   How many? [JSON]",
			[]string{"--json", bad}, "/n: got string, want integer", []string{"--json", good}, "", `answered in %s: {"n":3}`, `{"n":3}`},
		{"JSON from stdin", `{"question":"How many?","answerSchema":` + schema + `}`, "ask   How many? [JSON]",
			[]string{"three"}, "answer with json, not text", []string{"--json", "-"}, `{"n":4}`, `answered in %s: {"n":4}`, `{"n":4}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			child := c.startChild("--label", "asks", "call ask "+tt.ask+"\nsay done")
			var id string
			c.eventually("the child's question is pending", func() bool {
				for _, r := range decodeJSON[[]protocol.RequestRecord](t, c.ok("requests", "--json").out) {
					if r.SessionID == child && r.Kind == protocol.RequestQuestion {
						id = r.ID
					}
				}
				return id != ""
			})
			if got := c.ok("requests").out; !strings.Contains(got, tt.shows) {
				t.Fatalf("requests printed %q, want %q", got, tt.shows)
			}
			if tt.says != "" {
				if o := c.fails("INVALID_ARGUMENT", append([]string{"answer", id}, tt.wrong...)...); !strings.Contains(o.err, tt.says) {
					t.Fatalf("a wrong answer said %q, want %q", o.err, tt.says)
				}
			}
			c.fails("INVALID_ARGUMENT", "approve", id)
			o := c.runIn(tt.stdin, append([]string{"answer", id}, tt.answer...)...)
			if want := id + " " + strings.ReplaceAll(tt.prints, "%s", child) + "\n"; o.code != 0 || o.out != want {
				t.Fatalf("answer: exit %d, printed %q (stderr %q); want %q", o.code, o.out, o.err, want)
			}
			if o := c.runIn(tt.stdin, append([]string{"answer", id}, tt.answer...)...); o.code != 1 || !strings.HasPrefix(o.err, "ALREADY_ANSWERED: ") {
				t.Fatalf("a second answer: exit %d, stderr %q; want ALREADY_ANSWERED", o.code, o.err)
			}
			if res := c.askResult(child); res.IsError || protocol.PlainText(res.Content) != tt.result {
				t.Fatalf("ask result (error %v) %q, want %q", res.IsError, protocol.PlainText(res.Content), tt.result)
			}
		})
	}
	t.Run("no answer, or two", func(t *testing.T) {
		c.fails("INVALID_ARGUMENT", "answer", "r0")
		c.fails("INVALID_ARGUMENT", "answer", "r0", "text", "--json", good)
		c.fails("INVALID_ARGUMENT", "answer", "r0", "--json", filepath.Join(dir, "missing.json"))
	})
}

// parkedQuestion starts a child whose ask call parks on a question and
// returns the request's id once it is pending.
func (c *cli) parkedQuestion() string {
	c.t.Helper()
	child := c.startChild(`call ask {"question":"Go on?","choices":["yes","no"]}` + "\nsay done")
	var id string
	c.eventually("the child's question is pending", func() bool {
		for _, r := range decodeJSON[[]protocol.RequestRecord](c.t, c.ok("requests", "--json").out) {
			if r.SessionID == child {
				id = r.ID
			}
		}
		return id != ""
	})
	return id
}

// TestDisposeOfAQueuedRunSaysItNeverStarted: brood dispose of a run whose
// start waits in its parent's start queue (the parent at its live-children
// limit) says how it settled, with its code and why: it printed only
// "settled: stopReason error", hiding the CANCELLED and "never started"
// that --json showed.
func TestDisposeOfAQueuedRunSaysItNeverStarted(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(cfg *coordinator.Config) { cfg.LiveChildrenMax = 1 })
	s.AddSpawnWorker()
	c := &cli{t: t, stack: s, url: s.Server.ClientURL()}
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func() *client.Run {
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("sleep 60s\nsay never")})
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	busy := start()
	queued := start()
	if queued.State != protocol.RunQueued {
		t.Fatalf("the second start's state %q; want queued", queued.State)
	}
	o := c.ok("dispose", queued.RunID)
	want := "run " + queued.RunID + " (child " + queued.ChildID + ") settled: stopReason error (CANCELLED): the child was never started: "
	if !strings.HasPrefix(o.err, want) {
		t.Fatalf("dispose of a queued run printed %q; want it to start %q", o.err, want)
	}
	if o := c.ok("dispose", busy.RunID); o.err != "run "+busy.RunID+" (child "+busy.ChildID+") settled: stopReason aborted\n" {
		t.Fatalf("dispose of a running run printed %q", o.err)
	}
}

// TestWatchTreeDrawsAPausedChildPaused: brood watch --tree draws a child
// paused at its budget's cap "paused", as brood state says (it drew
// "running": its states come from lifecycle events, which say nothing of
// a pause); one requests.list for the whole tree, every watchPausedPoll.
func TestWatchTreeDrawsAPausedChildPaused(t *testing.T) {
	c := newCLI(t)
	child := c.startChild("--budget", "modelRequests=1", "call list_dir {}\nsay done")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make(chan map[string]bool, 1)
	go pollPaused(ctx, &session{cl: c.stack.Client}, "", c.stack.Grant(), out)
	var paused map[string]bool
	for !paused[child] {
		select {
		case paused = <-out:
		case <-ctx.Done():
			t.Fatalf("the paused child %s never listed paused (last %v)", child, paused)
		}
	}
	now := time.UnixMilli(10_000)
	nodes := markPaused([]webui.Node{
		{ID: "ROOT", Root: true, State: webui.StateRoot, Start: 1000},
		{ID: child, Parent: "ROOT", Provider: "spawn", Mode: protocol.ModeContinuable, State: webui.StateRunning, Epochs: 1, Start: 2000},
		{ID: "B", Parent: "ROOT", Provider: "spawn", Mode: protocol.ModeOneShot, State: webui.StateRunning, Start: 3000},
	}, paused)
	want := []string{
		"root ROOT",
		"├─ " + child + "  spawn  continuable ×1  paused  8.0s",
		"└─ B  spawn  running  7.0s",
	}
	if got := treeLines(nodes, "", now); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("tree:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAQueuedContinuableChildInTheCLI: brood budget of a continuable child
// whose start waits in its parent's queue prints the budgets it will draw
// on and says it is queued; once disposed there, brood dispose (again),
// brood result and brood state of its id say it never started, CANCELLED
// (each answered NOT_FOUND "session not found").
func TestAQueuedContinuableChildInTheCLI(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(cfg *coordinator.Config) { cfg.LiveChildrenMax = 1 })
	s.AddSpawnWorker()
	c := &cli{t: t, stack: s, url: s.Server.ClientURL()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ToolCalls: 50}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	if _, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "busy", Prompt: protocol.Text("sleep 60s\nsay busy")}); err != nil {
		t.Fatal(err)
	}
	queued, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "queued", Prompt: protocol.Text("say never"),
		Options: protocol.ContinuableOptions{Budget: &protocol.Budget{ToolCalls: 7}}})
	if err != nil || queued.State != protocol.StateQueued {
		t.Fatalf("a continuable start at the limit: %+v %v, want queued", queued, err)
	}
	q := queued.ChildID
	c.eventually("brood state says queued", func() bool { return c.run("state", q).out == "queued\n" })
	o := c.ok("budget", q)
	if !strings.Contains(o.out, root.SessionID+"  toolCalls  50") || !strings.Contains(o.out, q+"  toolCalls  7") ||
		o.err != q+" is queued (its start waits in its parent's queue): these are the budgets it will draw on; its own (the last) is created, and its deadline counted, when it starts\n" {
		t.Fatalf("brood budget of the queued child printed %q, stderr %q; want its parent's ledger, its own and that it is queued", o.out, o.err)
	}
	never := ") settled: stopReason error (CANCELLED): the child was never started: "
	for i := 0; i < 2; i++ {
		if o := c.ok("dispose", q); !strings.Contains(o.err, "(child "+q+never) {
			t.Fatalf("brood dispose %d of the queued child printed %q; want it settled never started, CANCELLED", i+1, o.err)
		}
	}
	if o := c.fails("CANCELLED", "result", q); !strings.Contains(o.err, "never started") {
		t.Fatalf("brood result of the disposed queued child: stderr %q; want never started", o.err)
	}
	if o := c.fails("CANCELLED", "state", q); !strings.Contains(o.err, "child "+q+" never started") {
		t.Fatalf("brood state of the disposed queued child: stderr %q; want never started", o.err)
	}
}
