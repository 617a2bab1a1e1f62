package coordinator

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// After a drain marker is written or removed, admission waits up to
// markWaitMax, looking every markPollInterval, until this replica's cache
// shows the change (waitMark).
const (
	markWaitMax      = 2 * time.Second
	markPollInterval = 5 * time.Millisecond
)

// drainingFor returns the drain that closes admission for a session whose
// lineage (ancestors plus itself) is given, or "".
func (c *Coordinator) drainingFor(lineage []string) string {
	marks := c.agents.drainMarks()
	if m, ok := marks[store.DrainAll]; ok && (m.Until == 0 || m.Until > store.NowMs()) {
		return "a global drain holds admission closed until it is lifted (`brood drain --lift`)"
	}
	for _, id := range lineage {
		m, ok := marks[id]
		if !ok {
			continue
		}
		if c.markHolds(id, m) {
			return fmt.Sprintf("a drain of the descendants of %s holds admission closed while %s stays live, or until it is lifted (`brood drain --lift --parent %s`)", id, id, id)
		}
	}
	return ""
}

// markHolds reports whether a per-root drain marker still closes admission:
// while the exact root agent that was drained (by its credential hash) is live.
func (c *Coordinator) markHolds(root string, m protocol.DrainRecord) bool {
	ctx, cancel := context.WithTimeout(context.Background(), markHeaderWait)
	defer cancel()
	l, live := c.leaseCached(ctx, root)
	return live && l.rec.CredentialHash == m.CredentialHash
}

func (c *Coordinator) checkDraining(lineage []string) error {
	if why := c.drainingFor(lineage); why != "" {
		return protocol.NewError(protocol.CodeDraining, map[string]any{"reason": why})
	}
	return nil
}

// continuableDrain disposes activations child-first in one of three scopes:
// given children, whoever their parent (a user grant covering them;
// drainGivenChildren);
// given children of one parent and their subtrees (the parent or a user
// grant; drainChildrenOf); or the descendants of given parents, or every
// activation (user grant; drainDescendants), which also closes admission
// below them until the drain is lifted (liftDrains). Durable sessions stay
// resumable; accepted inbox items stay pending.
func (c *Coordinator) continuableDrain(ctx context.Context, req rpc.Request, r protocol.DrainRequest) (protocol.DrainReply, error) {
	leases := c.agents.snapshot()
	var (
		selected []leaseState
		cause    = protocol.CauseDrain
		err      error
	)
	switch {
	case r.Lift && (r.Parent != "" || len(r.Children) > 0):
		return protocol.DrainReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "lift reopens a global or per-parent drain; a drain of given children closes no admission")
	case r.Lift:
		return c.liftDrains(ctx, r)
	case r.Parent == "" && len(r.Children) > 0:
		selected, err = c.drainGivenChildren(ctx, r, leases)
		cause = protocol.CauseDisposed
	case r.Parent != "":
		selected, err = c.drainChildrenOf(ctx, r, leases)
	default:
		selected, err = c.drainDescendants(ctx, r, leases)
	}
	if err != nil {
		return protocol.DrainReply{}, err
	}
	reply, err := c.disposeDeepestFirst(ctx, selected, cause)
	if err != nil {
		return protocol.DrainReply{}, err
	}
	return reply, nil
}

// drainGivenChildren selects the activations of the given children and of
// their descendants, whoever their parent (`brood dispose CHILD`): a user
// grant that covers every given child (a grant over every session, or one
// minted by the user whose roots' trees hold them; authority before
// existence, so an unknown child is UNAUTHORIZED to a user's grant).
func (c *Coordinator) drainGivenChildren(ctx context.Context, r protocol.DrainRequest, leases []leaseState) ([]leaseState, error) {
	if len(r.Parents) > 0 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "children are drained on their own or with their parent, not with parents")
	}
	g, err := c.grantOf(ctx, r.Authority.Grant)
	if err != nil {
		return nil, err
	}
	roots := map[string]bool{}
	for _, id := range r.Children {
		h, err := c.childHeaderOf(ctx, id, true)
		if !g.all && protocol.CodeOf(err) == protocol.CodeNotFound {
			return nil, notCovered(g, id)
		}
		if err != nil {
			return nil, err
		}
		if ok, err := g.covers(ctx, c, h); err != nil || !ok {
			if err != nil {
				return nil, err
			}
			return nil, notCovered(g, id)
		}
		roots[id] = true
	}
	var selected []leaseState
	for _, l := range leases {
		if l.rec.Kind == protocol.AgentContinuable && (roots[l.rec.SessionID] || intersects(l.rec.Ancestry, roots)) {
			selected = append(selected, l)
		}
	}
	return selected, nil
}

// drainChildrenOf selects the activations of the given children of
// r.Parent and of their descendants: the exact live parent, or a user grant.
func (c *Coordinator) drainChildrenOf(ctx context.Context, r protocol.DrainRequest, leases []leaseState) ([]leaseState, error) {
	if len(r.Children) == 0 || len(r.Parents) > 0 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "children are drained with their parent: give parent and children, nothing else")
	}
	if r.Authority.Grant != "" {
		if err := c.checkGrant(ctx, r.Authority.Grant); err != nil {
			return nil, err
		}
	} else if r.Authority.Parent == nil || r.Authority.Parent.SessionID != r.Parent {
		return nil, protocol.Errorf(protocol.CodeUnauthorized, "only the exact live parent (or a user grant) drains its children")
	} else if _, err := c.authorize(ctx, *r.Authority.Parent); err != nil {
		return nil, err
	}
	roots := map[string]bool{}
	for _, id := range r.Children {
		roots[id] = true
	}
	var selected []leaseState
	for _, l := range leases {
		if l.rec.Kind != protocol.AgentContinuable {
			continue
		}
		if roots[l.rec.SessionID] && l.rec.ParentSession != r.Parent {
			return nil, protocol.Errorf(protocol.CodeUnauthorized, "%s is not a child of %s", l.rec.SessionID, r.Parent)
		}
		if roots[l.rec.SessionID] || intersects(l.rec.Ancestry, roots) {
			selected = append(selected, l)
		}
	}
	return selected, nil
}

// drainDescendants closes admission below the given parents (a marker per
// live root: DRAINING while that exact root agent stays live) or, with no
// parents, everywhere until lifted, and selects the activations below them
// (or all): a user grant only.
func (c *Coordinator) drainDescendants(ctx context.Context, r protocol.DrainRequest, leases []leaseState) ([]leaseState, error) {
	if err := c.checkGrant(ctx, r.Authority.Grant); err != nil {
		return nil, err
	}
	roots := map[string]bool{}
	for _, p := range r.Parents {
		if !protocol.ValidID(p) {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "parent %q is not a valid id", p)
		}
		roots[p] = true
	}
	if len(roots) == 0 {
		// Admission stays closed until lifted: pending items wait, never dropped.
		if err := c.st.PutDrain(ctx, store.DrainAll, protocol.DrainRecord{CreatedAt: store.NowMs()}); err != nil {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "mark the drain: %w", err)
		}
		c.waitMark(store.DrainAll, true)
	}
	for p := range roots {
		if l, ok := c.leaseCached(ctx, p); ok {
			if err := c.st.PutDrain(ctx, p, protocol.DrainRecord{Root: p, CredentialHash: l.rec.CredentialHash, CreatedAt: store.NowMs()}); err != nil {
				return nil, protocol.Errorf(protocol.CodeUnavailable, "mark the drain: %w", err)
			}
			c.waitMark(p, true)
		}
	}
	var selected []leaseState
	for _, l := range leases {
		if l.rec.Kind == protocol.AgentContinuable && (len(roots) == 0 || intersects(l.rec.Ancestry, roots)) {
			selected = append(selected, l)
		}
	}
	return selected, nil
}

// liftDrains removes the drain markers of the given parents (none: the
// global one), so admission below them opens again, and runs the liveness
// sweep at once, so held messages run now: a user grant only.
func (c *Coordinator) liftDrains(ctx context.Context, r protocol.DrainRequest) (protocol.DrainReply, error) {
	if err := c.checkGrant(ctx, r.Authority.Grant); err != nil {
		return protocol.DrainReply{}, err
	}
	scopes := r.Parents
	if len(scopes) == 0 {
		scopes = []string{store.DrainAll}
	}
	for _, scope := range scopes {
		if err := c.st.DeleteDrain(ctx, scope); err != nil {
			return protocol.DrainReply{}, protocol.Errorf(protocol.CodeUnavailable, "lift the drain of %s: %w", scope, err)
		}
		c.waitMark(scope, false)
	}
	// Held messages run now, not at the next liveness tick.
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return protocol.DrainReply{Disposed: []string{}}, nil
}

// disposeDeepestFirst disposes the selected activations one by one, the
// deepest first, so children end before their parents; any that did not
// stop make the drain ACTIVATION_TEARDOWN_FAILED.
func (c *Coordinator) disposeDeepestFirst(ctx context.Context, selected []leaseState, cause string) (protocol.DrainReply, error) {
	sortDeepestFirst(selected)
	reply := protocol.DrainReply{Disposed: []string{}}
	for _, l := range selected {
		if err := c.disposeActivation(ctx, l.rec.HostID, l.rec.SessionID, cause); err != nil {
			reply.Failed = append(reply.Failed, l.rec.SessionID)
			continue
		}
		reply.Disposed = append(reply.Disposed, l.rec.SessionID)
	}
	if len(reply.Failed) > 0 {
		return reply, protocol.NewError(protocol.CodeActivationTeardownFailed, map[string]any{
			"reason": fmt.Sprintf("%d activations did not stop: %s", len(reply.Failed), strings.Join(reply.Failed, ", "))})
	}
	return reply, nil
}

// continuableDrains lists the drain markers and what each holds closed now
// (user grant): the global one first, then per-root markers by root.
func (c *Coordinator) continuableDrains(ctx context.Context, req rpc.Request, r protocol.DrainsListRequest) (protocol.DrainsListReply, error) {
	if err := c.checkGrant(ctx, r.Authority.Grant); err != nil {
		return protocol.DrainsListReply{}, err
	}
	marks := c.agents.drainMarks()
	reply := protocol.DrainsListReply{Drains: []protocol.DrainMarker{}}
	if m, ok := marks[store.DrainAll]; ok {
		reply.Drains = append(reply.Drains, protocol.DrainMarker{CreatedAt: m.CreatedAt, Holds: "until lifted", Active: true})
	}
	roots := make([]string, 0, len(marks))
	for scope := range marks {
		if scope != store.DrainAll {
			roots = append(roots, scope)
		}
	}
	sort.Strings(roots)
	for _, root := range roots {
		m := marks[root]
		d := protocol.DrainMarker{Root: root, CreatedAt: m.CreatedAt, Holds: "nothing: " + root + " ended (lift removes the marker)"}
		if c.markHolds(root, m) {
			d.Holds, d.Active = "while "+root+" stays live, or until lifted", true
		}
		reply.Drains = append(reply.Drains, d)
	}
	return reply, nil
}

// waitMark waits (briefly) until this replica's cache shows a drain marker
// (present) or its removal, so admission decisions that follow see it.
func (c *Coordinator) waitMark(scope string, present bool) {
	deadline := time.Now().Add(markWaitMax)
	for time.Now().Before(deadline) {
		if _, ok := c.agents.drainMarks()[scope]; ok == present {
			return
		}
		time.Sleep(markPollInterval)
	}
}

func intersects(list []string, set map[string]bool) bool {
	for _, x := range list {
		if set[x] {
			return true
		}
	}
	return false
}

func sortDeepestFirst(ls []leaseState) {
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && len(ls[j].rec.Ancestry) > len(ls[j-1].rec.Ancestry); j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}
