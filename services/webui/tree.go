package webui

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Node is one session of the delegation tree as the page shows it: a child
// (from its lifecycle events) or a root (a parent that is no child).
type Node struct {
	ID       string `json:"id"`
	Parent   string `json:"parent,omitempty"`
	Root     bool   `json:"root,omitempty"`
	Provider string `json:"provider,omitempty"`
	Mode     string `json:"mode,omitempty"`
	RunID    string `json:"runId,omitempty"`
	// Label is the child's display label (its start event's: the subagent
	// tool's description, a continuable child's label), shown beside its
	// id and searched.
	Label string `json:"label,omitempty"`
	// State is running while a run or epoch is open, else settled
	// (one-shot) or idle (continuable, resumable by a followup).
	State      string `json:"state"`
	StopReason string `json:"stopReason,omitempty"`
	ErrorCode  string `json:"errorCode,omitempty"`
	// Start is the first start's time, End the last end's (epoch ms; 0:
	// none); Epochs counts the runs or epochs started.
	Start  int64 `json:"start,omitempty"`
	End    int64 `json:"end,omitempty"`
	Epochs int   `json:"epochs,omitempty"`
	// Seq is the lifecycle stream sequence of the last event applied.
	Seq string `json:"seq,omitempty"`
	// Usage sums the usage of the node's ended runs or epochs (their end
	// events', each run once): its own and its subtree's
	// (docs/protocol.md §6.6); nil until one ended with usage.
	Usage *protocol.UsageSummary `json:"usage,omitempty"`
	// ended holds the runs whose usage Usage counts.
	ended map[string]bool
}

// Node states.
const (
	StateRunning = "running"
	StateSettled = "settled"
	StateIdle    = "idle"
	// StateRoot: a parent known only as the parent of children (a client's
	// root agent, or a child whose own start left the stream).
	StateRoot = "root"
)

// Tree folds lifecycle events into the nodes of the delegation tree (the
// web view's and `brood watch`'s). Not safe for concurrent use.
type Tree struct {
	nodes    map[string]*Node
	nodesMax int
}

// NewTree returns an empty tree that keeps at most nodesMax nodes (the
// oldest settled ones go first).
func NewTree(nodesMax int) *Tree { return &Tree{nodes: map[string]*Node{}, nodesMax: nodesMax} }

// Apply folds evs in (in stream order) and returns the nodes they changed.
func (t *Tree) Apply(evs ...protocol.LifecycleEvent) []Node {
	changed := map[string]*Node{}
	for _, ev := range evs {
		n := t.nodes[ev.ID]
		if n == nil {
			n = &Node{ID: ev.ID}
			t.nodes[ev.ID] = n
		}
		n.Root = false
		n.Parent, n.Provider, n.Mode, n.RunID, n.Seq = ev.ParentSession, ev.Provider, ev.Mode, ev.RunID, ev.Seq.String()
		if ev.Label != "" {
			n.Label = ev.Label // an end, or a start republished after host loss, carries none
		}
		switch ev.Type {
		case protocol.LifecycleStart:
			if n.Start == 0 {
				n.Start = ev.Time
			}
			n.Epochs++
			n.State, n.StopReason, n.ErrorCode, n.End = StateRunning, "", "", 0
		case protocol.LifecycleEnd:
			if n.Start == 0 {
				n.Start = ev.Time // its start is older than the stream keeps
			}
			n.State = StateSettled
			if ev.Mode == protocol.ModeContinuable {
				n.State = StateIdle
			}
			n.StopReason, n.ErrorCode, n.End = string(ev.StopReason), string(ev.ErrorCode), ev.Time
			n.addUsage(ev)
		}
		changed[n.ID] = n
		if ev.ParentSession != "" {
			p := t.nodes[ev.ParentSession]
			if p == nil { // a root (or a child whose start is older than the stream)
				p = &Node{ID: ev.ParentSession, Root: true, State: StateRoot, Start: ev.Time}
				t.nodes[p.ID] = p
				changed[p.ID] = p
			}
		}
	}
	t.trim()
	out := make([]Node, 0, len(changed))
	for _, n := range changed {
		out = append(out, *n)
	}
	return out
}

// trim drops the oldest settled (or idle) children beyond nodesMax, then
// the roots left without children.
func (t *Tree) trim() {
	if len(t.nodes) <= t.nodesMax {
		return
	}
	var old []*Node
	for _, n := range t.nodes {
		if n.State == StateSettled || n.State == StateIdle {
			old = append(old, n)
		}
	}
	sort.Slice(old, func(i, j int) bool {
		if old[i].Start != old[j].Start {
			return old[i].Start < old[j].Start
		}
		return old[i].ID < old[j].ID
	})
	for _, n := range old {
		if len(t.nodes) <= t.nodesMax {
			break
		}
		delete(t.nodes, n.ID)
	}
	parents := map[string]bool{}
	for _, n := range t.nodes {
		parents[n.Parent] = true
	}
	for id, n := range t.nodes {
		if n.Root && !parents[id] {
			delete(t.nodes, id)
		}
	}
}

// Nodes returns every node, oldest start first.
func (t *Tree) Nodes() []Node {
	out := make([]Node, 0, len(t.nodes))
	for _, n := range t.nodes {
		out = append(out, *n)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Start != out[j].Start {
			return out[i].Start < out[j].Start
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// hub keeps the tree from one follow of every lifecycle event (past events
// first: the stream keeps 24 hours) and broadcasts each node it changes to
// the page streams subscribed.
type hub struct {
	cl   *client.Client
	auth func() protocol.Authority
	log  *slog.Logger

	mu    sync.Mutex
	tree  *Tree
	subs  map[chan []Node]struct{}
	ready chan struct{} // closed once the past events were applied
	once  sync.Once
}

func newHub(cl *client.Client, auth func() protocol.Authority, nodesMax int, log *slog.Logger) *hub {
	return &hub{cl: cl, auth: auth, log: log, tree: NewTree(nodesMax),
		subs: map[chan []Node]struct{}{}, ready: make(chan struct{})}
}

// run follows the lifecycle events until ctx is done, reopening the follow
// after the last sequence seen when it fails.
func (h *hub) run(ctx context.Context) {
	var after protocol.Seq
	for ctx.Err() == nil {
		if err := h.follow(ctx, &after); err != nil && ctx.Err() == nil {
			h.log.Warn("lifecycle follow failed; retrying", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (h *hub) follow(ctx context.Context, after *protocol.Seq) error {
	// Past events in pages, then the live follow after the last one.
	for {
		page, err := h.cl.Events(ctx, protocol.EventsReadRequest{Authority: h.auth(), AfterSeq: *after, EventsMax: protocol.EventsPageMax})
		if err != nil {
			return err
		}
		h.apply(page.Events...)
		*after = page.Cursor
		if page.Complete {
			break
		}
	}
	h.once.Do(func() { close(h.ready) })
	at := *after
	f, err := h.cl.Follow(ctx, protocol.EventsFollowRequest{Authority: h.auth(), AfterSeq: &at})
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		ev, err := f.Next(ctx)
		if err != nil {
			return err
		}
		h.apply(ev)
		*after = f.Cursor()
	}
}

// apply folds events into the tree and broadcasts the nodes they changed.
func (h *hub) apply(evs ...protocol.LifecycleEvent) {
	if len(evs) == 0 {
		return
	}
	h.mu.Lock()
	out := h.tree.Apply(evs...)
	subs := make([]chan []Node, 0, len(h.subs))
	for ch := range h.subs {
		subs = append(subs, ch)
	}
	h.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- out:
		default: // a page that does not keep up is dropped and reconnects
			h.unsubscribe(ch)
		}
	}
}

// node returns the tree's node id, if it holds one.
func (h *hub) node(id string) (Node, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.tree.nodes[id]
	if !ok {
		return Node{}, false
	}
	return *n, true
}

// subscribe returns the tree now and a channel of the nodes that change
// after it; a subscriber that falls behind is closed.
func (h *hub) subscribe() ([]Node, chan []Node) {
	h.mu.Lock()
	defer h.mu.Unlock()
	snap := h.tree.Nodes()
	ch := make(chan []Node, 256)
	h.subs[ch] = struct{}{}
	return snap, ch
}

func (h *hub) unsubscribe(ch chan []Node) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

// addUsage counts the usage of an end event, once per run: a copy of an
// end republished after a host loss is not counted again.
func (n *Node) addUsage(ev protocol.LifecycleEvent) {
	if ev.Usage == nil || n.ended[ev.RunID] {
		return
	}
	if n.ended == nil {
		n.ended = map[string]bool{}
	}
	n.ended[ev.RunID] = true
	sum := protocol.UsageSummary{}
	if n.Usage != nil {
		sum = *n.Usage
	}
	sum.Own, sum.Subtree = sum.Own.Add(ev.Usage.Own), sum.Subtree.Add(ev.Usage.Subtree)
	n.Usage = &sum
}
