package coordinator

import (
	"context"
	"errors"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// releaseOwnership serves protocol.Subjects.Ownership,
// <p>.v1.ownership.<provider>.<childId> (queue group CoordinatorQueue): the
// host that settled an epoch of continuable child childId asks for the
// edge owner → childId to go (store.EndEpoch). Only coordinators write
// ownership records (docs/security.md), and a coordinator removes the edge
// only when the request's run is an epoch of that child of the provider
// the subject names, by its spec (which only coordinators write, with the
// provider of the child's header), and its state under that provider is
// settled (store.RunLatest, the bucket's leader). A deployment lets only
// that provider's workers publish the subject, so a worker can end the
// ownership of its own provider's children only, and only of an epoch that
// is over: what its host does at every epoch's end. Then it removes the
// edge and wakes the owner (store.ReleaseOwnership).
func (c *Coordinator) releaseOwnership(ctx context.Context, req rpc.Request, r protocol.OwnershipReleaseRequest) (protocol.Empty, error) {
	provider, child, ok := c.subj.OwnershipOf(req.Subject())
	if !ok || !protocol.ValidID(r.Owner) || !protocol.ValidID(r.RunID) {
		return protocol.Empty{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"an ownership release names a provider and a child in its subject (%s), and an owner and the settled epoch's runId", c.subj.Ownership("<provider>", "<childId>"))
	}
	refused := func(why string) error {
		return protocol.Errorf(protocol.CodeUnauthorized, "the ownership of child %s stays: %s", child, why)
	}
	run, err := c.st.RunLatest(ctx, r.RunID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return protocol.Empty{}, refused("no run " + r.RunID)
	case err != nil:
		return protocol.Empty{}, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", r.RunID, err)
	case run.Value.ChildID != child || run.Value.Provider != provider || run.Value.Mode != protocol.ModeContinuable:
		return protocol.Empty{}, refused("run " + r.RunID + " is no epoch of it")
	case run.Value.State != protocol.RunSettled:
		return protocol.Empty{}, refused("its epoch " + r.RunID + " is not settled")
	}
	if err := c.st.ReleaseOwnership(ctx, r.Owner, child); err != nil {
		return protocol.Empty{}, protocol.Errorf(protocol.CodeUnavailable, "remove the ownership edge %s → %s: %w", r.Owner, child, err)
	}
	return protocol.Empty{}, nil
}
