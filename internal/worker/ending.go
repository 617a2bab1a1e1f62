package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A parent's end (docs/design.md §14; RELIABILITY.md I5; issue 14). A one-shot run
// is one unit of work: when its turn is over — completed, failed, disposed,
// cancelled — its live descendants are disposed, child first, before the run
// settles (so before runs.dispose answers): every continuable descendant's
// activation ends its epoch `aborted` (cause `parent`) and its accepted but
// unclaimed inbox items are discarded (logged agent/inbox/discard), and the
// one-shot runs those descendants started are disposed with them by their own
// subagent tools. Nothing under an ended one-shot run starts work again: an
// activation of such a descendant (a cold resume, the liveness sweep, a
// start that raced with the end) discards what is pending and settles
// without running a turn, and followups to it are refused (NOT_RESUMABLE).
//
// Order, so that a descendant being created at that moment is reached too:
// (1) the run's lease is marked Ending (it authorizes nothing from then on:
// no new child of it is admitted); (2) descendants.dispose walks the child
// index from the run and disposes every live continuable descendant; (3) the
// run settles and its lease goes. A descendant whose lease was created before
// (2) read it is disposed by (2); one created after it finds its ended
// ancestor when its activation starts.
//
// Roots are the exception: a root stands for the user, so closing one (or
// its lease lapsing) disposes its one-shot runs, while its continuable
// children live on as the user's (`brood start`); `brood drain --parent`
// ends them. A continuable parent cannot settle while it owns live children,
// and its drain disposes its descendants child first.

// DescendantsDisposeTimeout bounds the wait of a run's host for the
// coordinator to dispose the run's descendants.
const DescendantsDisposeTimeout = 30 * time.Second

// Delegator is implemented by sessions that can tell whether they started
// children (*agent.Agent): only those need their descendants disposed.
type Delegator interface{ Delegated() bool }

// endDescendants runs steps (1) and (2) of a one-shot run's end (see above).
// It reports false when the run's lease changed hands (a coordinator took it
// over): the host then publishes nothing.
func (h *Host) endDescendants(r *hostedRun) bool {
	r.mu.Lock()
	lease, rev := r.lease, r.leaseRev
	r.mu.Unlock()
	lease.Ending = true
	ctx, cancel := context.WithTimeout(context.Background(), LeaseWriteTimeout)
	newRev, err := h.st.UpdateLease(ctx, lease, rev)
	cancel()
	switch {
	case errors.Is(err, store.ErrConflict):
		h.log.Warn("the run's lease changed hands before it ended; publishing nothing", "session", r.childID, "run", r.runID)
		return false
	case err != nil:
		// Admission stays open a moment longer; the descendants are still
		// disposed, and their activations check their ancestors.
		h.log.Warn("could not mark the run's lease ending", "session", r.childID, "err", err)
	default:
		r.mu.Lock()
		r.lease, r.leaseRev = lease, newRev
		r.mu.Unlock()
	}
	dctx, dcancel := context.WithTimeout(context.Background(), DescendantsDisposeTimeout)
	defer dcancel()
	var reply protocol.DrainReply
	// A coordinator that is away (restarting) is waited for, within the
	// bound: the run must not settle while its descendants still work. On
	// the worker's own user subject, like its agents' calls (pkg/client).
	err = callWhileUnavailable(dctx, h.cfg.NC, h.subj.Call(h.cfg.NC.Opts.User, protocol.EpDescendantsDispose),
		protocol.DescendantsDisposeRequest{Agent: protocol.ParentRef{SessionID: r.childID, Credential: r.cred}}, &reply)
	if err != nil {
		h.log.Error("could not dispose the run's descendants", "session", r.childID, "run", r.runID, "err", err)
	} else if len(reply.Disposed) > 0 {
		h.log.Info("the run's end disposed its descendants", "session", r.childID, "disposed", len(reply.Disposed))
	}
	return true
}

// discardPending drops every unclaimed item of a continuable session unrun,
// logging agent/inbox/enqueue (when unseen) and agent/inbox/discard for each
// before it leaves the inbox (docs/design.md §5: accepted work dropped unrun is
// logged). It returns how many it dropped.
func discardPending(ctx context.Context, sess ContinuableSession, in agent.Inbox, reason string) (int, error) {
	items, err := sess.Unclaimed(ctx, in)
	if err != nil || len(items) == 0 {
		return 0, err
	}
	seen := sess.InboxLog().Seen
	now := store.NowMs()
	var evs []protocol.SessionEvent
	seqs := make([]protocol.Seq, 0, len(items))
	for _, it := range items {
		if !seen[it.Seq] {
			ev, err := protocol.NewEvent(protocol.EvInboxEnqueue, now, protocol.InboxEnqueueData{MessageID: it.MessageID, InboxSeq: it.Seq, Source: it.Source})
			if err != nil {
				return 0, err
			}
			evs = append(evs, ev)
		}
		ev, err := protocol.NewEvent(protocol.EvInboxDiscard, now, protocol.InboxDiscardData{MessageID: it.MessageID, InboxSeq: it.Seq, Reason: reason})
		if err != nil {
			return 0, err
		}
		evs = append(evs, ev)
		seqs = append(seqs, it.Seq)
	}
	if err := sess.Append(ctx, evs...); err != nil {
		return 0, err
	}
	if err := in.Remove(ctx, seqs...); err != nil {
		return len(items), fmt.Errorf("discarded items not removed (their logged discard skips them): %w", err)
	}
	return len(items), nil
}

// callWhileUnavailable is rpc.Call of subject, called again while the
// answer is UNAVAILABLE (no coordinator answered in time, or one could not
// read the store: an election), attempt n after n×RetryBackoffStep (at most
// RetryBackoffMax), until ctx is done; it returns the last answer.
func callWhileUnavailable(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	for attempt := 1; ; attempt++ {
		err := rpc.Call(ctx, nc, subject, req, reply)
		if err == nil || protocol.CodeOf(err) != protocol.CodeUnavailable {
			return err
		}
		t := time.NewTimer(min(time.Duration(attempt)*RetryBackoffStep, RetryBackoffMax))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
