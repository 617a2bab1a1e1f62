package coordinator

// Passing a request up (docs/protocol.md §5.21, "Passing it up"; issue 33,
// item 4: "a parent may also pass it up"): an ancestor agent told of a
// request (or any ancestor agent of the asking session) answers it with
// pass_up instead of a decision. The request stays pending; the agent is
// added to its passedBy, and its handler becomes the nearest ancestor
// above that agent that takes requests and has not passed it
// (requestHandler), which is told of it as at its opening, or none: the
// request then waits on the user. Authorized as an answer is (answerer:
// only an ancestor; a user grant has no one above it to pass to);
// refused ALREADY_ANSWERED when the request is no longer pending; passing
// again by an agent that passed it before changes nothing.

import (
	"context"
	"errors"
	"slices"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// requestPassAttemptsMax bounds the compare-and-set attempts of one pass_up
// that races with other writes of the request (another pass, a notice's
// handler): an answer or a timeout ends the loop at once.
const requestPassAttemptsMax = 8

// requestsPassUp passes request r.RequestID up for the ancestor agent of
// r.Authority.
func (c *Coordinator) requestsPassUp(ctx context.Context, r protocol.RequestAnswerRequest) (protocol.RequestRecord, error) {
	if r.Reason != "" || r.Text != "" || r.JSON != "" {
		return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "%q takes no reason, text or json: it passes the request on undecided", protocol.AnswerPassUp)
	}
	for range requestPassAttemptsMax {
		rec, err := c.request(ctx, r.RequestID)
		if err != nil {
			return protocol.RequestRecord{}, err
		}
		by, err := c.answerer(ctx, r.Authority, rec.Value.SessionID)
		if err != nil {
			return protocol.RequestRecord{}, err
		}
		if by.Kind != protocol.AnswererAgent {
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeInvalidArgument, "only an ancestor agent passes a request up (%q); the user answers it", protocol.AnswerPassUp)
		}
		if rec, err = c.settledRecord(ctx, rec); err != nil {
			return protocol.RequestRecord{}, err
		}
		if rec.Value.State != protocol.RequestPending {
			return protocol.RequestRecord{}, alreadyAnswered(rec.Value)
		}
		if slices.Contains(rec.Value.PassedBy, by.SessionID) {
			return rec.Value, nil // passed before: as it is
		}
		out := rec.Value
		out.PassedBy = append(slices.Clone(out.PassedBy), by.SessionID)
		out.Handler = c.requestHandler(ctx, by.SessionID, out.PassedBy)
		if _, err := c.st.PassRequest(ctx, out, rec.Revision); err != nil {
			if errors.Is(err, store.ErrConflict) {
				continue // changed meanwhile: read it again
			}
			return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "write the request %s: %w", out.ID, err)
		}
		c.log.Info("request passed up", "request", out.ID, "session", out.SessionID, "by", by.SessionID, "to", out.Handler)
		c.noticeRequest(ctx, out)
		return out, nil
	}
	return protocol.RequestRecord{}, protocol.Errorf(protocol.CodeUnavailable, "request %s kept changing while it was passed up (%d attempts); try again", r.RequestID, requestPassAttemptsMax)
}
