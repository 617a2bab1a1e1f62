package coordinator

// A request ends with its turn (docs/protocol.md §5.21, "A request ends
// with its turn"; issue 33): a pending request whose asking turn was closed
// before an answer came (its one-shot run settled, its owner interrupted
// it, it was disposed, its parent ended, its time ran out) can no longer
// reach the parked call, so an answer to it would report a success that
// does nothing. The first requests.answer, requests.list or requests.get
// by one who may answer that reads such a request moves it to cancelled,
// by the compare-and-set every answer takes (an answer that landed first
// stands), and an answer after that is ALREADY_ANSWERED.
//
// Closed means the asking session's log holds the turn's turn/end (or a
// later turn's start). A continuable child whose host died while the call
// was parked keeps its turn open for its next activation (takeover.go), so
// its request stays pending; a one-shot run's takeover closes its turn, and
// the request is cancelled. A read of the log that fails leaves the request
// pending: the next read, or its deadline, decides.

import (
	"context"
	"errors"
	"fmt"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// endedRecord moves a pending request whose asking turn has ended to
// cancelled, by compare-and-set, and returns the record as it is now.
func (c *Coordinator) endedRecord(ctx context.Context, rec store.Record[protocol.RequestRecord]) (store.Record[protocol.RequestRecord], error) {
	if rec.Value.State != protocol.RequestPending {
		return rec, nil
	}
	reason, ended, err := c.turnEnded(ctx, rec.Value.SessionID, rec.Value.Turn)
	if err != nil {
		c.log.Debug("request: could not read whether its turn ended; it stays pending", "request", rec.Value.ID, "err", err)
		return rec, nil
	}
	if !ended {
		return rec, nil
	}
	out := rec.Value
	out.State = protocol.RequestCancelled
	out.Answer = &protocol.RequestAnswer{State: protocol.RequestCancelled, By: protocol.Answerer{Kind: protocol.AnswererEnded}, At: store.NowMs(),
		Reason: reason, ID: ulid.Make().String()}
	rev, err := c.st.AnswerRequest(ctx, out, rec.Revision)
	if errors.Is(err, store.ErrConflict) {
		now, err := c.st.Request(ctx, rec.Value.ID)
		if err != nil {
			return rec, protocol.Errorf(protocol.CodeUnavailable, "read the request %s: %w", rec.Value.ID, err)
		}
		return now, nil
	}
	if err != nil {
		return rec, protocol.Errorf(protocol.CodeUnavailable, "write the cancellation of request %s: %w", rec.Value.ID, err)
	}
	c.log.Info("request cancelled: its turn ended", "request", out.ID, "session", out.SessionID, "reason", reason)
	return store.Record[protocol.RequestRecord]{Value: out, Revision: rev}, nil
}

// settledRecord is expiredRecord, then endedRecord: a request past its
// deadline is timed-out, one whose turn ended cancelled.
func (c *Coordinator) settledRecord(ctx context.Context, rec store.Record[protocol.RequestRecord]) (store.Record[protocol.RequestRecord], error) {
	rec, err := c.expiredRecord(ctx, rec)
	if err != nil {
		return rec, err
	}
	return c.endedRecord(ctx, rec)
}

// turnEnded reports whether turn of session id has ended, from the tail of
// its log (read back until the turn's start), and how, for a request's
// reason. A log without the turn (never logged, or removed) is not ended.
func (c *Coordinator) turnEnded(ctx context.Context, id string, turn int64) (string, bool, error) {
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return "", false, err
	}
	var reason string
	var ended, seen bool
	scan := func(events []protocol.SessionEvent) {
		reason, ended, seen = "", false, false
		for _, ev := range events {
			switch ev.Type {
			case protocol.EvTurnStart:
				var d protocol.TurnData
				if ev.Decode(&d) == nil && d.Turn >= turn {
					seen = true
					if d.Turn > turn && !ended {
						reason, ended = fmt.Sprintf("its turn %d ended before an answer came (turn %d started)", turn, d.Turn), true
					}
				}
			case protocol.EvTurnEnd:
				var d protocol.TurnEndData
				if ev.Decode(&d) == nil && d.Turn == turn {
					seen, ended = true, true
					reason = fmt.Sprintf("its turn %d ended %s before an answer came", turn, turnEndWords(d.Reason))
				}
			}
		}
	}
	events, _, err := c.st.ReadLogTail(ctx, h.Scope(), id, func(events []protocol.SessionEvent) bool {
		scan(events)
		return seen
	})
	if err != nil {
		return "", false, err
	}
	scan(events) // the whole log is returned without a last look
	return reason, ended, nil
}

// turnEndWords says how a turn ended: its kind, and its cause or code.
func turnEndWords(r protocol.TurnEndReason) string {
	switch {
	case r.Cause != "":
		return fmt.Sprintf("%s (%s)", r.Kind, r.Cause)
	case r.Code != "":
		return fmt.Sprintf("%s (%s)", r.Kind, r.Code)
	}
	return r.Kind
}
