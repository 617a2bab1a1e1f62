package coordinator

import (
	"context"
	"errors"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// endEpoch serves protocol.Subjects.EpochEnd,
// <p>.v1.epochend.<provider>.<childId> (queue group CoordinatorQueue): the
// host that settled an epoch of continuable child childId asks for the part
// of the epoch's end that writes records only coordinators write
// (docs/security.md): the subagent-settled notice into the parent's inbox,
// the removal of the ownership edge owner → childId, the owner's wake-up
// (store.EndEpochRecords). A coordinator carries it out only when the
// request's run is, by its spec (which only coordinators write, with the
// provider of the child's header), an epoch of that child of the provider
// the subject names, and its state under that provider, read from the
// bucket's leader, is settled; the notice's text and the parent come from
// those records, never from the request. A deployment lets only that
// provider's workers publish the subject, so a worker can end only its own
// provider's children's epochs, and only epochs that are over: what its
// host does at every epoch's end. A failed removal of the edge answers
// UNAVAILABLE (the host asks again; every step is idempotent); a notice
// that could not be delivered is logged, as a host did.
func (c *Coordinator) endEpoch(ctx context.Context, req rpc.Request, r protocol.EpochEndRequest) (protocol.Empty, error) {
	provider, child, ok := c.subj.EpochEndOf(req.Subject())
	if !ok || !protocol.ValidID(r.Owner) || !protocol.ValidID(r.RunID) {
		return protocol.Empty{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"an epoch's end names a provider and a child in its subject (%s), and an owner and the settled epoch's runId", c.subj.EpochEnd("<provider>", "<childId>"))
	}
	refused := func(why string) error {
		return protocol.Errorf(protocol.CodeUnauthorized, "the end of an epoch of child %s is not carried out: %s", child, why)
	}
	run, err := c.st.RunLatest(ctx, r.RunID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return protocol.Empty{}, refused("no run " + r.RunID)
	case err != nil:
		return protocol.Empty{}, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", r.RunID, err)
	case run.Value.ChildID != child || run.Value.Provider != provider || run.Value.Mode != protocol.ModeContinuable:
		return protocol.Empty{}, refused("run " + r.RunID + " is no epoch of it")
	case run.Value.State != protocol.RunSettled || run.Value.Result == nil:
		return protocol.Empty{}, refused("its epoch " + r.RunID + " is not settled")
	}
	var kept error
	c.st.EndEpochRecords(ctx, store.EpochEnd{
		ChildID: child, Parent: run.Value.ParentSession, Owner: r.Owner, RunID: r.RunID, Provider: provider,
		Result: *run.Value.Result, AncestorEnded: r.AncestorEnded,
	}, func(err error) {
		if errors.Is(err, store.ErrOwnershipKept) {
			kept = err
			return
		}
		c.log.Warn("epoch end", "child", child, "run", r.RunID, "err", err)
	})
	if kept != nil {
		return protocol.Empty{}, protocol.Errorf(protocol.CodeUnavailable, "%w", kept)
	}
	return protocol.Empty{}, nil
}
