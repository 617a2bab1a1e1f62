package coordinator

import (
	"context"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// sessionsResult answers a child's last finished turn from the tail of its
// log (store.ReadLogTail): the client never reads the whole log, and the
// coordinator reads only as far back as that turn's start.
func (c *Coordinator) sessionsResult(ctx context.Context, req rpc.Request, r protocol.SessionResultRequest) (protocol.SessionResultReply, error) {
	h, _, err := c.childFor(ctx, r.SessionID, r.Authority, true)
	if err != nil {
		return protocol.SessionResultReply{}, err
	}
	events, _, err := c.st.ReadLogTail(ctx, h.Scope(), h.ID, func(evs []protocol.SessionEvent) bool {
		_, _, ok := lastOwnTurn(evs, h.SeedLength)
		return ok || (len(evs) > 0 && evs[0].Seq <= h.SeedLength)
	})
	if err != nil {
		return protocol.SessionResultReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the log of %s: %w", h.ID, err)
	}
	mode := ""
	if e, err := c.st.ChildIndexEntry(ctx, h.ParentSession, h.ID); err == nil {
		mode = e.Mode
	}
	reply := protocol.SessionResultReply{SessionID: h.ID, Output: []protocol.ContentBlock{}}
	if start, end, ok := lastOwnTurn(events, h.SeedLength); ok {
		if reply, err = sessionlog.TurnResult(h.ID, events[start:end+1]); err != nil {
			return protocol.SessionResultReply{}, err
		}
	}
	reply.Mode = mode
	return reply, nil
}

// lastOwnTurn finds the last turn that ended among the session's own events
// (seq at or after seedLength): the index of its turn/start and turn/end in
// evs. ok is false when no own turn ended in evs, or its start is not in evs.
func lastOwnTurn(evs []protocol.SessionEvent, seedLength int64) (start, end int, ok bool) {
	end = -1
	for i := len(evs) - 1; i >= 0 && evs[i].Seq >= seedLength; i-- {
		if evs[i].Type == protocol.EvTurnEnd {
			end = i
			break
		}
	}
	if end < 0 {
		return 0, 0, false
	}
	for i := end - 1; i >= 0 && evs[i].Seq >= seedLength; i-- {
		if evs[i].Type == protocol.EvTurnStart {
			return i, end, true
		}
	}
	return 0, end, false
}
