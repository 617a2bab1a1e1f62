// Package requestwait waits for the answer to a request for approval or a
// question (docs/protocol.md §5.21, issue 33): the asking session reads its
// request with requests.get, backing off, until it is no longer pending.
// The built-in agents' parked tool calls (internal/agent) and the ACP
// bridge's permission requests (services/acp-bridge, permission `ask`) wait
// the same way, with the same intervals.
package requestwait

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Requester opens and reads a session's requests (docs/protocol.md §5.21);
// *client.Client is the production one, acting with the asking session's
// own credential (RequestOpenRequest.Self, RequestGetRequest.Self).
type Requester interface {
	OpenRequest(ctx context.Context, r protocol.RequestOpenRequest) (protocol.RequestRecord, error)
	GetRequest(ctx context.Context, r protocol.RequestGetRequest) (protocol.RequestRecord, error)
}

// How a waiting session looks for its answer: every PollInterval at first,
// doubling up to PollIntervalMax (docs/protocol.md §5.21, "The child's
// side"; Await).
const (
	PollInterval    = 250 * time.Millisecond
	PollIntervalMax = 2 * time.Second
)

// CallTimeout bounds each call a waiting session makes about its request
// (an open, a read): a call whose question or answer is lost (a link cut
// between a site and the coordinators, a coordinator killed mid-call) is
// given up after it and made again, rather than waited for until the
// turn's own deadline (10 minutes by default), which no dispose reaching
// the host cuts short when the link is down. Open and Await apply it.
const CallTimeout = 5 * time.Second

// OpenWaitMax bounds how long Open makes the open again while the
// coordinators do not answer (UNAVAILABLE: nobody serves it, or no reply
// in time); after it the open fails with the last error.
const OpenWaitMax = 30 * time.Second

// Open opens req with r, each attempt bounded by CallTimeout and made again
// every PollInterval while the coordinators do not answer, for up to
// OpenWaitMax or until ctx ends. Opening the same call's request again
// returns the one already open (docs/protocol.md §5.21), so an attempt
// made again after a lost answer opens nothing twice. Any other error
// (UNAUTHORIZED, INVALID_ARGUMENT, LIMIT_EXCEEDED) is returned at once.
func Open(ctx context.Context, r Requester, req protocol.RequestOpenRequest) (protocol.RequestRecord, error) {
	giveUp := time.Now().Add(OpenWaitMax)
	for {
		cctx, cancel := context.WithTimeout(ctx, CallTimeout)
		rec, err := r.OpenRequest(cctx, req)
		cancel()
		if err == nil || ctx.Err() != nil || !unanswered(err) || time.Now().Add(PollInterval).After(giveUp) {
			return rec, err
		}
		t := time.NewTimer(PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return rec, err
		case <-t.C:
		}
	}
}

// unanswered reports whether err says a call got no answer (made again)
// rather than a refusal.
func unanswered(err error) bool {
	return protocol.CodeOf(err) == protocol.CodeUnavailable || errors.Is(err, context.DeadlineExceeded)
}

// Await reads the request rec (as the session self, with its own
// credential), first after first (0: at once, as a call parked before a
// restart does; then PollInterval, doubling up to PollIntervalMax), until
// it is no longer pending, and returns it as last read: approved, denied,
// answered, timed-out or cancelled (the coordinator moves a request past
// its deadline to timed-out on a read, so a wait ends by the request's
// deadline while the coordinators answer). It returns early with ctx's
// error when ctx ends, and with the read's error when the read says the
// caller is no longer the session's agent (UNAUTHORIZED, or a fenced
// store) or the request is gone (NOT_FOUND: its TTL passed); any other
// failed read is logged on log and tried again at the next poll. A read in
// flight when ctx ends is abandoned at once (read): a cancelled turn's
// wait ends with ctx, not when a read that ignores its context returns.
func Await(ctx context.Context, r Requester, self protocol.ParentRef, rec protocol.RequestRecord, first time.Duration, log *slog.Logger) (protocol.RequestRecord, error) {
	wait := first
	for rec.State == protocol.RequestPending {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return rec, ctx.Err()
		case <-t.C:
		}
		wait = min(max(2*wait, PollInterval), PollIntervalMax)
		got, err := read(ctx, r, protocol.RequestGetRequest{RequestID: rec.ID, Self: &self})
		if err != nil {
			if ctx.Err() != nil {
				return rec, ctx.Err()
			}
			if code := protocol.CodeOf(err); code == protocol.CodeUnauthorized || code == protocol.CodeNotFound || errors.Is(err, store.ErrFenced) {
				return rec, err // no longer this session's agent, or no longer a request
			}
			log.Warn("could not read a request; trying again", "request", rec.ID, "err", err)
			continue
		}
		rec = got
	}
	return rec, nil
}

// read reads a request once with r, and returns when the read does or,
// with ctx's error, when ctx ends first: the read's goroutine then runs
// on until the read returns (a Requester that honours ctx returns at once)
// and its answer is dropped. A read's answer that is there when ctx ends
// is kept.
func read(ctx context.Context, r Requester, req protocol.RequestGetRequest) (protocol.RequestRecord, error) {
	type answer struct {
		rec protocol.RequestRecord
		err error
	}
	done := make(chan answer, 1) // the abandoned read's goroutine never blocks on it
	go func() {
		cctx, cancel := context.WithTimeout(ctx, CallTimeout) // a lost answer is read again at the next poll
		defer cancel()
		rec, err := r.GetRequest(cctx, req)
		done <- answer{rec, err}
	}()
	select {
	case a := <-done:
		return a.rec, a.err
	case <-ctx.Done():
		select {
		case a := <-done:
			return a.rec, a.err
		default:
			return protocol.RequestRecord{}, ctx.Err()
		}
	}
}

// AnswerData is the request/answer event data of rec, answered or timed
// out, for its call callID (the asking session's log, docs/protocol.md
// §8.3).
func AnswerData(rec protocol.RequestRecord, callID string) protocol.RequestAnswerData {
	d := protocol.RequestAnswerData{RequestID: rec.ID, CallID: callID, State: rec.State}
	if rec.Answer != nil {
		d.Reason, d.Text, d.JSON, d.By = rec.Answer.Reason, rec.Answer.Text, rec.Answer.JSON, rec.Answer.By
	}
	return d
}

// AnswererName says who answered, for a model or a log line: "the user",
// "the agent ID (an ancestor)", or the answerer's kind.
func AnswererName(by protocol.Answerer) string {
	switch by.Kind {
	case protocol.AnswererAgent:
		return fmt.Sprintf("the agent %s (an ancestor)", by.SessionID)
	case protocol.AnswererUser:
		return "the user"
	default:
		return by.Kind
	}
}
