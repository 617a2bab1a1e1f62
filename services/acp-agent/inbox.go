package acpagent

import (
	"context"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// A session's root receives the settlement notices and reports of the
// background children its agent started (run_in_background). The session
// consumes them as upstream does when a notice wakes a parent: one that
// arrives while a turn runs joins it at its next step; one that arrives
// while the agent is idle starts a turn of its own, unprompted, whose
// updates the editor sees (the notice as the user's side, then the agent's
// answer). Each item is claimed into the root's log (agent/inbox/dequeue)
// before it is used and acknowledged (deleted) after, through the
// coordinator's inbox endpoints, exactly like a continuable child's inbox.

// InboxWait is how long one long poll of the root's inbox waits.
const InboxWait = 30 * time.Second

// inboxRetryWait is the pause after a failed inbox read.
const inboxRetryWait = time.Second

// rootInbox is the root's inbox as the agent runtime reads it
// (agent.Inbox), over inbox.read and inbox.ack with the root's credential.
type rootInbox struct{ root *client.Root }

// Pending returns every pending item after inbox sequence after, oldest first.
func (in rootInbox) Pending(ctx context.Context, after protocol.Seq) ([]protocol.InboxItem, error) {
	var out []protocol.InboxItem
	req := protocol.InboxReadRequest{AfterSeq: after, ItemsMax: protocol.InboxPageItemsMax}
	for {
		page, err := in.root.Inbox(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if !page.More || len(page.Items) == 0 {
			return out, nil
		}
		req.AfterSeq = page.Items[len(page.Items)-1].Seq
	}
}

// Remove acknowledges items whose claim is logged.
func (in rootInbox) Remove(ctx context.Context, seqs ...protocol.Seq) error {
	for len(seqs) > 0 {
		n := min(len(seqs), protocol.InboxAckSeqsMax)
		if _, err := in.root.Ack(ctx, protocol.InboxAckRequest{Seqs: seqs[:n]}); err != nil {
			return err
		}
		seqs = seqs[n:]
	}
	return nil
}

// watch starts the session's inbox watcher and the watch of its tree's
// requests (requests.go); close stops them.
func (ss *session) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	ss.stopWatch = cancel
	ss.watching.Add(2)
	go func() {
		defer ss.watching.Done()
		ss.watchInbox(ctx)
	}()
	go func() {
		defer ss.watching.Done()
		ss.watchRequests(ctx)
	}()
}

// watchInbox runs the pending items as turns, then long-polls the inbox for
// the next one, until ctx ends.
func (ss *session) watchInbox(ctx context.Context) {
	log := ss.s.log.With("session", ss.id)
	var seen protocol.Seq
	for ctx.Err() == nil {
		for ctx.Err() == nil && ss.noticeTurn(ctx) {
		}
		page, err := ss.root.Inbox(ctx, protocol.InboxReadRequest{AfterSeq: seen, ItemsMax: 1, WaitMs: InboxWait.Milliseconds()})
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("could not read the root's inbox; retrying", "err", err)
				sleep(ctx, inboxRetryWait)
			}
			continue
		}
		for _, it := range page.Items {
			seen = max(seen, it.Seq)
		}
	}
}

// noticeTurn claims the oldest waking item as a new turn and runs it; false
// when nothing was waiting (or the session is closing).
func (ss *session) noticeTurn(ctx context.Context) bool {
	claimed := false
	out, err := ss.turn(ctx, func(tctx context.Context) agent.Outcome {
		out, ok, err := ss.agent.ClaimNext(tctx, ss.inbox)
		if err != nil {
			ss.s.log.Warn("could not claim from the root's inbox", "session", ss.id, "err", err)
			return out
		}
		if !ok {
			return out
		}
		claimed = true
		return ss.agent.RunSteps(tctx)
	})
	if err != nil || !claimed {
		return false
	}
	if out.Fenced || out.Err != nil {
		ss.s.log.Warn("a turn started by a notice could not be logged",
			"session", ss.id, "fenced", out.Fenced, "err", out.Err)
		return false
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
