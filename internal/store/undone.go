package store

import (
	"context"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// UndoneInboxItems splits items, read from the inbox of session h, into
// those that still wait for h and the sequences of those h's log records
// as claimed or discarded (by inbox sequence, or by messageId: a second
// copy of a done item, KeyedMessageID, is done too). An item leaves its
// inbox only after its claim is logged (RELIABILITY.md I1), and its
// removal can fail after that (the host's request refused or unanswered):
// such an item is done although the inbox still holds it. The log is read
// backwards from its end (ReadLogTail) only until every item is accounted
// for, so the common case, an item claimed lately, reads a short tail; an
// item that really waits reads the whole log, as the resume it leads to
// does anyway. A log not yet current on the replica read counts an item
// claimed just now as waiting: a resume then finds it done (the host skips
// it, agent.UnclaimedOf), as before this check.
func (s *Store) UndoneInboxItems(ctx context.Context, h protocol.SessionHeader, items []InboxItem) (undone []InboxItem, done []protocol.Seq, err error) {
	if len(items) == 0 {
		return nil, nil, nil
	}
	split := func(events []protocol.SessionEvent) (undone []InboxItem, done []protocol.Seq) {
		_, doneSeqs := sessionlog.InboxCursor(events)
		doneIDs := sessionlog.DoneMessages(events)
		for _, it := range items {
			if doneSeqs[it.Seq] || (it.MessageID != "" && doneIDs[it.MessageID]) {
				done = append(done, it.Seq)
			} else {
				undone = append(undone, it)
			}
		}
		return undone, done
	}
	events, _, err := s.ReadLogTail(ctx, h.Scope(), h.ID, func(evs []protocol.SessionEvent) bool {
		u, _ := split(evs)
		return len(u) == 0
	})
	if err != nil {
		return nil, nil, err
	}
	undone, done = split(events)
	return undone, done, nil
}
