package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestInboxVerb: `brood inbox ROOT` shows a live root's pending notices
// (table and JSON), --ack deletes them, and an unknown session is NOT_FOUND
// (the coordinator's refusal to acknowledge a child's inbox is tested with
// the endpoint, services/coordinator).
func TestInboxVerb(t *testing.T) {
	c := newCLI(t)
	root := c.stack.Root()
	ctx := context.Background()
	var children []string
	for _, p := range []string{"say first result", "say second result"} {
		r, err := c.stack.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "job", Prompt: protocol.Text(p)})
		if err != nil {
			t.Fatal(err)
		}
		children = append(children, r.ChildID)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		return strings.Count(c.ok("inbox", root.SessionID).out, protocol.SourceSubagentSettled) == 2
	}, "two notices in the root's inbox")

	o := c.ok("inbox", root.SessionID)
	lines := strings.Split(strings.TrimSpace(o.out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SEQ") || !strings.Contains(lines[0], "FROM") {
		t.Fatalf("table:\n%s", o.out)
	}
	for _, id := range children {
		if !strings.Contains(o.out, id) {
			t.Fatalf("the table does not name child %s:\n%s", id, o.out)
		}
	}
	if !strings.Contains(o.out, "next-step") || !strings.Contains(o.out, "is done and idle") {
		t.Fatalf("table:\n%s", o.out)
	}
	// Both children run at once: their notices arrive in either order.
	items := decodeJSON[[]protocol.InboxItem](t, c.ok("inbox", root.SessionID, "--json").out)
	if len(items) != 2 || items[0].Seq == 0 || items[0].Seq >= items[1].Seq {
		t.Fatalf("JSON items %+v", items)
	}
	texts := protocol.AllText(items[0].Content) + protocol.AllText(items[1].Content)
	if !strings.Contains(texts, "first result") || !strings.Contains(texts, "second result") {
		t.Fatalf("JSON items %+v", items)
	}

	c.fails("NOT_FOUND", "inbox", "NOSUCHSESSION")
	o = c.ok("inbox", root.SessionID, "--ack")
	if !strings.Contains(o.err, "acknowledged 2 items") {
		t.Fatalf("stderr of --ack: %q", o.err)
	}
	if o := c.ok("inbox", root.SessionID); !strings.Contains(o.out, "(inbox empty)") {
		t.Fatalf("after --ack:\n%s", o.out)
	}
	page, err := root.Inbox(ctx, protocol.InboxReadRequest{})
	if err != nil || len(page.Items) != 0 {
		t.Fatalf("the root's inbox after --ack: %+v, %v", page, err)
	}
}
