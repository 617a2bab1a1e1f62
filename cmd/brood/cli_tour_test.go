package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestBackgroundChildrenTour is the README's tour of continuable children,
// verb by verb: start three background children, see each one's state and
// answer, interrupt one, dispose one, list them, drain and lift.
func TestBackgroundChildrenTour(t *testing.T) {
	c := newCLI(t)
	a := c.startChild("--label", "slow a", "sleep 60s\nsay a")
	b := c.startChild("--label", "quick b", "say b")
	o := c.ok("start", "--provider", "spawn", "--label", "slow c", "sleep 60s\nsay c")
	cc, parent := field(t, o.out, "childId"), field(t, o.out, "parentSession")

	// state
	c.eventually("a and c run, b settles", func() bool {
		return c.ok("state", a).out == "running\n" && c.ok("state", cc).out == "running\n" && c.ok("state", b).out == "none\n"
	})

	// result: the answer on stdout, the turn on stderr; JSON.
	o = c.ok("result", b)
	if o.out != "b\n" || !regexp.MustCompile(`^`+b+`: turn 1 completed \(state none\)\n`+usageRE+`$`).MatchString(o.err) {
		t.Fatalf("result of b: stdout %q stderr %q", o.out, o.err)
	}
	r := decodeJSON[childResult](t, c.ok("result", "--json", b).out)
	if r.SessionID != b || !r.Finished || r.Mode != protocol.ModeContinuable || r.Turn != 1 || r.StopReason != protocol.StopCompleted || protocol.PlainText(r.Output) != "b" || r.State != protocol.StateNone {
		t.Fatalf("result --json: %+v", r)
	}
	if o = c.ok("result", a); o.out != "" || !strings.Contains(o.err, "has not finished a turn yet (state running)") {
		t.Fatalf("result of a busy child: stdout %q stderr %q", o.out, o.err)
	}

	// children: each `brood start` opens its own root, so a parent lists
	// one child; without a parent, every live activation with its label.
	o = c.ok("children", parent)
	if !regexp.MustCompile(`(?m)^` + cc + ` +child +continuable +running +spawn +slow c +` + parent + ` +1 +\d+/\d+ +\d+/\d+$`).MatchString(o.out) {
		t.Fatalf("children %s:\n%s", parent, o.out)
	}
	rows := decodeJSON[[]protocol.ChildRow](t, c.ok("children", "--json", parent).out)
	if len(rows) != 1 || rows[0].ID != cc || rows[0].Label != "slow c" || rows[0].ParentID != parent {
		t.Fatalf("children --json: %+v", rows)
	}
	o = c.ok("children")
	for _, want := range []string{a + " .*slow a .*[0-9A-Z]{26} +1 +\\d+/\\d+ +\\d+/\\d+\n", cc + " .*slow c +" + parent + " +1 +\\d+/\\d+ +\\d+/\\d+\n"} {
		if !regexp.MustCompile(want).MatchString(o.out) {
			t.Fatalf("children (live) lacks %q:\n%s", want, o.out)
		}
	}
	if strings.Contains(o.out, b) {
		t.Fatalf("children (live) lists the settled child b:\n%s", o.out)
	}

	// interrupt: the turn ends aborted (user). (Interrupted before its turn
	// began, the prompt would stay parked until the next followup.)
	c.eventually("a's turn is under way", func() bool { return strings.Contains(c.ok("log", a).out, "user/message") })
	o = c.ok("interrupt", a)
	if o.out != "interrupted "+a+": its turn stops; queued messages wait for the next followup\n" {
		t.Fatalf("interrupt: %q", o.out)
	}
	c.eventually("a's turn ends and, with nothing queued, its activation", func() bool {
		return c.run("result", a).code == 1 && c.ok("state", a).out == "none\n"
	})
	o = c.run("result", a)
	if !strings.HasPrefix(o.err, a+": turn 1 aborted") || !strings.Contains(o.err, "ABORTED: turn 1 of "+a+" ended with stopReason aborted: cause user") {
		t.Fatalf("result after interrupt: %q", o.err)
	}
	if o = c.ok("interrupt", b); o.out != b+" has no live activation: nothing to interrupt\n" {
		t.Fatalf("interrupt of an idle child: %q", o.out)
	}
	c.fails("NOT_FOUND", "interrupt", "01NOSUCHCHILD0000000000000")

	// dispose: c's activation ends; its turn is logged aborted (disposed).
	c.eventually("c's turn is under way", func() bool { return strings.Contains(c.ok("log", cc).out, "user/message") })
	o = c.ok("dispose", cc)
	if o.out != "disposed 1 activation, child first:\n"+cc+"\n" {
		t.Fatalf("dispose: %q", o.out)
	}
	if o = c.ok("state", cc); o.out != "none\n" {
		t.Fatalf("state after dispose: %q", o.out)
	}
	if o = c.run("result", cc); !strings.Contains(o.err, "cause disposed") {
		t.Fatalf("result after dispose: %q", o.err)
	}
	if o = c.ok("dispose", cc); o.out != cc+" has no live activation: nothing to dispose\n" {
		t.Fatalf("dispose again: %q", o.out)
	}
	c.fails("NOT_FOUND", "dispose", "01NOSUCHCHILD0000000000000")

	// drain: a running turn ends aborted (drain); admission stays closed.
	d := c.startChild("--label", "slow d", "sleep 60s\nsay d")
	c.eventually("d's turn is under way", func() bool { return strings.Contains(c.ok("log", d).out, "user/message") })
	o = c.ok("drain")
	if o.out != "drained 1 activation; admission stays closed until `brood drain --lift`\n"+d+"\n" {
		t.Fatalf("drain: %q", o.out)
	}
	if lo := c.ok("log", d).out; !strings.Contains(lo, "turn 1 aborted (drain)") {
		t.Fatalf("the drained turn does not name the drain:\n%s", lo)
	}
	o = c.ok("drain", "--list")
	if !regexp.MustCompile(`(?m)^SCOPE +SINCE +HOLDS\nevery activation +\d{4}-\d\d-\d\dT[0-9:]+Z +until lifted\n$`).MatchString(o.out) {
		t.Fatalf("drain --list:\n%s", o.out)
	}
	o = c.fails("DRAINING", "start", "--provider", "spawn", "say e")
	if !strings.Contains(o.err, "brood drain --lift") || strings.Contains(o.err, "retry after the drain finished") {
		t.Fatalf("DRAINING wording: %q", o.err)
	}
	// A followup meanwhile is accepted and held, never dropped.
	o = c.ok("followup", b, "say again")
	if field(t, o.out, "messageId") == "" || !strings.HasPrefix(o.err, "held: a global drain holds admission closed until it is lifted") {
		t.Fatalf("followup during a drain: stdout %q stderr %q", o.out, o.err)
	}
	if o = c.ok("state", b); o.out != "none\n" {
		t.Fatalf("a held message ran during the drain: state %q", o.out)
	}

	// lift: the held message runs.
	if o = c.ok("drain", "--lift"); o.out != "drain lifted: admission is open again; queued messages run now\n" {
		t.Fatalf("lift: %q", o.out)
	}
	if o = c.ok("drain", "--list"); !strings.Contains(o.out, "(no drains: admission is open)") {
		t.Fatalf("drain --list after lift:\n%s", o.out)
	}
	o = c.ok("result", "--wait", b)
	if o.out != "again\n" || !strings.HasPrefix(o.err, b+": turn 2 completed") {
		t.Fatalf("the held followup after the lift: stdout %q stderr %q", o.out, o.err)
	}
}
