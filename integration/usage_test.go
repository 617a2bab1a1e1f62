package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// delegate is a scripted `call subagent` line for prompt (JSON-escaped).
func delegate(t *testing.T, label, prompt string, background bool) string {
	t.Helper()
	args := map[string]any{"description": label, "prompt": prompt}
	if background {
		args["run_in_background"] = true
	}
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return "call subagent " + string(b)
}

// TestUsageAddsUpOverTheTree (issue 32, item 1): a scripted tree over two
// coordinators and two spawn workers — a one-shot child with two
// grandchildren in parallel, one of which delegates again, and a
// continuable child with a background and a foreground grandchild (itself
// delegating) — reports usage whose figures are exact: every result's own
// usage equals the fold of its log, and the root's total (its children's
// subtree figures) equals the sum of own usage over every log in the tree,
// each delegation counted once. `brood result` and `brood children` show it.
func TestUsageAddsUpOverTheTree(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()

	deep := delegate(t, "deep", "say deep answer", false)
	oneShot := delegate(t, "a1", deep+"\nsay a1 done", false) + "\n" + delegate(t, "a2", "say a2 done", false) + "\nsay all done here"
	run, res, err := s.Run(root.Ref(), "spawn", oneShot, protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("one-shot run: %+v, %v", res, err)
	}
	cont := startCont(t, s, root.Ref(),
		delegate(t, "bg", "say background done", true)+"\n"+
			delegate(t, "fg", delegate(t, "fgg", "say the deepest", false)+"\nsay fg done", false)+"\nsay continuable done")

	// The continuable child's epoch ends once its background child's notice
	// was taken in (it owns the child until then).
	var contEnd protocol.LifecycleEvent
	testutil.Eventually(t, 60*time.Second, func() bool {
		for _, ev := range s.Lifecycle(root.SessionID) {
			if ev.Type == protocol.LifecycleEnd && ev.ID == cont.ChildID {
				contEnd = ev
				return true
			}
		}
		return false
	}, "the continuable child's epoch ends")

	// Walk the tree from the root by its lifecycle events: every end once.
	type node struct {
		id   string
		ends []protocol.LifecycleEvent
	}
	var nodes []node
	var walk func(parent string)
	walk = func(parent string) {
		byChild := map[string]*node{}
		var order []string
		for _, ev := range s.Lifecycle(parent) {
			n := byChild[ev.ID]
			if n == nil {
				n = &node{id: ev.ID}
				byChild[ev.ID] = n
				order = append(order, ev.ID)
			}
			if ev.Type == protocol.LifecycleEnd {
				n.ends = append(n.ends, ev)
			}
		}
		for _, id := range order {
			nodes = append(nodes, *byChild[id])
			walk(id)
		}
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		nodes = nil
		walk(root.SessionID)
		if len(nodes) != 8 {
			return false
		}
		for _, n := range nodes {
			if len(n.ends) != 1 {
				return false
			}
		}
		return true
	}, "eight children in the tree, each ended once")

	var sum protocol.RunUsage
	for _, n := range nodes {
		h, evs := s.Log(n.id)
		own := sessionlog.OwnUsage(sessionlog.Own(evs, h.SeedLength))
		end := n.ends[0]
		if end.Usage == nil || end.Usage.Own != own {
			t.Errorf("child %s (%s): its end's own usage %+v, its log's %+v", n.id, end.Mode, end.Usage, own)
		}
		if own.ModelRequests == 0 || own.InputTokens == 0 || own.OutputTokens == 0 || own.UnreportedRequests != 0 {
			t.Errorf("child %s: own usage %+v, want requests and tokens, none unreported (the scripted model reports usage)", n.id, own)
		}
		sum = sum.Add(own)
	}
	if res.Usage == nil || contEnd.Usage == nil {
		t.Fatalf("results without usage: run %+v, epoch %+v", res.Usage, contEnd.Usage)
	}
	if total := res.Usage.Subtree.Add(contEnd.Usage.Subtree); total != sum {
		t.Fatalf("the root's total %+v differs from the sum over the tree's logs %+v", total, sum)
	}
	// Within: the one-shot child's subtree counts its three descendants, its
	// own is only its own.
	if res.Usage.Subtree.ModelRequests <= res.Usage.Own.ModelRequests || res.Usage.Own.ToolCalls != 2 {
		t.Fatalf("one-shot usage %+v: want a subtree beyond its own, two tool calls of its own", res.Usage)
	}

	// The CLI shows it: `brood result` a usage line with the run's exact
	// subtree tokens, `brood children` a TOKENS column.
	out := broodAll(t, s, "result", "--all-users", run.RunID)
	want := fmt.Sprintf("subtree %d in + %d out tokens, %d model requests", res.Usage.Subtree.InputTokens, res.Usage.Subtree.OutputTokens, res.Usage.Subtree.ModelRequests)
	if !strings.Contains(out, "usage: own ") || !strings.Contains(out, want) {
		t.Fatalf("brood result does not show the usage (%q):\n%s", want, out)
	}
	out = broodAll(t, s, "children", "--all-users", root.SessionID)
	cell := fmt.Sprintf("%d/%d", res.Usage.Own.Tokens(), res.Usage.Subtree.Tokens())
	if !strings.Contains(out, "TOKENS") || !strings.Contains(out, cell) {
		t.Fatalf("brood children does not show the one-shot child's tokens %s:\n%s", cell, out)
	}
}

// broodAll runs the CLI against s and returns its stdout and stderr.
func broodAll(t *testing.T, s *stack.Stack, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, broodBin, append(args, "--nats", s.URL)...).CombinedOutput()
	if err != nil {
		t.Fatalf("brood %v: %v\n%s", args, err, out)
	}
	return string(out)
}
