package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// This file holds the two agents.open extensions that `brood acp-agent` needs
// (docs/design.md §6, §7): a root narrowed to the lineage of the delegation it
// serves, so a hop through ACP never resets a depth limit or a tool ceiling,
// and the reopening of a reopenable root after its process restarted
// (`session/load`).
//
// Write order of a reopen: header read (immutable; must carry
// OriginReopenable) → lease Create, or CAS over a lapsed root lease (epoch + 1)
// → the previous incarnation's one-shot runs are disposed. The reopened
// root's client then reads the log and appends, fenced on its last record,
// so a previous incarnation that comes back cannot interleave.

// narrowRoot applies a new root's request options to its header: the
// reopenable marker and, when a lineage is claimed, the narrowest of the
// claim and the claimed parent's own header for depth, depth cap and tool
// ceiling. A claim only ever narrows what a plain root would get.
func (c *Coordinator) narrowRoot(ctx context.Context, h *protocol.SessionHeader, r protocol.AgentsOpenRequest) error {
	if r.Lineage != nil {
		l := *r.Lineage
		bad := func(format string, args ...any) error {
			return protocol.Errorf(protocol.CodeInvalidArgument, "lineage: "+format, args...)
		}
		switch {
		case !protocol.ValidID(l.ParentSession):
			return bad("parentSession must match ^[A-Za-z0-9_-]{1,64}$")
		case l.DelegationDepth < 0 || l.DelegationDepth >= MaxSafeInteger:
			return bad("delegationDepth %d must be a non-negative safe integer", l.DelegationDepth)
		case l.DepthCap != nil && (*l.DepthCap < 0 || *l.DepthCap > MaxSafeInteger):
			return bad("depthCap %d must be a non-negative safe integer", *l.DepthCap)
		}
		p, err := c.headers.get(ctx, c.st, l.ParentSession)
		if errors.Is(err, store.ErrNotFound) {
			return bad("parent session %s does not exist", l.ParentSession)
		}
		if err != nil {
			return protocol.Errorf(protocol.CodeUnavailable, "read the lineage parent's header: %w", err)
		}
		h.ParentSession = p.ID
		h.Origin = protocol.OriginSubagent
		h.DelegationDepth = max(l.DelegationDepth, p.DelegationDepth+1)
		h.DepthCap = narrowerCap(p.DepthCap, l.DepthCap)
		h.ToolCeiling = intersectCeiling(p.ToolCeiling, l.ToolCeiling)
		// The parent's turn limits bind the root's agent too (the ACP hop:
		// docs/protocol.md §5.2, §5.5 "Model and turn limits").
		h.Limits = protocol.NarrowPtr(p.Limits, nil)
		// So does its request timeout: the root's own only tightens it.
		rt, err := protocol.ResolveRequestTimeout(p, h.RequestTimeoutMs)
		if err != nil {
			return err
		}
		h.RequestTimeoutMs = rt
	}
	if r.Reopenable {
		h.Origin = protocol.OriginReopenable
	}
	return nil
}

func narrowerCap(a, b *int64) *int64 {
	switch {
	case a == nil:
		return b
	case b == nil || *a <= *b:
		return a
	default:
		return b
	}
}

// agentsReopen makes a reopenable root live again with a fresh credential:
// the session must have been opened with Reopenable, and no live agent may
// hold it (a lapsed root lease is taken over at once, without waiting for the
// monitor). The previous incarnation's credential is dead from then on.
func (c *Coordinator) agentsReopen(ctx context.Context, r protocol.AgentsOpenRequest) (protocol.AgentsOpenReply, error) {
	id := r.SessionID
	if !protocol.ValidID(id) {
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "sessionId must match ^[A-Za-z0-9_-]{1,64}$")
	}
	if r.Budget != nil {
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "budget is not taken when reopening a root: it keeps the budget it was opened with")
	}
	// Whoever reopens a root becomes it (its credential acts for its
	// children): only a host holding a user grant that covers the root may
	// (a grant over every session, or one of the user who opened it).
	g, err := c.grantOf(ctx, r.Grant)
	if err != nil {
		return protocol.AgentsOpenReply{}, err
	}
	h, err := c.headers.get(ctx, c.st, id)
	if errors.Is(err, store.ErrNotFound) {
		if !g.all {
			return protocol.AgentsOpenReply{}, notCovered(g, id)
		}
		return protocol.AgentsOpenReply{}, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "session " + id})
	}
	if err != nil {
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", id, err)
	}
	if ok, err := g.covers(ctx, c, h); err != nil || !ok {
		if err != nil {
			return protocol.AgentsOpenReply{}, err
		}
		return protocol.AgentsOpenReply{}, notCovered(g, id)
	}
	if h.Origin != protocol.OriginReopenable {
		return protocol.AgentsOpenReply{}, protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": id,
			"reason": "it was not opened as a reopenable root; only roots opened with reopenable can be reopened"})
	}
	now := store.NowMs()
	cred := protocol.NewCredential()
	lease := protocol.AgentRecord{
		SessionID: id, Kind: protocol.AgentRoot, HostID: RootHostID, Epoch: 1,
		CredentialHash: protocol.HashCredential(cred), ExpiresAt: now + c.cfg.RootLease.Milliseconds(), CreatedAt: now,
		User: h.User, HeaderDigest: protocol.HeaderDigest(h),
	}
	cur, err := c.st.Lease(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		_, err = c.st.CreateLease(ctx, lease)
	case err != nil:
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", id, err)
	case cur.Value.Kind == protocol.AgentRoot && cur.Value.ExpiresAt <= now:
		lease.Epoch = cur.Value.Epoch + 1
		_, err = c.st.UpdateLease(ctx, lease, cur.Revision)
	default:
		wait := time.Duration(max(cur.Value.ExpiresAt-now, 0)) * time.Millisecond
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeUnavailable,
			"session %s is live in another process (its lease lapses in %s); close it there, or retry once the lease lapsed", id, wait.Round(time.Millisecond))
	}
	if errors.Is(err, store.ErrConflict) {
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeUnavailable, "another process reopened session %s at the same moment; retry", id)
	}
	if err != nil {
		return protocol.AgentsOpenReply{}, protocol.Errorf(protocol.CodeUnavailable, "reopen %s: %w", id, err)
	}
	c.agents.del(store.RootLeaseKey(id))
	c.disposeRunsOf(context.WithoutCancel(ctx), id)
	return protocol.AgentsOpenReply{SessionID: id, Credential: cred, LeaseMs: c.cfg.RootLease.Milliseconds(), ExpiresAt: lease.ExpiresAt}, nil
}

// disposeRunsOf disposes, in the background, the one-shot runs a previous
// incarnation of parent left: the set is taken now, before the new
// incarnation can start any.
func (c *Coordinator) disposeRunsOf(ctx context.Context, parent string) {
	var orphans []leaseState
	for _, l := range c.agents.snapshot() {
		if l.rec.Kind == protocol.AgentOneShot && l.rec.ParentSession == parent {
			orphans = append(orphans, l)
		}
	}
	if len(orphans) == 0 {
		return
	}
	go func() {
		for _, l := range orphans {
			if c.claim(l.rec.SessionID) {
				c.disposeOrphan(ctx, l)
				c.release(l.rec.SessionID)
			}
		}
	}()
	c.log.Info(fmt.Sprintf("disposing %d one-shot runs of a reopened root's previous incarnation", len(orphans)), "session", parent)
}
