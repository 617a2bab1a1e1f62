package sessionlog

import "github.com/brood-dev/brood/pkg/protocol"

// InboxCursor reads from a log which inbox items were seen (named by any
// inbox event) and which are done (dequeued or discarded). A done item is
// never claimed again, whatever the inbox stream still holds, so an item is
// claimed exactly once even when its delivery repeats or the agent is rebuilt
// from its log right after it logged a claim. (Items are claimed out of
// order: next-step items join a running turn ahead of queued next turns.)
func InboxCursor(events []protocol.SessionEvent) (seen, done map[protocol.Seq]bool) {
	seen, done = map[protocol.Seq]bool{}, map[protocol.Seq]bool{}
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvInboxEnqueue:
			var d protocol.InboxEnqueueData
			if ev.Decode(&d) == nil {
				seen[d.InboxSeq] = true
			}
		case protocol.EvInboxDequeue:
			var d protocol.InboxDequeueData
			if ev.Decode(&d) == nil {
				seen[d.InboxSeq], done[d.InboxSeq] = true, true
			}
		case protocol.EvInboxDiscard:
			var d protocol.InboxDiscardData
			if ev.Decode(&d) == nil {
				seen[d.InboxSeq], done[d.InboxSeq] = true, true
			}
		}
	}
	return seen, done
}

// DoneMessages returns the messageIds of the items a log claimed or
// discarded. An inbox can hold a second copy of a done item under another
// sequence (a retried publish that the stream did not recognise as a
// duplicate, store.KeyedMessageID): the copy is done too.
func DoneMessages(events []protocol.SessionEvent) map[string]bool {
	done := map[string]bool{}
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvInboxDequeue:
			var d protocol.InboxDequeueData
			if ev.Decode(&d) == nil && d.MessageID != "" {
				done[d.MessageID] = true
			}
		case protocol.EvInboxDiscard:
			var d protocol.InboxDiscardData
			if ev.Decode(&d) == nil && d.MessageID != "" {
				done[d.MessageID] = true
			}
		}
	}
	return done
}
