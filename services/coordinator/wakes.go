package coordinator

import (
	"context"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Waking an owned child (docs/design.md §7, Ownership; docs/protocol.md §9.4).
//
// Every path that wakes a continuable child for accepted work registers
// its ownership edge the same way, through wakeOwner, before the work can
// run: its parent's followup, a followup as the user (a grant), the
// liveness sweep and a takeover (both resume, monitor.go) and an orphaned
// epoch's settlement (which resumes too). While its parent is a live
// continuable agent, the parent owns the child: it waits for the child
// instead of settling, so the end of the child's epoch finds it live and
// gets that epoch's subagent-settled notice. Before, a followup as the
// user registered no edge and resumed the child with no owner: its parent
// could settle while the child worked for the user, and the child's notice
// then found no live parent (issue 37, item 7).

// wakeOwner returns the owner of continuable child h's next epoch (its
// parent while that is a live continuable agent, else "") and registers
// the edge owner → h.ID first (store.AddOwnership, idempotent), so an epoch
// that ends at once releases it. parent is the parent's lease when the
// caller authorized the parent itself (a parent's followup: the exact live
// agent); nil reads it from the bucket's leader (ownerOf). A failed
// registration is UNAVAILABLE and nothing is woken: an edge registered by
// a wake that failed later is released by the epoch that eventually runs
// the child (store.EndEpochRecords removes the parent's edge whether or not
// the epoch names an owner).
func (c *Coordinator) wakeOwner(ctx context.Context, h protocol.SessionHeader, parent *leaseState) (string, error) {
	owner := ""
	switch {
	case parent != nil && parent.rec.Kind == protocol.AgentContinuable:
		owner = h.ParentSession
	case parent == nil:
		owner = c.ownerOf(ctx, h)
	}
	if owner == "" {
		return "", nil
	}
	if err := c.st.AddOwnership(ctx, owner, h.ID); err != nil {
		return "", protocol.Errorf(protocol.CodeUnavailable, "register ownership: %w", err)
	}
	return owner, nil
}

// pendingWork returns the items of inbox items that still wait for child
// h: an item whose claim or discard h's log records (store.UndoneInboxItems)
// is done, even while it is still in the inbox (its removal failed: the
// host's request refused, the coordinators unreachable). The done ones are
// removed here (store.RemoveDoneInboxItems, what a host asks the
// coordinators for), best effort. Resuming a child for done work would
// start an epoch that has nothing to do, settle it at once and notify its
// parent, again at every sweep (issue 37, item 7).
func (c *Coordinator) pendingWork(ctx context.Context, h protocol.SessionHeader, items []store.InboxItem) ([]store.InboxItem, error) {
	undone, done, err := c.st.UndoneInboxItems(ctx, h, items)
	if err != nil {
		return nil, err
	}
	if len(done) > 0 {
		if _, err := c.st.RemoveDoneInboxItems(ctx, h, done); err != nil {
			c.log.Warn("liveness: inbox items the log claimed were not removed", "session", h.ID, "seqs", done, "err", err)
		}
	}
	return undone, nil
}
