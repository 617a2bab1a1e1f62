package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// followLog prints a session's header and log, then each new event as it is
// logged, until the session's agent is done (see logCmd). It reads pages of
// the log through the coordinator (sessions.log) from the first event on,
// and once caught up long-polls for the next one, so the history and the
// live part come from one ordered read with no gap between them.
func followLog(ctx context.Context, s *session, id string, auth protocol.Authority, asJSON bool) error {
	return follow(ctx, s.cl, s.out, id, auth, asJSON)
}

// followReads is what a follow asks the coordinators (*client.Client).
type followReads interface {
	Header(ctx context.Context, req protocol.SessionGetRequest) (protocol.SessionHeader, error)
	LogPage(ctx context.Context, req protocol.LogReadRequest) (protocol.LogPage, error)
	State(ctx context.Context, req protocol.ChildRef) (protocol.StateReply, error)
	// Retrying asks again while the coordinators are UNAVAILABLE (a broker
	// restart, the coordinator serving the long poll killed: the next page
	// comes from another), bounded by client.Options.OutageMax.
	Retrying(ctx context.Context, what string, f func(ctx context.Context) error) error
}

// follow is followLog reading through r and printing to out.
func follow(ctx context.Context, r followReads, out io.Writer, id string, auth protocol.Authority, asJSON bool) error {
	if !protocol.ValidID(id) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "session id %q is not a valid id", id)
	}
	h, err := r.Header(ctx, protocol.SessionGetRequest{SessionID: id, Authority: auth})
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSONLine(out, struct {
			Header protocol.SessionHeader `json:"header"`
		}{h}); err != nil {
			return err
		}
	} else {
		printHeader(out, h)
	}
	mode := ""
	if h.ParentSession == "" {
		mode = "root"
	}
	req := protocol.LogReadRequest{SessionID: id, Authority: auth}
	// ownTurnEnded: one of the session's own turns ended (not a seed's);
	// ownTurnOpen: its latest own turn/start has no turn/end yet.
	caughtUp, ownTurnEnded, ownTurnOpen := false, false, false
	for {
		if caughtUp && followDone(ctx, r, id, mode, ownTurnEnded, ownTurnOpen, auth) {
			return nil
		}
		// A continuable activation settles a moment after its last turn ends,
		// and logs nothing then: once caught up, wait at most followDonePoll.
		req.WaitMs = 0
		if caughtUp {
			req.WaitMs = followDonePoll.Milliseconds()
		}
		var page protocol.LogPage
		err := r.Retrying(ctx, "following the log of "+id, func(ctx context.Context) (err error) {
			page, err = r.LogPage(ctx, req)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, ev := range page.Events {
			if asJSON {
				if err := printJSONLine(out, ev); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(out, formatEvent(ev, h))
			}
			own := ev.Seq >= h.SeedLength
			switch ev.Type {
			case protocol.EvSubagentDescriptor:
				var d protocol.DescriptorData
				if own && ev.Decode(&d) == nil {
					mode = d.Mode
				}
			case protocol.EvTurnStart:
				ownTurnOpen = ownTurnOpen || own
			case protocol.EvTurnEnd:
				ownTurnEnded = ownTurnEnded || own
				ownTurnOpen = ownTurnOpen && !own
			}
		}
		req.FromSeq, req.Cursor, caughtUp = page.NextSeq, page.Cursor, page.Complete
	}
}

// followDonePoll is how often a caught-up follow asks whether the agent is done.
const followDonePoll = 500 * time.Millisecond

// followDone reports whether a followed session's agent is done: a one-shot
// child once its turn ended (turnEnded: one of its own turns ended); a
// continuable child once no own turn is open in its log (turnOpen) and it
// has no live activation and nothing queued; a root never (Ctrl-C ends the
// follow). While an own turn is open the session is live whatever the
// state answers, and the state is not asked: an activation logs its turn's
// end before its lease goes, and a coordinator that takes the session of a
// host it judged dead over closes the open turn in the log (interrupted),
// so a follow of an ended session still ends. A state of none read during
// a turn is the coordinator's judgement of that moment (a host whose
// heartbeats came late is not live until the next one comes back), not
// the turn's end.
func followDone(ctx context.Context, r followReads, id, mode string, turnEnded, turnOpen bool, auth protocol.Authority) bool {
	switch mode {
	case "root":
		return false
	case protocol.ModeOneShot:
		return turnEnded
	case protocol.ModeContinuable:
		if turnOpen {
			return false
		}
		st, err := r.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
		return err == nil && st.State == protocol.StateNone && st.Queued == 0
	}
	return false // no descriptor seen yet: the child is being created
}
