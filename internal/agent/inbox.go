package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider/contract"
)

// Inbox is a session's pending items as the runtime reads them;
// *store.SessionInbox is the JetStream one (docs/design.md §4). It is the
// provider SDK's (pkg/provider/contract).
type Inbox = contract.Inbox

// InboxLog returns what the session's log says of its inbox items, read
// from the agent's Index (a copy).
func (a *Agent) InboxLog() InboxLog {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.index.InboxLog()
}

// Unclaimed returns the pending items not yet claimed or discarded, oldest
// first, and removes leftovers already done (claimed by a predecessor that
// died before deleting them).
func (a *Agent) Unclaimed(ctx context.Context, in Inbox) ([]store.InboxItem, error) {
	return UnclaimedOf(ctx, a.InboxLog(), in, a.log)
}

// UnclaimedOf is Unclaimed for any session, given what its log says of its
// inbox (Index.InboxLog). An item is
// done when its sequence or its messageId was claimed or discarded: it is
// removed. A later copy of a pending item (same messageId) is skipped, and
// removed once the first copy's claim is logged (it is then done by its
// messageId): only an item its log names may leave an inbox, since a
// coordinator deletes nothing else (store.RemoveDoneInboxItems). So a
// message stored twice (store.KeyedMessageID) runs once.
func UnclaimedOf(ctx context.Context, il InboxLog, in Inbox, log *slog.Logger) ([]store.InboxItem, error) {
	done, doneIDs := il.Done, il.DoneIDs
	items, err := in.Pending(ctx, 0)
	if err != nil {
		return nil, err
	}
	var out []store.InboxItem
	var stale []protocol.Seq
	pending := map[string]bool{}
	for _, it := range items {
		if done[it.Seq] || (it.MessageID != "" && doneIDs[it.MessageID]) {
			stale = append(stale, it.Seq)
			continue
		}
		if it.MessageID != "" && pending[it.MessageID] {
			continue // a copy: it goes once the first copy's claim is logged
		}
		pending[it.MessageID] = true
		out = append(out, it)
	}
	if len(stale) > 0 {
		if err := in.Remove(ctx, stale...); err != nil {
			log.Warn("could not remove claimed inbox items", "err", err)
		}
	}
	return out, nil
}

func (a *Agent) unclaimed(ctx context.Context, in Inbox) ([]store.InboxItem, map[protocol.Seq]bool, error) {
	il := a.InboxLog()
	items, err := UnclaimedOf(ctx, il, in, a.log)
	return items, il.Seen, err
}

// TurnOpener is what claiming a turn needs of a session: what its log says
// of its inbox and a way to open a turn (*Agent, the ACP bridge's session).
type TurnOpener interface {
	InboxLog() InboxLog
	OpenTurn(ctx context.Context, in Input) (Outcome, bool)
}

// ClaimNext opens a turn with the oldest unclaimed inbox item that wakes the
// agent (next-turn or next-step; quiet items wait for a step): the opening
// record logs the claim (agent/inbox/dequeue, preceded by enqueue if the item
// was never seen) before the turn uses it, then the item leaves the inbox.
// claimed is false when nothing is waiting.
func (a *Agent) ClaimNext(ctx context.Context, in Inbox) (out Outcome, claimed bool, err error) {
	return ClaimNextOf(ctx, a, in, a.log)
}

// ClaimNextOf is ClaimNext for any session that opens turns.
func ClaimNextOf(ctx context.Context, s TurnOpener, in Inbox, log *slog.Logger) (out Outcome, claimed bool, err error) {
	il := s.InboxLog()
	seen := il.Seen
	items, err := UnclaimedOf(ctx, il, in, log)
	if err != nil {
		return Outcome{}, false, err
	}
	var it store.InboxItem
	found := false
	for _, x := range items {
		if x.Delivery != store.DeliveryQuiet {
			it, found = x, true
			break
		}
	}
	if !found {
		return Outcome{}, false, nil
	}
	var before []protocol.SessionEvent
	if !seen[it.Seq] {
		ev, err := protocol.NewEvent(protocol.EvInboxEnqueue, time.Now().UnixMilli(),
			protocol.InboxEnqueueData{MessageID: it.MessageID, InboxSeq: it.Seq, Source: it.Source})
		if err != nil {
			return Outcome{}, false, err
		}
		before = append(before, ev)
	}
	out, ok := s.OpenTurn(ctx, Input{
		Content: it.Content, Source: it.Source, MessageID: it.MessageID, InboxSeq: it.Seq, Before: before,
	})
	if !ok {
		return out, false, nil
	}
	if err := in.Remove(ctx, it.Seq); err != nil {
		log.Warn("claimed inbox item not removed; it is skipped by its logged claim", "seq", it.Seq, "err", err)
	}
	out.Trace = it.Trace
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
		if !seen[it.Seq] {
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
		if !seen[it.Seq] {
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

// claimSteps claims every unclaimed next-step and quiet item into the running
// turn: each is logged (enqueue if unseen, dequeue, user/message) in one
// record before the next model request uses it (docs/upstream-behaviour.md §3.3,
// steer). Several notices share one step.
func (a *Agent) claimSteps(ctx context.Context, turn int64) error {
	items, seen, err := a.unclaimed(ctx, a.cfg.Inbox)
	if err != nil {
		return err
	}
	var b eventBuf
	var seqs []protocol.Seq
	for _, it := range items {
		if it.Delivery != store.DeliveryNextStep && it.Delivery != store.DeliveryQuiet {
			continue
		}
		if !seen[it.Seq] {
			b.add(a, protocol.EvInboxEnqueue, protocol.InboxEnqueueData{MessageID: it.MessageID, InboxSeq: it.Seq, Source: it.Source})
		}
		b.add(a, protocol.EvInboxDequeue, protocol.InboxDequeueData{MessageID: it.MessageID, InboxSeq: it.Seq, Turn: turn})
		b.add(a, protocol.EvUserMessage, protocol.UserMessageData{ID: it.MessageID, Turn: turn, Content: it.Content, Source: it.Source})
		seqs = append(seqs, it.Seq)
	}
	if b.err != nil || len(b.evs) == 0 {
		return b.err
	}
	if out, ok := a.append(ctx, turn, b.evs); !ok {
		return fmt.Errorf("log step claims: %w", outcomeErr(out))
	}
	if err := a.cfg.Inbox.Remove(ctx, seqs...); err != nil {
		a.log.Warn("claimed inbox items not removed; they are skipped by their logged claims", "err", err)
	}
	return nil
}
