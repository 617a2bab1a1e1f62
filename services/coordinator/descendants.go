package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// descendantsDispose serves descendants.dispose: an agent (with its own
// credential; its lease may be ending) has its live continuable descendants
// disposed, child first, and the answer comes once they all stopped. A
// one-shot run's host sends it when the run's turn is over, before the run
// settles (internal/worker/ending.go, issue 14).
func (c *Coordinator) descendantsDispose(ctx context.Context, req rpc.Request, r protocol.DescendantsDisposeRequest) (protocol.DrainReply, error) {
	if err := c.authorizeSelf(ctx, r.Agent); err != nil {
		return protocol.DrainReply{}, err
	}
	return c.disposeDescendants(ctx, r.Agent.SessionID)
}

// DescendantsVisitedMax bounds the sessions one descendants walk visits.
const DescendantsVisitedMax = 10000

// disposeDescendants disposes the live continuable descendants of id, child
// first: the deepest level first, the activations of one level in parallel.
// They are found by walking the child index from id (exact: a continuable
// child is indexed before its activation exists) and, for entries written off
// the start's path that may lag, by the leases this replica knows whose
// ancestry names id; each lease is read fresh.
func (c *Coordinator) disposeDescendants(ctx context.Context, id string) (protocol.DrainReply, error) {
	found, err := c.liveSubtree(ctx, id, func(rec protocol.AgentRecord) bool { return rec.Kind == protocol.AgentContinuable })
	if err != nil {
		return protocol.DrainReply{}, err
	}
	reply := c.disposeLevels(ctx, found, func(ctx context.Context, rec protocol.AgentRecord) error {
		return c.disposeActivation(ctx, rec.HostID, rec.SessionID, protocol.CauseParent)
	})
	if len(reply.Failed) > 0 {
		return reply, protocol.NewError(protocol.CodeActivationTeardownFailed, map[string]any{
			"reason": fmt.Sprintf("%d descendants of %s did not stop: %s", len(reply.Failed), id, strings.Join(reply.Failed, ", "))})
	}
	if len(reply.Disposed) > 0 {
		c.log.Info("an agent's end disposed its descendants", "session", id, "disposed", len(reply.Disposed))
	}
	return reply, nil
}

// liveSubtree returns the live leases under id (not id's own) that
// include accepts. They are found by walking the child index from id
// (exact: a child is indexed before its activation exists) and, for
// entries written off the start's path that may lag, by the leases this
// replica knows whose ancestry names id; each lease is read fresh. At most
// DescendantsVisitedMax sessions are visited.
func (c *Coordinator) liveSubtree(ctx context.Context, id string, include func(protocol.AgentRecord) bool) (map[string]protocol.AgentRecord, error) {
	found := map[string]protocol.AgentRecord{}
	consider := func(rec protocol.AgentRecord) {
		if include(rec) && c.leaseLive(rec) {
			found[rec.SessionID] = rec
		}
	}
	visited := map[string]bool{id: true}
	queue := []string{id}
	for len(queue) > 0 && len(visited) < DescendantsVisitedMax {
		p := queue[0]
		queue = queue[1:]
		idx, err := c.st.ChildIndex(ctx, p)
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "read the child index of %s: %w", p, err)
		}
		for _, e := range idx {
			if visited[e.ChildID] {
				continue
			}
			visited[e.ChildID] = true
			queue = append(queue, e.ChildID)
			l, err := c.st.Lease(ctx, e.ChildID)
			if err == nil {
				consider(l.Value)
			} else if !errors.Is(err, store.ErrNotFound) {
				return nil, protocol.Errorf(protocol.CodeUnavailable, "read the lease of %s: %w", e.ChildID, err)
			}
		}
	}
	for _, l := range c.agents.snapshot() {
		if _, ok := found[l.rec.SessionID]; !ok && contains(l.rec.Ancestry, id) {
			if fresh, err := c.st.Lease(ctx, l.rec.SessionID); err == nil {
				consider(fresh.Value)
			}
		}
	}
	return found, nil
}

// disposeLevels disposes the sessions of found with dispose, child first:
// the deepest level first, the sessions of one level in parallel. The
// reply lists the disposed and the failed, child first.
func (c *Coordinator) disposeLevels(ctx context.Context, found map[string]protocol.AgentRecord, dispose func(context.Context, protocol.AgentRecord) error) protocol.DrainReply {
	levels := map[int][]protocol.AgentRecord{}
	for _, rec := range found {
		levels[len(rec.Ancestry)] = append(levels[len(rec.Ancestry)], rec)
	}
	depths := make([]int, 0, len(levels))
	for d := range levels {
		depths = append(depths, d)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(depths)))
	reply := protocol.DrainReply{Disposed: []string{}}
	for _, d := range depths {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		for _, rec := range levels[d] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := dispose(ctx, rec)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					c.log.Warn("descendant not disposed", "session", rec.SessionID, "err", err)
					reply.Failed = append(reply.Failed, rec.SessionID)
					return
				}
				reply.Disposed = append(reply.Disposed, rec.SessionID)
			}()
		}
		wg.Wait()
	}
	return reply
}

// endedAncestor returns the first of lineage (root first) that is an ended
// one-shot agent (store.EndedAncestor), as a NOT_RESUMABLE error.
func (c *Coordinator) endedAncestor(ctx context.Context, childID string, lineage []string) error {
	anc, err := c.st.EndedAncestor(ctx, lineage)
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "read the lineage of %s: %w", childID, err)
	}
	if anc != "" {
		return protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": childID,
			"reason": "its ancestor " + anc + " was a one-shot run that ended, and a run's end ends every session under it (docs/protocol.md, a parent's end)"})
	}
	return nil
}
