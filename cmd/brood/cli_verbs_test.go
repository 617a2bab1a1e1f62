package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

func TestHelpGroupsVerbsByWhatAUserWantsToDo(t *testing.T) {
	c := &cli{t: t}
	o := c.runBare("--help")
	if o.code != 0 {
		t.Fatalf("exit %d: %s", o.code, o.err)
	}
	groups := []struct {
		title string
		verbs []string
	}{
		{"Run everything in one process:", []string{"dev"}},
		{"Delegate work to children:", []string{"providers", "run", "start", "followup"}},
		{"See what children do and answered:", []string{"state", "result", "children", "log", "watch"}},
		{"Steer children (stop, end, hold):", []string{"interrupt", "dispose", "drain", "grant"}},
		{"Run the services separately (one per process):", []string{"provision", "coordinator", "spawn-worker", "fork-worker", "acp-bridge", "acp-agent", "mcp", "a2a-gateway", "a2a-worker"}},
	}
	rest := o.out
	for _, g := range groups {
		i := strings.Index(rest, g.title)
		if i < 0 {
			t.Fatalf("group %q missing or out of order in:\n%s", g.title, o.out)
		}
		rest = rest[i+len(g.title):]
		section := rest
		if j := strings.Index(section, "\n\n"); j >= 0 {
			section = section[:j]
		}
		for _, v := range g.verbs {
			if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(v) + ` `).MatchString(section) {
				t.Errorf("verb %s not listed under %q:\n%s", v, g.title, section)
			}
		}
	}
}

func TestVerbsRefuseFlagsTheyDoNotHonour(t *testing.T) {
	c := &cli{t: t}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dev", "--nats", "nats://127.0.0.1:4333"}, "--listen HOST:PORT"},
		{[]string{"coordinator", "--timeout", "3s"}, "`brood coordinator --help` lists its flags"},
		{[]string{"start", "--provider", "spawn", "--schema", "s.json", "x"}, "unknown flag: --schema"},
		{[]string{"providers", "--log-level", "loud"}, `--log-level "loud" must be`},
		{[]string{"state", "--max-depth", "2", "X"}, "unknown flag: --max-depth"},
		{[]string{"run", "--provider", "spawn", "--turn-timeout", "1ns", "x"}, "--turn-timeout must be at least 1ms (got 1ns)"},
	} {
		t.Run(strings.Join(tc.args[:2], " "), func(t *testing.T) {
			o := c.runBare(tc.args...)
			if o.code != 1 || !strings.HasPrefix(o.err, "INVALID_ARGUMENT: ") || !strings.Contains(o.err, tc.want) {
				t.Fatalf("exit %d stderr %q; want INVALID_ARGUMENT mentioning %q", o.code, o.err, tc.want)
			}
		})
	}
}

// TestProvidersVerb: brood providers lists each live provider, its
// instances, capabilities, tools, the tools it asks approval for
// (APPROVE-TOOLS, "-" when none) and its models; --json the reply.
func TestProvidersVerb(t *testing.T) {
	c := newCLI(t)
	gated := spawnworker.Descriptor("gated")
	gated.Models = []protocol.ModelInfo{model.ScriptedInfo}
	gated.ApproveTools = []string{"list_dir", "read_file"}
	c.stack.AddInProcessWorker(gated)
	o := c.ok("providers")
	if !regexp.MustCompile(`(?m)^PROVIDER +INSTANCES +.* TOOLS +APPROVE-TOOLS +MODEL$`).MatchString(o.out) || !regexp.MustCompile(`(?m)^spawn +1 +yes`).MatchString(o.out) {
		t.Fatalf("table:\n%s", o.out)
	}
	for _, line := range strings.Split(o.out, "\n") {
		if f := strings.Fields(line); len(f) == 11 && (f[0] == "gated" && f[9] != "list_dir,read_file" || f[0] == "spawn" && f[9] != "-") {
			t.Fatalf("APPROVE-TOOLS of %s is %q:\n%s", f[0], f[9], o.out)
		}
	}
	if !strings.Contains(o.out, "\ngated ") {
		t.Fatalf("the gated provider is not listed:\n%s", o.out)
	}
	r := decodeJSON[protocol.ProvidersListReply](t, c.ok("providers", "--json").out)
	if r.Instances["spawn"] != 1 || r.Instances["fork"] != 1 {
		t.Fatalf("json: %+v", r)
	}
}

func TestRunVerb(t *testing.T) {
	c := newCLI(t)
	idLine := regexp.MustCompile(`^child [0-9A-Z]{26}\n`)

	o := c.ok("run", "--provider", "spawn", "say hello")
	if o.out != "hello\n" || !idLine.MatchString(o.err) {
		t.Fatalf("stdout %q stderr %q: want the output on stdout and the child id on stderr", o.out, o.err)
	}
	child := strings.Fields(o.err)[1]
	if lo := c.ok("log", child); !strings.Contains(lo.out, "session "+child) || !strings.Contains(lo.out, "turn 1 completed") {
		t.Fatalf("the printed id is not the child's session:\n%s", lo.out)
	}

	o = c.ok("run", "--provider", "spawn", "--json", "say hi")
	j := decodeJSON[struct {
		RunID, ChildID, ParentSession string
		Result                        protocol.SubagentResult
	}](t, o.out)
	if j.ChildID == "" || j.RunID != j.ChildID || j.Result.StopReason != protocol.StopCompleted || protocol.PlainText(j.Result.Output) != "hi" || o.err != "" {
		t.Fatalf("json %+v stderr %q", j, o.err)
	}

	o = c.run("run", "--provider", "spawn", "fail boom")
	if o.code != 1 || !idLine.MatchString(o.err) || !strings.Contains(o.err, "\nMODEL_ERROR: run ") || !strings.Contains(o.err, "stopReason error") || !strings.Contains(o.err, "boom") {
		t.Fatalf("a failing child: exit %d stderr %q", o.code, o.err)
	}
	o = c.fails("NO_PROVIDER", "run", "--provider", "nope", "x")
	if strings.Contains(o.err, "child ") {
		t.Fatalf("a refused start printed a child: %q", o.err)
	}
	c.fails("INVALID_ARGUMENT", "run", "x")

	// Structured output: the value, or why it was refused (field and reason).
	schema := t.TempDir() + "/s.json"
	if err := os.WriteFile(schema, []byte(`{"type":"object","properties":{"answer":{"type":"integer"}},"required":["answer"],"additionalProperties":false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if o = c.ok("run", "--provider", "spawn", "--schema", schema, `json {"answer":42}`); o.out != "{\"answer\":42}\n" {
		t.Fatalf("structured output: %q", o.out)
	}
	o = c.run("run", "--provider", "spawn", "--schema", schema, `json {"answer":"x"}`)
	if o.code != 1 || !strings.Contains(o.err, "stopReason error") || !strings.Contains(o.err, "/answer") || !strings.Contains(o.err, "want integer") {
		t.Fatalf("a refused structured value: exit %d stderr %q", o.code, o.err)
	}
	o = c.run("run", "--provider", "spawn", "--schema", schema, "say no json")
	if o.code != 1 || !strings.Contains(o.err, "TASK_FAILED: run ") || !strings.Contains(o.err, "it never called structured_output") {
		t.Fatalf("no structured value: exit %d stderr %q", o.code, o.err)
	}
}

// startChild runs `brood start` and returns the child id.
func (c *cli) startChild(args ...string) string {
	c.t.Helper()
	o := c.ok(append([]string{"start", "--provider", "spawn"}, args...)...)
	return field(c.t, o.out, "childId")
}

func TestStartVerb(t *testing.T) {
	c := newCLI(t)
	o := c.ok("start", "--provider", "spawn", "--label", "tour", "say one")
	id, parent := field(t, o.out, "childId"), field(t, o.out, "parentSession")
	if field(t, o.out, "messageId") == "" || id == "" || parent == "" {
		t.Fatalf("start printed %q", o.out)
	}
	j := decodeJSON[struct{ ChildID, MessageID, ParentSession string }](t,
		c.ok("start", "--provider", "spawn", "--json", "--max-depth", "2", "--deny-tools", "read_file", "--persona", "You are {{provider}}.",
			"--auto-approve", "write_file,run_command", "--approve-tools", "subagent,list_dir", "--request-timeout", "90s", "say two").out)
	if j.ChildID == "" || j.MessageID == "" || j.ParentSession == "" {
		t.Fatalf("json %+v", j)
	}
	h, _ := c.stack.Log(j.ChildID)
	if h.DepthCap == nil || *h.DepthCap != 2 {
		t.Fatalf("--max-depth not applied: depthCap %v", h.DepthCap)
	}
	if h.ToolCeiling == nil || len(h.ToolCeiling.Deny) != 1 || h.ToolCeiling.Deny[0] != "read_file" {
		t.Fatalf("--deny-tools not applied: %+v", h.ToolCeiling)
	}
	c.fails("INVALID_PERSONA", "start", "--provider", "spawn", "--persona", "{{nope}}", "x")
	if !slices.Equal(h.AutoApprove, []string{"run_command", "write_file"}) {
		t.Fatalf("--auto-approve not applied: autoApprove %v", h.AutoApprove)
	}
	c.fails("INVALID_TOOL_FILTER", "start", "--provider", "spawn", "--allow-tools", "no_such_tool", "x")
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--auto-approve", "no_such_tool", "x")
	if !slices.Equal(h.ApproveTools, []string{"list_dir", "subagent"}) {
		t.Fatalf("--approve-tools not applied: approveTools %v", h.ApproveTools)
	}
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--approve-tools", "no_such_tool", "x")
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--approve-tools", "write_file", "--auto-approve", "write_file", "x")
	// --request-timeout (issue 33, item 5): recorded, and refused out of bounds.
	if h.RequestTimeoutMs != 90_000 {
		t.Fatalf("--request-timeout 90s not applied: requestTimeoutMs %d", h.RequestTimeoutMs)
	}
	c.fails("LIMIT_EXCEEDED", "start", "--provider", "spawn", "--request-timeout", "25h", "x")
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--request-timeout", "-1s", "x")
	// The model and turn limits (issue 37, item 3): applied, and refused
	// when not offered or above the worker's.
	id = c.startChild("--model", "scripted", "--turn-timeout", "90s", "--steps-per-turn-max", "5", "--tool-calls-per-step-max", "3", "say three")
	h, _ = c.stack.Log(id)
	if h.Model == nil || h.Model.String() != "scripted/scripted" {
		t.Fatalf("--model not applied: model %v", h.Model)
	}
	if h.Limits == nil || *h.Limits != (protocol.TurnLimits{TurnTimeoutMs: 90_000, StepsPerTurnMax: 5, ToolCallsPerStepMax: 3}) {
		t.Fatalf("the limits flags not applied: limits %+v", h.Limits)
	}
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--model", "huge", "x")
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--steps-per-turn-max", "65", "x")
	c.fails("INVALID_ARGUMENT", "start", "--provider", "spawn", "--steps-per-turn-max", "0", "x")
	c.fails("INVALID_ARGUMENT", "run", "--provider", "spawn", "--model", "huge", "x")
}

func TestGrantVerb(t *testing.T) {
	c := newCLI(t)
	o := c.ok("grant")
	if g := field(t, o.out, "grant"); len(g) < 20 {
		t.Fatalf("grant %q", g)
	}
	if _, err := time.Parse(time.RFC3339, field(t, o.out, "expiresAt")); err != nil {
		t.Fatal(err)
	}
	j := decodeJSON[protocol.UserGrantReply](t, c.ok("grant", "--json").out)
	if j.Grant == "" || j.ExpiresAt <= time.Now().UnixMilli() {
		t.Fatalf("json %+v", j)
	}
	// The grant acts for the user: a followup by hand with it is accepted.
	child := c.startChild("say one")
	var r protocol.FollowupReply
	err := c.stack.Client.Call(context.Background(), protocol.EpContinuableFollowup, protocol.FollowupRequest{
		ChildID: child, Authority: protocol.Authority{Grant: j.Grant}, Message: protocol.Text("say two"),
	}, &r)
	if err != nil || r.MessageID == "" {
		t.Fatalf("followup with the minted grant: %+v %v", r, err)
	}
}

func TestStateVerb(t *testing.T) {
	c := newCLI(t)
	busy := c.startChild("sleep 30s\nsay late")
	idle := c.startChild("say quick")
	c.eventually("the busy child runs", func() bool { return c.ok("state", busy).out == "running\n" })
	c.eventually("the quick child settles", func() bool { return c.ok("state", idle).out == "none\n" })
	st := decodeJSON[protocol.StateReply](t, c.ok("state", "--json", busy).out)
	if st.ChildID != busy || st.State != protocol.StateRunning || st.HostID == "" {
		t.Fatalf("json %+v", st)
	}

	// Read-only queries about what is not a continuable child say so.
	o := c.fails("NOT_FOUND", "state", "01NOSUCHCHILD0000000000000")
	if strings.Contains(o.err, "delivered") {
		t.Fatalf("a query answered like a delivery: %q", o.err)
	}
	oneShot := strings.Fields(c.ok("run", "--provider", "spawn", "say once").err)[1]
	c.eventually("the one-shot child is indexed", func() bool {
		o := c.run("state", oneShot)
		return o.code == 1 && strings.HasPrefix(o.err, "INVALID_ARGUMENT: ") && strings.Contains(o.err, "one-shot")
	})
	parent := field(t, c.ok("start", "--provider", "spawn", "say x").out, "parentSession")
	c.fails("INVALID_ARGUMENT", "state", parent)
}

func TestChildrenVerbListsInCreationOrder(t *testing.T) {
	c := newCLI(t)
	// A continuable child starts three background children in parallel.
	call := func(n string) string {
		return `call subagent {"description":"child ` + n + `","prompt":"sleep 60s\nsay ` + n + `","run_in_background":true}`
	}
	o := c.ok("start", "--provider", "spawn", "--label", "parent", call("one")+"\n"+call("two")+"\n"+call("three")+"\nsleep 60s\nsay done")
	p, root := field(t, o.out, "childId"), field(t, o.out, "parentSession")
	var rows []protocol.ChildRow
	c.eventually("three children listed", func() bool {
		rows = decodeJSON[[]protocol.ChildRow](t, c.ok("children", "--json", p).out)
		labelled := 0
		for _, r := range rows {
			if r.Kind == protocol.RowChild && r.Label != "" {
				labelled++
			}
		}
		return labelled == 3
	})
	for i := 1; i < len(rows); i++ {
		a, b := rows[i-1], rows[i]
		if a.CreatedAt > b.CreatedAt || a.CreatedAt == b.CreatedAt && a.ID > b.ID {
			t.Fatalf("rows not in creation order: %+v", rows)
		}
	}
	table := c.ok("children", p).out
	for i := 0; i < 5; i++ {
		if again := c.ok("children", p).out; again != table {
			t.Fatalf("the listing changes between calls:\n%s\n%s", table, again)
		}
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 {
		t.Fatalf("table:\n%s", table)
	}
	for i, r := range rows {
		if !strings.HasPrefix(lines[i+1], r.ID+" ") || !strings.Contains(lines[i+1], " "+r.Label+" ") || r.Label == "" {
			t.Fatalf("row %d %q, want %s labelled %q", i, lines[i+1], r.ID, r.Label)
		}
	}
	// --descendants: the subtree in pre-order with parent and depth.
	desc := decodeJSON[[]protocol.ChildRow](t, c.ok("children", "--json", "--descendants", root).out)
	if len(desc) != 4 || desc[0].ID != p || desc[0].Depth != 1 || desc[0].ParentID != root {
		t.Fatalf("descendants: %+v", desc)
	}
	for i, r := range rows {
		if d := desc[i+1]; d.ID != r.ID || d.Depth != 2 || d.ParentID != p {
			t.Fatalf("descendant %d: %+v, want %s at depth 2 under %s", i, d, r.ID, p)
		}
	}
}

func TestLogVerbFollowsLive(t *testing.T) {
	c := newCLI(t)
	child := c.startChild("--label", "follow me", "sleep 1500ms\nsay followed")
	c.eventually("the child runs", func() bool { return c.ok("state", child).out == "running\n" })
	done := make(chan outcome, 1)
	go func() { done <- c.run("log", "--follow", child) }()
	var o outcome
	select {
	case o = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("log --follow did not end after the child went idle")
	}
	if o.code != 0 {
		t.Fatalf("exit %d: %s", o.code, o.err)
	}
	for _, want := range []string{"session " + child, "events:", "turn/start", "followed", "turn 1 completed"} {
		if !strings.Contains(o.out, want) {
			t.Fatalf("log --follow lacks %q:\n%s", want, o.out)
		}
	}
	// The followed output is the whole log, in order, each event once.
	if all := c.ok("log", child).out; o.out != all {
		t.Fatalf("follow printed\n%s\nlog prints\n%s", o.out, all)
	}
	// JSON lines: the header, then each event in order.
	lines := strings.Split(strings.TrimSpace(c.ok("log", "--follow", "--json", child).out), "\n")
	hdr := decodeJSON[struct{ Header protocol.SessionHeader }](t, lines[0])
	if hdr.Header.ID != child {
		t.Fatalf("first line %s", lines[0])
	}
	for i, l := range lines[1:] {
		if ev := decodeJSON[protocol.SessionEvent](t, l); ev.Seq != int64(i) {
			t.Fatalf("line %d has seq %d", i+1, ev.Seq)
		}
	}
	// A one-shot child's log ends the follow at its turn's end.
	oneShot := strings.Fields(c.ok("run", "--provider", "spawn", "say once").err)[1]
	if o := c.ok("log", "-f", oneShot); !strings.Contains(o.out, "turn 1 completed") {
		t.Fatalf("log -f of a one-shot child:\n%s", o.out)
	}
	c.fails("NOT_FOUND", "log", "--follow", "01NOSUCHCHILD0000000000000")
}

func TestLogNamesWhoSentEachPrompt(t *testing.T) {
	c := newCLI(t)
	o := c.ok("run", "--provider", "spawn", "--json", `call subagent {"description":"grandchild","prompt":"say deep"}`+"\nsay done")
	child := decodeJSON[struct{ ChildID string }](t, o.out).ChildID
	if lo := c.ok("log", child).out; !regexp.MustCompile(`user/message +\[user\] call subagent`).MatchString(lo) {
		t.Fatalf("the user's prompt:\n%s", lo)
	}
	rows := decodeJSON[[]protocol.ChildRow](t, c.ok("children", "--json", child).out)
	if len(rows) != 1 {
		t.Fatalf("children of %s: %+v", child, rows)
	}
	if lo := c.ok("log", rows[0].ID).out; !strings.Contains(lo, "[parent "+child+"] say deep") {
		t.Fatalf("the agent's prompt is not logged as its:\n%s", lo)
	}
	h, evs := c.stack.Log(rows[0].ID)
	var d protocol.UserMessageData
	for _, ev := range evs {
		if ev.Type == protocol.EvUserMessage && ev.Decode(&d) == nil {
			break
		}
	}
	if d.Source != (protocol.MessageSource{Kind: protocol.SourceCoordinator, Form: "relay", SenderSessionID: h.ParentSession}) {
		t.Fatalf("source %+v", d.Source)
	}
}

func TestWatchVerb(t *testing.T) {
	c := newCLI(t)
	line := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} subagent/(start|end) [0-9A-Z]{26} \(spawn, run [0-9A-Z]{26}\)( → completed: ok)? \[parent [0-9A-Z]{26}\]$`)
	for _, asJSON := range []bool{false, true} {
		args := []string{"watch", "--count", "2"}
		if asJSON {
			args = append(args, "--json")
		}
		done := make(chan outcome, 1)
		go func() { done <- c.run(args...) }()
		var o outcome
	runs:
		for {
			c.ok("run", "--provider", "spawn", "say ok")
			select {
			case o = <-done:
				break runs
			case <-time.After(200 * time.Millisecond):
			}
		}
		lines := strings.Split(strings.TrimSpace(o.out), "\n")
		if o.code != 0 || len(lines) != 2 || o.err != "watching every parent (Ctrl-C stops)\n" {
			t.Fatalf("watch %v: exit %d\n%s\n%s", args, o.code, o.out, o.err)
		}
		for _, l := range lines {
			if asJSON {
				ev := decodeJSON[protocol.LifecycleEvent](t, l)
				if ev.Provider != "spawn" || ev.ID == "" || (ev.Type != protocol.LifecycleStart && ev.Type != protocol.LifecycleEnd) {
					t.Fatalf("json event %s", l)
				}
			} else if !line.MatchString(l) {
				t.Fatalf("event line %q", l)
			}
		}
	}
	c.fails("INVALID_ARGUMENT", "watch", "--count", "-1")
}

func TestSteeringVerbsInJSON(t *testing.T) {
	c := newCLI(t)
	busy := c.startChild("sleep 60s\nsay late")
	idle := c.startChild("say quick")
	c.eventually("the busy child's turn is under way and the quick one done", func() bool {
		return strings.Contains(c.ok("log", busy).out, "user/message") && c.ok("state", idle).out == "none\n"
	})

	f := decodeJSON[protocol.FollowupReply](t, c.ok("followup", "--json", idle, "say again").out)
	if f.MessageID == "" || f.Held != "" {
		t.Fatalf("followup --json %+v", f)
	}
	in := decodeJSON[protocol.InterruptReply](t, c.ok("interrupt", "--json", busy).out)
	if in.ChildID != busy || !in.Interrupted {
		t.Fatalf("interrupt --json %+v", in)
	}
	// Its answer is logged before its turn's end: idle once both are.
	c.eventually("the quick child ran its followup", func() bool {
		return c.ok("result", idle).out == "again\n" && c.ok("state", idle).out == "none\n"
	})
	in = decodeJSON[protocol.InterruptReply](t, c.ok("interrupt", "--json", idle).out)
	if in.Interrupted {
		t.Fatalf("interrupt --json of an idle child %+v", in)
	}

	other := c.startChild("sleep 60s\nsay late")
	c.eventually("its turn is under way", func() bool { return strings.Contains(c.ok("log", other).out, "user/message") })
	d := decodeJSON[struct {
		ChildID  string
		Disposed []string
	}](t, c.ok("dispose", "--json", other).out)
	if d.ChildID != other || len(d.Disposed) != 1 || d.Disposed[0] != other {
		t.Fatalf("dispose --json %+v", d)
	}

	// A one-shot run: dispose settles it aborted and prints its status.
	root := c.stack.Root()
	run, err := c.stack.Client.StartRun(context.Background(), protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("sleep 60s\nsay never")})
	if err != nil {
		t.Fatal(err)
	}
	o := c.ok("dispose", run.RunID)
	if o.err != "run "+run.RunID+" (child "+run.ChildID+") settled: stopReason aborted\n" {
		t.Fatalf("dispose of a one-shot run: stdout %q stderr %q", o.out, o.err)
	}
	st := decodeJSON[protocol.RunStatus](t, c.ok("dispose", "--json", run.RunID).out)
	if st.RunID != run.RunID || st.State != protocol.RunSettled || st.Result == nil || st.Result.StopReason != protocol.StopAborted {
		t.Fatalf("dispose --json of a settled run %+v", st)
	}
	if o := c.run("result", run.RunID); o.code != 1 || !regexp.MustCompile(`(^|\n)ABORTED: run `+run.RunID+` ended with stopReason aborted[^\n]*\n$`).MatchString(o.err) {
		t.Fatalf("result of the disposed run: exit %d stderr %q; want the code on its last line", o.code, o.err)
	}

	c.eventually("every activation went idle", func() bool {
		return c.ok("state", busy).out == "none\n" && c.ok("state", idle).out == "none\n" && c.ok("state", other).out == "none\n"
	})
	dr := decodeJSON[protocol.DrainReply](t, c.ok("drain", "--json").out)
	if dr.Disposed == nil || len(dr.Disposed) != 0 {
		t.Fatalf("drain --json %+v (the busy child was interrupted and went idle)", dr)
	}
	ls := decodeJSON[protocol.DrainsListReply](t, c.ok("drain", "--list", "--json").out)
	if len(ls.Drains) != 1 || ls.Drains[0].Root != "" || !ls.Drains[0].Active || ls.Drains[0].Holds != "until lifted" || ls.Drains[0].CreatedAt == 0 {
		t.Fatalf("drain --list --json %+v", ls)
	}
	h := decodeJSON[protocol.FollowupReply](t, c.ok("followup", "--json", idle, "say held").out)
	if !strings.Contains(h.Held, "drain --lift") {
		t.Fatalf("followup --json during a drain %+v", h)
	}
	c.fails("INVALID_ARGUMENT", "drain", "--list", "--lift")
	c.ok("drain", "--lift", "--json")
	if ls := decodeJSON[protocol.DrainsListReply](t, c.ok("drain", "--list", "--json").out); len(ls.Drains) != 0 {
		t.Fatalf("after the lift %+v", ls)
	}
}

func TestStateOfARunningOneShotChild(t *testing.T) {
	c := newCLI(t)
	root := c.stack.Root()
	run, err := c.stack.Client.StartRun(context.Background(), protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("sleep 60s\nsay never")})
	if err != nil {
		t.Fatal(err)
	}
	o := c.fails("INVALID_ARGUMENT", "state", run.ChildID)
	if !strings.Contains(o.err, "one-shot") {
		t.Fatalf("state of a running one-shot child: %q", o.err)
	}
	if o := c.ok("result", run.RunID); o.err != "run "+run.RunID+" (child "+run.ChildID+") is running\n" {
		t.Fatalf("result of a running one-shot run: %q", o.err)
	}
}

// TestMCPConfigIsCheckedBeforeConnecting: a worker's --mcp-config that does
// not parse or names a server badly is INVALID_ARGUMENT at once, before any
// connection (docs/mcp.md); acp-agent does not take it.
func TestMCPConfigIsCheckedBeforeConnecting(t *testing.T) {
	c := &cli{t: t}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"servers":[{"name":"x__y","command":"srv"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	unknown := filepath.Join(dir, "unknown.json")
	if err := os.WriteFile(unknown, []byte(`{"servers":[{"name":"x","command":"srv","secret":"no"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"spawn-worker", "--model", "scripted", "--nats", "nats://127.0.0.1:1", "--mcp-config", bad}, `name "x__y" must match`},
		{[]string{"fork-worker", "--model", "scripted", "--nats", "nats://127.0.0.1:1", "--mcp-config", unknown}, `unknown field "secret"`},
		{[]string{"dev", "--listen", "127.0.0.1:0", "--mcp-config", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"acp-agent", "--mcp-config", bad}, "unknown flag: --mcp-config"},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			o := c.runBare(tc.args...)
			if o.code != 1 || !strings.HasPrefix(o.err, "INVALID_ARGUMENT: ") || !strings.Contains(o.err, tc.want) {
				t.Fatalf("exit %d stderr %q; want INVALID_ARGUMENT mentioning %q", o.code, o.err, tc.want)
			}
		})
	}
}
