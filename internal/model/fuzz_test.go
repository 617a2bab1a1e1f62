package model

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/fuzzcheck"
	"github.com/brood-dev/brood/pkg/protocol"
)

// firstBadLine is the scripted language's grammar applied line by line,
// written from its documentation rather than from parseScript: the number
// of the first non-blank line that is not `<verb>[ <rest>]` with a known
// verb, a `call` without a tool name, or a `sleep` whose rest is not a
// duration ≥ 0; 0 when every line is good.
func firstBadLine(text string) int {
	for i, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(raw)
		if line == "" {
			continue
		}
		verb, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch verb {
		case "say", "json", "fail", "refuse", "max-tokens":
		case "call":
			if rest == "" {
				return i + 1
			}
		case "sleep":
			if d, err := time.ParseDuration(rest); err != nil || d < 0 {
				return i + 1
			}
		default:
			return i + 1
		}
	}
	return 0
}

// formatScript writes groups back as a script.
func formatScript(groups []group) string {
	var b strings.Builder
	for _, g := range groups {
		for _, d := range g.sleeps {
			fmt.Fprintf(&b, "sleep %s\n", d)
		}
		for _, d := range g.answer {
			if d.verb == "call" {
				fmt.Fprintf(&b, "call %s %s\n", d.tool, d.arg)
			} else {
				fmt.Fprintf(&b, "%s %s\n", d.verb, d.arg)
			}
		}
	}
	return b.String()
}

// withoutLines drops the line numbers, which a reformatted script changes.
func withoutLines(groups []group) []group {
	out := make([]group, len(groups))
	for i, g := range groups {
		out[i].sleeps = g.sleeps
		for _, d := range g.answer {
			d.line = 0
			out[i].answer = append(out[i].answer, d)
		}
	}
	return out
}

// scriptAllocBound: a directive and its group per line, the line split.
var scriptAllocBound = fuzzcheck.Bound{Base: 4 << 10, PerByte: 128}

// FuzzScripted holds the scripted model's language (docs/design.md §5; the doc
// of Scripted) to its rules:
//   - a script parses exactly when every non-blank line is a directive
//     (firstBadLine), and a refused one names its first bad line;
//   - a parsed script written back (formatScript) parses to the same
//     directives;
//   - a conversation driven the way the runtime drives it (the tool calls'
//     results appended, then the next request) gets each group in order:
//     its sleeps, then its answer, call ids unique in the conversation; it
//     ends at the first answer that calls no tool, after at most one
//     request per group plus one; text that starts with no directive is
//     echoed;
//   - parsing allocates within scriptAllocBound.
func FuzzScripted(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzScripted", 10)
	f.Fuzz(func(t *testing.T, text string) {
		var groups []group
		var perr error
		fuzzcheck.AllocWithin(t, "parsing", scriptAllocBound.Of(len(text)), func() { groups, perr = parseScript(text) })
		bad := firstBadLine(text)
		if (perr != nil) != (bad != 0) {
			t.Fatalf("parse error %v, but the first bad line is %d", perr, bad)
		}
		if perr != nil && !strings.Contains(perr.Error(), fmt.Sprintf("line %d", bad)) {
			t.Fatalf("parse error %q does not name line %d", perr, bad)
		}
		if perr == nil {
			again, err := parseScript(formatScript(groups))
			if err != nil || !reflect.DeepEqual(withoutLines(again), withoutLines(groups)) {
				t.Fatalf("written back as %q it parses to %+v, %v; was %+v", formatScript(groups), again, err, groups)
			}
		}
		walkConversation(t, text, groups, perr)
	})
}

// walkConversation asks the scripted model for answers as the runtime
// would within one turn and checks each against the parsed groups.
func walkConversation(t *testing.T, text string, groups []group, perr error) {
	t.Helper()
	var slept []time.Duration
	m := &Scripted{sleep: func(_ context.Context, d time.Duration) error {
		slept = append(slept, d)
		return nil
	}}
	msgs := []Message{{Role: RoleUser, Content: protocol.Text(text)}}
	first, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	ids := map[string]bool{}
	for pos := 0; ; pos++ {
		if pos > len(groups)+1 {
			t.Fatalf("%d requests for %d groups", pos, len(groups))
		}
		slept = nil
		var streamed strings.Builder
		resp, err := m.Stream(context.Background(), Request{Messages: msgs}, func(s string) { streamed.WriteString(s) })
		got := protocol.PlainText(resp.Message.Content)
		if !IsDirective(first) {
			if err != nil || resp.Finish != FinishStop || got != "echo: "+text {
				t.Fatalf("text without a directive: %+v, %v", resp, err)
			}
			return
		}
		if perr != nil {
			var me *Error
			if !errors.As(err, &me) || me.Diagnostic != perr.Error() {
				t.Fatalf("a bad script answered %+v, %v; want the model error %q", resp, err, perr)
			}
			return
		}
		if pos >= len(groups) {
			if err != nil || resp.Finish != FinishStop || got != "" || len(resp.Message.ToolCalls) != 0 {
				t.Fatalf("after the script: %+v, %v", resp, err)
			}
			return
		}
		g := groups[pos]
		if !reflect.DeepEqual(slept, g.sleeps) && (len(slept) > 0 || len(g.sleeps) > 0) {
			t.Fatalf("request %d slept %v, want %v", pos, slept, g.sleeps)
		}
		if len(g.answer) == 0 {
			if err != nil || resp.Finish != FinishStop || got != "" {
				t.Fatalf("sleeps at the end: %+v, %v", resp, err)
			}
			return
		}
		a := g.answer[0]
		switch a.verb {
		case "say", "max-tokens":
			want := map[string]Finish{"say": FinishStop, "max-tokens": FinishLength}[a.verb]
			if err != nil || resp.Finish != want || got != a.arg || streamed.String() != a.arg || len(resp.Message.ToolCalls) != 0 {
				t.Fatalf("%s %q answered %+v, %v (streamed %q)", a.verb, a.arg, resp, err, streamed.String())
			}
			return
		case "fail":
			var me *Error
			if !errors.As(err, &me) || me.Diagnostic != a.arg {
				t.Fatalf("fail %q answered %+v, %v", a.arg, resp, err)
			}
			return
		case "refuse":
			if err != nil || resp.Finish != FinishRefusal || got != "" {
				t.Fatalf("refuse answered %+v, %v", resp, err)
			}
			return
		}
		// json or a call group: tool calls, then the conversation goes on.
		calls := resp.Message.ToolCalls
		if err != nil || resp.Finish != FinishToolCalls || len(calls) != len(g.answer) {
			t.Fatalf("%s group of %d answered %+v, %v", a.verb, len(g.answer), resp, err)
		}
		for i, c := range calls {
			d := g.answer[i]
			name := d.tool
			if d.verb == "json" {
				name = StructuredOutputTool
			}
			if c.Name != name || c.Arguments != d.arg || c.ID == "" || ids[c.ID] {
				t.Fatalf("call %d is %+v, want %s %q with a new id", i, c, name, d.arg)
			}
			ids[c.ID] = true
		}
		msgs = append(msgs, Message{Role: RoleAssistant, ToolCalls: calls})
		for _, c := range calls {
			msgs = append(msgs, Message{Role: RoleTool, ToolCallID: c.ID, Name: c.Name, Content: protocol.Text("ok")})
		}
	}
}
