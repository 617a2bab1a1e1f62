package main

import (
	"context"
	"fmt"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// followLog prints a session's header and log, then each new event as it is
// logged, until the session's agent is done (see logCmd). It reads pages of
// the log through the coordinator (sessions.log) from the first event on,
// and once caught up long-polls for the next one, so the history and the
// live part come from one ordered read with no gap between them.
func followLog(ctx context.Context, s *session, id string, auth protocol.Authority, asJSON bool) error {
	if !protocol.ValidID(id) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "session id %q is not a valid id", id)
	}
	h, err := s.cl.Header(ctx, protocol.SessionGetRequest{SessionID: id, Authority: auth})
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSONLine(s.out, struct {
			Header protocol.SessionHeader `json:"header"`
		}{h}); err != nil {
			return err
		}
	} else {
		printHeader(s.out, h)
	}
	mode := ""
	if h.ParentSession == "" {
		mode = "root"
	}
	req := protocol.LogReadRequest{SessionID: id, Authority: auth}
	caughtUp, ownTurnEnded := false, false
	for {
		if caughtUp && s.followDone(ctx, id, mode, ownTurnEnded, auth) {
			return nil
		}
		// A continuable activation settles a moment after its last turn ends,
		// and logs nothing then: once caught up, wait at most followDonePoll.
		req.WaitMs = 0
		if caughtUp {
			req.WaitMs = followDonePoll.Milliseconds()
		}
		page, err := s.cl.LogPage(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, ev := range page.Events {
			if asJSON {
				if err := printJSONLine(s.out, ev); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(s.out, formatEvent(ev, h))
			}
			switch ev.Type {
			case protocol.EvSubagentDescriptor:
				var d protocol.DescriptorData
				if ev.Seq >= h.SeedLength && ev.Decode(&d) == nil {
					mode = d.Mode
				}
			case protocol.EvTurnEnd:
				ownTurnEnded = ownTurnEnded || ev.Seq >= h.SeedLength
			}
		}
		req.FromSeq, req.Cursor, caughtUp = page.NextSeq, page.Cursor, page.Complete
	}
}

// followDonePoll is how often a caught-up follow asks whether the agent is done.
const followDonePoll = 500 * time.Millisecond

// followDone reports whether a followed session's agent is done: a one-shot
// child once its turn ended (turnEnded: one of its own turns ended); a continuable child once it has no live
// activation and nothing queued; a root never (Ctrl-C ends the follow).
func (s *session) followDone(ctx context.Context, id, mode string, turnEnded bool, auth protocol.Authority) bool {
	switch mode {
	case "root":
		return false
	case protocol.ModeOneShot:
		return turnEnded
	case protocol.ModeContinuable:
		st, err := s.cl.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
		return err == nil && st.State == protocol.StateNone && st.Queued == 0
	}
	return false // no descriptor seen yet: the child is being created
}
