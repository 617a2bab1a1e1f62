package worker

import (
	"context"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// inboxOf is the inbox of child h as its host uses it: read with direct
// gets, and its claimed or discarded items deleted by the coordinators,
// which only they do in a deployment (docs/security.md): the host asks on
// protocol.Subjects.InboxRemove under the child's provider (its header's),
// at most protocol.InboxAckSeqsMax sequences a request, and a coordinator
// deletes only what the child's log records as done. A removal that fails
// leaves the items, which every later read skips by their logged claims and
// asks to remove again (agent.UnclaimedOf): so each request is tried once,
// within InboxRemoveTimeout, and none holds up the turn it follows longer
// (no coordinator answering fails at once).
func (h *Host) inboxOf(header protocol.SessionHeader) *store.SessionInbox {
	subject := h.subj.InboxRemove(header.Provider, header.ID)
	return h.st.InboxOf(header.Scope(), header.ID).RemovedBy(func(ctx context.Context, seqs []protocol.Seq) error {
		ctx, cancel := context.WithTimeout(ctx, InboxRemoveTimeout)
		defer cancel()
		for len(seqs) > 0 {
			n := min(len(seqs), protocol.InboxAckSeqsMax)
			if err := rpc.Call(ctx, h.cfg.NC, subject, protocol.InboxRemoveRequest{Seqs: seqs[:n]}, &protocol.InboxAckReply{}); err != nil {
				return err
			}
			seqs = seqs[n:]
		}
		return nil
	})
}
