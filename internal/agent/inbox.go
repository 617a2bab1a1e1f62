package agent

import (
	"context"
	"fmt"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Inbox is a session's pending items as the runtime reads them;
// *store.SessionInbox is the JetStream one (DESIGN.md §4).
type Inbox interface {
	// Pending returns the items above sequence after, oldest first.
	Pending(ctx context.Context, after protocol.Seq) ([]store.InboxItem, error)
	// Remove deletes items whose claim or discard is logged.
	Remove(ctx context.Context, seqs ...protocol.Seq) error
}

// InboxCursor reads from a log how far the inbox was seen (the highest
// sequence named by any inbox event) and claimed (the highest sequence
// dequeued or discarded). Everything at or below claimed is done, whatever
// the inbox stream still holds, so an item is claimed exactly once even when
// its delivery repeats or the agent is rebuilt from its log right after it
// logged a claim.
func InboxCursor(events []protocol.SessionEvent) (seen, claimed protocol.Seq) {
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvInboxEnqueue:
			var d protocol.InboxEnqueueData
			if ev.Decode(&d) == nil && d.InboxSeq > seen {
				seen = d.InboxSeq
			}
		case protocol.EvInboxDequeue:
			var d protocol.InboxDequeueData
			if ev.Decode(&d) == nil && d.InboxSeq > claimed {
				claimed = d.InboxSeq
			}
		case protocol.EvInboxDiscard:
			var d protocol.InboxDiscardData
			if ev.Decode(&d) == nil && d.InboxSeq > claimed {
				claimed = d.InboxSeq
			}
		}
	}
	return max(seen, claimed), claimed
}

func (a *Agent) cursor() (seen, claimed protocol.Seq) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return InboxCursor(a.events)
}

// unclaimed returns the pending items above the claim cursor, and removes
// leftovers at or below it (claimed by a predecessor that died before
// deleting them).
func (a *Agent) unclaimed(ctx context.Context, in Inbox) ([]store.InboxItem, protocol.Seq, error) {
	seen, claimed := a.cursor()
	items, err := in.Pending(ctx, 0)
	if err != nil {
		return nil, seen, err
	}
	var out []store.InboxItem
	var stale []protocol.Seq
	for _, it := range items {
		if it.Seq <= claimed {
			stale = append(stale, it.Seq)
			continue
		}
		out = append(out, it)
	}
	if len(stale) > 0 {
		if err := in.Remove(ctx, stale...); err != nil {
			a.log.Warn("could not remove claimed inbox items", "err", err)
		}
	}
	return out, seen, nil
}

// ClaimNext opens a turn with the oldest unclaimed inbox item: the opening
// record logs the claim (agent/inbox/dequeue, preceded by enqueue if the item
// was never seen) before the turn uses it, then the item leaves the inbox.
// claimed is false when the inbox is empty.
func (a *Agent) ClaimNext(ctx context.Context, in Inbox) (out Outcome, claimed bool, err error) {
	items, seen, err := a.unclaimed(ctx, in)
	if err != nil || len(items) == 0 {
		return Outcome{}, false, err
	}
	it := items[0]
	var extra eventBuf
	if it.Seq > seen {
		extra.add(a, protocol.EvInboxEnqueue, protocol.InboxEnqueueData{MessageID: it.MessageID, InboxSeq: it.Seq, Source: it.Source})
	}
	if extra.err != nil {
		return Outcome{}, false, extra.err
	}
	out, ok := a.OpenTurn(ctx, Input{
		Content: it.Content, Source: it.Source, MessageID: it.MessageID, InboxSeq: it.Seq, Before: extra.evs,
	})
	if !ok {
		return out, false, nil
	}
	if err := in.Remove(ctx, it.Seq); err != nil {
		a.log.Warn("claimed inbox item not removed; it is skipped by its logged claim", "seq", it.Seq, "err", err)
	}
	return out, true, nil
}

// NoteEnqueued logs agent/inbox/enqueue for items that arrived since the
// agent last looked (while it runs a turn, so the log shows what was waiting).
func (a *Agent) NoteEnqueued(ctx context.Context, in Inbox) error {
	items, seen, err := a.unclaimed(ctx, in)
	if err != nil {
		return err
	}
	var b eventBuf
	for _, it := range items {
		if it.Seq > seen {
			b.add(a, protocol.EvInboxEnqueue, protocol.InboxEnqueueData{MessageID: it.MessageID, InboxSeq: it.Seq, Source: it.Source})
		}
	}
	if b.err != nil || len(b.evs) == 0 {
		return b.err
	}
	if out, ok := a.append(ctx, 0, b.evs); !ok {
		return fmt.Errorf("log inbox enqueue: %w", outcomeErr(out))
	}
	return nil
}

// DiscardPending drops every unclaimed item unrun: agent/inbox/discard after
// its enqueue, then the item leaves the inbox. It returns how many it dropped.
func (a *Agent) DiscardPending(ctx context.Context, in Inbox, reason string) (int, error) {
	items, seen, err := a.unclaimed(ctx, in)
	if err != nil || len(items) == 0 {
		return 0, err
	}
	var b eventBuf
	seqs := make([]protocol.Seq, 0, len(items))
	for _, it := range items {
		if it.Seq > seen {
			b.add(a, protocol.EvInboxEnqueue, protocol.InboxEnqueueData{MessageID: it.MessageID, InboxSeq: it.Seq, Source: it.Source})
		}
		b.add(a, protocol.EvInboxDiscard, protocol.InboxDiscardData{MessageID: it.MessageID, InboxSeq: it.Seq, Reason: reason})
		seqs = append(seqs, it.Seq)
	}
	if b.err != nil {
		return 0, b.err
	}
	if out, ok := a.append(ctx, 0, b.evs); !ok {
		return 0, fmt.Errorf("log inbox discard: %w", outcomeErr(out))
	}
	if err := in.Remove(ctx, seqs...); err != nil {
		a.log.Warn("discarded inbox items not removed; they are skipped by their logged discard", "err", err)
	}
	return len(items), nil
}

func outcomeErr(o Outcome) error {
	switch {
	case o.Fenced:
		return store.ErrFenced
	case o.Err != nil:
		return o.Err
	default:
		return fmt.Errorf("append refused")
	}
}
