package coordinator

import (
	"context"
	"errors"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Reads across providers for worker hosts (docs/security.md, What comes
// next, items 2 and 4): a worker of provider p reads no session header and
// no log but its own provider's children's; what it needs beyond them (a
// fork child's seed from its parent's log, whether an ancestor of its child
// ended) it asks here, on <p>.v1.read.<provider>.<kind>.<childId>
// (protocol.Subjects.Read), which a deployment lets only provider's workers
// publish. Each answer is only what the child named allows: its header
// (written once, by a coordinator) must name the provider the subject
// names.

// ownChild reads child's header for a read on provider's subject: a child
// whose header names another provider, or none, is UNAUTHORIZED (whether or
// not it exists).
func (c *Coordinator) ownChild(ctx context.Context, provider, child, what string) (protocol.SessionHeader, error) {
	h, err := c.headers.get(ctx, c.st, child)
	switch {
	case errors.Is(err, store.ErrNotFound) || (err == nil && (h.Provider != provider || h.ParentSession == "")):
		return h, protocol.Errorf(protocol.CodeUnauthorized, "no %s is read for %s: no child %s of provider %s", what, child, child, provider)
	case err != nil:
		return h, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", child, err)
	}
	return h, nil
}

// forkSeed serves protocol.Subjects.Read(provider, ReadForkSeed, childId)
// (queue group CoordinatorQueue): a page of the fork parent's log below the
// child's fork point, for a child whose header names the provider, the
// parent the request names and a seed (protocol.ForkSeedRequest). Pages are
// sessions.log's (store.ReadLogPage, under the server's max payload), cut at
// the fork point: nothing of the parent's log at or past it is answered.
func (c *Coordinator) forkSeed(ctx context.Context, req rpc.Request, r protocol.ForkSeedRequest) (protocol.LogPage, error) {
	provider, child, ok := c.subj.ReadOf(req.Subject(), protocol.ReadForkSeed)
	if !ok || !protocol.ValidID(r.Parent) || r.FromSeq < 0 {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"a fork seed read names a provider and a child in its subject (%s), the child's parent, and a fromSeq not negative", c.subj.Read("<provider>", protocol.ReadForkSeed, "<childId>"))
	}
	h, err := c.ownChild(ctx, provider, child, "fork seed")
	if err != nil {
		return protocol.LogPage{}, err
	}
	if h.ParentSession != r.Parent || h.SeedLength <= 0 {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeUnauthorized, "no fork seed is read for %s: no fork child %s of %s of provider %s", child, child, r.Parent, provider)
	}
	if r.FromSeq >= h.SeedLength {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeUnauthorized, "no event of %s at or past %s's fork point %d is read (fromSeq %d)", r.Parent, child, h.SeedLength, r.FromSeq)
	}
	ph, err := c.headerFor(ctx, r.Parent)
	if err != nil {
		return protocol.LogPage{}, err
	}
	eventsMax := min(int64(clamp(r.EventsMax, protocol.LogPageEventsDefault, protocol.LogPageEventsMax)), h.SeedLength-r.FromSeq)
	page, err := c.st.ReadLogPage(ctx, ph.Scope(), ph.ID, r.FromSeq, r.Cursor, int(eventsMax), protocol.ReadPageBytesMax)
	if err != nil {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", ph.ID, err)
	}
	// eventsMax already stops the page at the fork point; what a log that
	// is not contiguous might hold past it is never answered.
	for i, ev := range page.Events {
		if ev.Seq >= h.SeedLength {
			page.Events = page.Events[:i]
			break
		}
	}
	page.Complete = page.NextSeq >= h.SeedLength
	if !page.Complete && len(page.Events) == 0 {
		return protocol.LogPage{}, protocol.Errorf(protocol.CodeInternal, "the log of %s ends at event %d, before %s's fork point %d", ph.ID, page.NextSeq, child, h.SeedLength)
	}
	return page, nil
}

// ancestry serves protocol.Subjects.Read(provider, ReadAncestry, childId)
// (queue group CoordinatorQueue): the first ancestor of a child of the
// provider (from the headers, root first) that is an ended one-shot run
// (store.EndedAncestor), so the worker reads no ancestor's header, child
// index entry, lease or log.
func (c *Coordinator) ancestry(ctx context.Context, req rpc.Request, _ protocol.Empty) (protocol.AncestryReply, error) {
	provider, child, ok := c.subj.ReadOf(req.Subject(), protocol.ReadAncestry)
	if !ok {
		return protocol.AncestryReply{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"an ancestry read names a provider and a child in its subject (%s)", c.subj.Read("<provider>", protocol.ReadAncestry, "<childId>"))
	}
	h, err := c.ownChild(ctx, provider, child, "ancestry")
	if err != nil {
		return protocol.AncestryReply{}, err
	}
	up, err := c.lineage(ctx, h)
	if err != nil {
		return protocol.AncestryReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the ancestry of %s: %w", child, err)
	}
	anc, err := c.st.EndedAncestor(ctx, up)
	if err != nil {
		return protocol.AncestryReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the lineage of %s: %w", child, err)
	}
	return protocol.AncestryReply{EndedAncestor: anc}, nil
}

// parentCompleted returns the length of parent's balanced completed-turn
// prefix (the seed of a fork child started now: docs/upstream-behaviour.md §3.6),
// checked to replay, for a provider's prepare (ProviderPrepareRequest).
func (c *Coordinator) parentCompleted(ctx context.Context, parent protocol.SessionHeader) (int64, error) {
	log, err := c.st.ReadLog(ctx, parent.Scope(), parent.ID)
	if err != nil {
		return 0, protocol.Errorf(protocol.CodeUnavailable, "read the parent's log: %w", err)
	}
	n := sessionlog.CompletedPrefix(log.Events)
	if err := sessionlog.ValidateReplay(log.Events[:n], false); err != nil {
		return 0, protocol.Errorf(protocol.CodeInternal, "the parent's history does not replay: %w", err)
	}
	return int64(n), nil
}
