package coordinator

import (
	"context"
	"errors"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// removeInboxItems serves protocol.Subjects.InboxRemove,
// <p>.v1.inboxremove.<provider>.<sessionId> (queue group CoordinatorQueue):
// the host of child sessionId asks for the deletion of the inbox items its
// log claimed or discarded. A coordinator deletes them only for a child
// whose header (which only coordinators write) names the provider the
// subject names, and only the items the child's log records as done
// (store.RemoveDoneInboxItems). A deployment lets only that provider's
// workers publish the subject and no worker delete a BROOD_INBOX message
// itself (docs/security.md), so a worker cannot lose an accepted message
// of any session: what it can delete is what a log of its own provider
// already names.
func (c *Coordinator) removeInboxItems(ctx context.Context, req rpc.Request, r protocol.InboxRemoveRequest) (protocol.InboxAckReply, error) {
	provider, id, ok := c.subj.InboxRemoveOf(req.Subject())
	if !ok || len(r.Seqs) == 0 || len(r.Seqs) > protocol.InboxAckSeqsMax {
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"an inbox removal names a provider and a session in its subject (%s), and 1 to %d inbox sequences", c.subj.InboxRemove("<provider>", "<sessionId>"), protocol.InboxAckSeqsMax)
	}
	h, err := c.headers.get(ctx, c.st, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeUnauthorized, "no inbox item of %s is removed: no child %s of provider %s", id, id, provider)
	case err != nil:
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", id, err)
	case h.Provider != provider:
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeUnauthorized, "no inbox item of %s is removed: no child %s of provider %s", id, id, provider)
	}
	n, err := c.st.RemoveDoneInboxItems(ctx, h, r.Seqs)
	if err != nil {
		if protocol.CodeOf(err) != "" {
			return protocol.InboxAckReply{}, err
		}
		return protocol.InboxAckReply{}, protocol.Errorf(protocol.CodeUnavailable, "%w", err)
	}
	return protocol.InboxAckReply{Removed: n}, nil
}
