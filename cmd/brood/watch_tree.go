package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/webui"
)

// Watch modes of --tree.
const (
	treeAuto   = "auto"
	treeAlways = "always"
	treeNever  = "never"
)

// watchTreeNodesMax bounds the nodes `brood watch` keeps; watchRedraw is how
// often a tree with running nodes is redrawn (their durations tick).
// watchPausedPoll is how often it lists the tree's pending budget requests
// (one requests.list for the whole tree, whatever its size): a child
// paused at its budget's cap is drawn paused (lifecycle events do not say
// it).
const (
	watchTreeNodesMax = 2000
	watchRedraw       = 500 * time.Millisecond
	watchPausedPoll   = 2 * time.Second
)

// statePaused is the state a running node is drawn with while its turn
// waits at its budget's cap (protocol.StatePaused, as brood state says).
const statePaused = protocol.StatePaused

// terminalRows is the height of the terminal w is, or 0 when unknown.
func terminalRows(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Row)
}

// watchTree draws the live tree of root's subtree (every root when root is
// ""): past events first (the stream keeps 24 hours), then each new one,
// redrawn in place.
func watchTree(ctx context.Context, s *session, root string, auth protocol.Authority) error {
	var after protocol.Seq
	f, err := s.cl.Follow(ctx, protocol.EventsFollowRequest{Parent: root, Descendants: root != "", Authority: auth, AfterSeq: &after})
	if err != nil {
		return err
	}
	defer f.Close()
	evs := make(chan protocol.LifecycleEvent, 256)
	errc := make(chan error, 1)
	go func() {
		for {
			ev, err := f.Next(ctx)
			if err != nil {
				errc <- err
				return
			}
			evs <- ev
		}
	}()
	pausedc := make(chan map[string]bool, 1)
	go pollPaused(ctx, s, root, auth, pausedc)
	var paused map[string]bool
	tree := webui.NewTree(watchTreeNodesMax)
	d := &treeDrawer{w: s.out, root: root, rows: terminalRows(s.out)}
	tick := time.NewTicker(watchRedraw)
	defer tick.Stop()
	dirty := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil
			}
			return err
		case ev := <-evs:
			tree.Apply(ev)
			dirty = true
			continue // draw once the burst of past events is in
		case p := <-pausedc:
			dirty = dirty || !maps.Equal(p, paused)
			paused = p
			continue
		case <-tick.C:
		}
		nodes := tree.Nodes()
		if dirty || anyRunning(nodes) {
			d.draw(markPaused(nodes, paused), time.Now())
			dirty = false
		}
	}
}

// pollPaused sends on out, every watchPausedPoll until ctx is done, the
// sessions of root's subtree (every tree auth sees when root is "") whose
// turn waits at its budget's cap: a pending request of kind budget
// (requests.list, §5.21). A failed list sends nothing (the last set
// stands); out holds the latest set only.
func pollPaused(ctx context.Context, s *session, root string, auth protocol.Authority, out chan map[string]bool) {
	t := time.NewTicker(watchPausedPoll)
	defer t.Stop()
	for {
		if l, err := s.cl.Requests(ctx, protocol.RequestsListRequest{Authority: auth, Under: root}); err == nil {
			set := map[string]bool{}
			for _, r := range l.Requests {
				if r.Kind == protocol.RequestBudget && r.State == protocol.RequestPending {
					set[r.SessionID] = true
				}
			}
			select {
			case <-out: // drop the unread older set
			default:
			}
			out <- set
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// markPaused returns nodes with each running node in paused drawn paused.
func markPaused(nodes []webui.Node, paused map[string]bool) []webui.Node {
	for i := range nodes {
		if nodes[i].State == webui.StateRunning && paused[nodes[i].ID] {
			nodes[i].State = statePaused
		}
	}
	return nodes
}

func anyRunning(nodes []webui.Node) bool {
	for _, n := range nodes {
		if n.State == webui.StateRunning {
			return true
		}
	}
	return false
}

// treeDrawer redraws a tree in place: it moves up over what it drew last
// and clears to the end of the screen.
type treeDrawer struct {
	w     io.Writer
	root  string
	rows  int // terminal height (0: unknown)
	drawn int // lines drawn last time
}

func (d *treeDrawer) draw(nodes []webui.Node, now time.Time) {
	lines := treeLines(nodes, d.root, now)
	if len(lines) == 0 {
		lines = []string{"(no children yet; waiting for lifecycle events; Ctrl-C stops)"}
	}
	if max := d.rows - 1; d.rows > 0 && len(lines) > max {
		hidden := len(lines) - max + 1
		lines = append([]string{fmt.Sprintf("… %d more lines above (older roots)", hidden)}, lines[hidden:]...)
	}
	var b strings.Builder
	if d.drawn > 0 {
		fmt.Fprintf(&b, "\033[%dA\r\033[J", d.drawn)
	}
	for _, l := range lines {
		b.WriteString(l)
		b.WriteString("\033[K\n")
	}
	_, _ = io.WriteString(d.w, b.String())
	d.drawn = len(lines)
}

// treeLines renders nodes as a tree: each root (or, for a subtree, root's
// children), oldest first, then its descendants with box-drawing branches.
func treeLines(nodes []webui.Node, root string, now time.Time) []string {
	byID := map[string]webui.Node{}
	kids := map[string][]webui.Node{}
	for _, n := range nodes {
		byID[n.ID] = n
	}
	var tops []webui.Node
	for _, n := range nodes {
		if _, ok := byID[n.Parent]; ok && n.Parent != "" {
			kids[n.Parent] = append(kids[n.Parent], n)
		} else {
			tops = append(tops, n)
		}
	}
	if root != "" {
		if r, ok := byID[root]; ok {
			tops = []webui.Node{r}
		}
	}
	sort.SliceStable(tops, func(i, j int) bool { return tops[i].Start < tops[j].Start })
	var out []string
	var walk func(n webui.Node, prefix, branch string, depth int)
	walk = func(n webui.Node, prefix, branch string, depth int) {
		out = append(out, prefix+branch+nodeLine(n, now))
		cs := kids[n.ID]
		next := prefix
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		if depth >= 64 {
			return
		}
		for i, c := range cs {
			b := "├─ "
			if i == len(cs)-1 {
				b = "└─ "
			}
			walk(c, next, b, depth+1)
		}
	}
	for _, t := range tops {
		walk(t, "", "", 0)
	}
	return out
}

// nodeLine is one node: id, provider and mode, state, stop reason, duration.
func nodeLine(n webui.Node, now time.Time) string {
	if n.Root {
		return "root " + n.ID
	}
	parts := []string{n.ID, n.Provider}
	if n.Mode == protocol.ModeContinuable {
		parts = append(parts, fmt.Sprintf("continuable ×%d", n.Epochs))
	}
	switch n.State {
	case webui.StateRunning, statePaused:
		parts = append(parts, n.State)
	default:
		st := n.StopReason
		if n.ErrorCode != "" {
			st += " " + n.ErrorCode
		}
		if n.State == webui.StateIdle {
			st = "idle (" + st + ")"
		}
		parts = append(parts, st)
	}
	if n.Start > 0 {
		end := now.UnixMilli()
		if n.State != webui.StateRunning && n.State != statePaused && n.End > 0 {
			end = n.End
		}
		parts = append(parts, elapsed(time.Duration(end-n.Start)*time.Millisecond))
	}
	if n.Usage != nil {
		tokens, requests := usageCells(n.Usage)
		parts = append(parts, "tokens "+tokens, "requests "+requests)
	}
	return strings.Join(parts, "  ")
}
