package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Requester opens and reads a session's requests (docs/protocol.md §5.21);
// *client.Client is the production one, acting with the agent's own
// credential.
type Requester interface {
	OpenRequest(ctx context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error)
	GetRequest(ctx context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error)
}

// How a parked tool call looks for its answer: every
// RequestPollInterval at first, backing off to RequestPollIntervalMax.
const (
	RequestPollInterval    = 250 * time.Millisecond
	RequestPollIntervalMax = 2 * time.Second
)

// awaitApproval parks the tool call c until its request is answered
// (docs/protocol.md §5.21): it opens the request, logs request/open, polls
// the request until it leaves pending, logs request/answer, and reports
// whether the call may run; when it may not, res is the call's result (the
// denial, the timeout, or why no one could be asked). While parked the
// call holds its turn's goroutine, the session's lease and nothing of the
// model: no model request is open between steps.
func (a *Agent) awaitApproval(ctx context.Context, turn, step int64, c protocol.ToolCall) (res ToolResult, approved bool) {
	self := protocol.ParentRef{SessionID: a.cfg.Header.ID, Credential: a.cfg.Credential}
	rec, err := a.cfg.Requests.OpenRequest(ctx, protocol.RequestOpenRequest{
		Self: self, Kind: protocol.RequestApproval, CallID: c.ID, Turn: turn, Step: step, Tool: c.Name, Arguments: c.Arguments,
	})
	if err != nil {
		return ErrorResult("%s needs approval, and the request for it could not be opened (%v); it did not run", c.Name, err), false
	}
	var b eventBuf
	b.add(a, protocol.EvRequestOpen, protocol.RequestOpenData{
		RequestID: rec.ID, Kind: rec.Kind, Turn: turn, Step: step, CallID: c.ID, Tool: c.Name, Deadline: rec.Deadline,
	})
	if b.err != nil {
		return ErrorResult("%s: %v", c.Name, b.err), false
	}
	if _, ok := a.append(ctx, turn, b.evs); !ok {
		return ErrorResult("%s needs approval, and its request could not be logged; it did not run", c.Name), false
	}
	a.log.Info("tool call parked on a request", "request", rec.ID, "tool", c.Name, "call", c.ID)
	rec, err = a.pollRequest(ctx, self, rec)
	if err != nil {
		return ErrorResult("%s was waiting for approval (request %s) when the turn ended; it did not run", c.Name, rec.ID), false
	}
	var ab eventBuf
	d := protocol.RequestAnswerData{RequestID: rec.ID, CallID: c.ID, State: rec.State}
	if rec.Answer != nil {
		d.Reason, d.By = rec.Answer.Reason, rec.Answer.By
	}
	ab.add(a, protocol.EvRequestAnswer, d)
	if ab.err != nil {
		return ErrorResult("%s: %v", c.Name, ab.err), false
	}
	if _, ok := a.append(ctx, turn, ab.evs); !ok {
		return ErrorResult("%s: the answer to its request could not be logged; it did not run", c.Name), false
	}
	switch rec.State {
	case protocol.RequestApproved:
		return ToolResult{}, true
	case protocol.RequestTimedOut:
		return ErrorResult("%s got no answer to its request for approval (%s) in time; the request timed out, which counts as a denial; it did not run", c.Name, rec.ID), false
	default:
		reason := ""
		if d.Reason != "" {
			reason = ": " + d.Reason
		}
		return ErrorResult("%s was denied by %s%s; it did not run", c.Name, answererName(d.By), reason), false
	}
}

// pollRequest reads the request until it is no longer pending, or ctx ends
// (its error). A read that fails is tried again at the next poll.
func (a *Agent) pollRequest(ctx context.Context, self protocol.ParentRef, rec protocol.RequestRecord) (protocol.RequestRecord, error) {
	wait := RequestPollInterval
	for rec.State == protocol.RequestPending {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return rec, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, RequestPollIntervalMax)
		got, err := a.cfg.Requests.GetRequest(ctx, protocol.RequestGetRequest{RequestID: rec.ID, Self: &self})
		if err != nil {
			if ctx.Err() != nil {
				return rec, ctx.Err()
			}
			if protocol.CodeOf(err) == protocol.CodeUnauthorized || errors.Is(err, store.ErrFenced) {
				return rec, err // no longer this session's agent
			}
			a.log.Warn("could not read a request; trying again", "request", rec.ID, "err", err)
			continue
		}
		rec = got
	}
	return rec, nil
}

// answererName says who answered, for the model.
func answererName(by protocol.Answerer) string {
	switch by.Kind {
	case protocol.AnswererAgent:
		return fmt.Sprintf("the agent %s (an ancestor)", by.SessionID)
	case protocol.AnswererUser:
		return "the user"
	default:
		return by.Kind
	}
}
