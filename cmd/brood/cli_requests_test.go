package main

import (
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestRequestVerbs (issue 33, item 4): `brood requests --wait` lists a
// child's parked run_command; `brood approve` lets it run, once; a second
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
