package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/pkg/protocol"
)

// DisposeTimeout bounds runs.dispose when ctx has no deadline (40 s: the
// coordinator may wait 20 s for a host that cannot answer).
const DisposeTimeout = 40 * time.Second

// Run is a started one-shot run.
type Run struct {
	c       *Client
	RunID   string
	ChildID string
	// State is protocol.RunQueued when the start waits in its parent's
	// start queue (the parent was at its live-children limit): the run
	// starts later and Result waits for it as for any run; "" when the
	// child was published (docs/protocol.md §5.5, "The start queue").
	State  string
	parent protocol.ParentRef
	notice chan protocol.RunNotice
	token  string
}

func (c *Client) ensureNotify() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notifySub != nil {
		return c.notifyPrefix, nil
	}
	prefix := c.ownInbox("brood")
	sub, err := c.nc.Subscribe(prefix+".*", c.onNotice)
	if err != nil {
		return "", err
	}
	// A subscription the user may not make would leave every run waiting
	// for its fallback: find out now.
	if err := checkSubscribed(c.nc, prefix+".*"); err != nil {
		_ = sub.Unsubscribe()
		return "", err
	}
	c.notifySub, c.notifyPrefix = sub, prefix
	return prefix, nil
}

// noticesBuffered bounds the notices a run keeps before Result reads them;
// more are dropped (Result falls back to runs.await).
const noticesBuffered = 4

// onNotice hands a notice to the run whose token its subject ends with;
// the run takes it only when it names the run's own id (Run.Result), so a
// notice someone else sent to this subject is dropped.
func (c *Client) onNotice(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	var n protocol.RunNotice
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &n); err != nil {
		return
	}
	c.mu.Lock()
	ch := c.waiters[token]
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- n:
		default:
		}
	}
}

// StartRun starts a one-shot child (runs.start) and returns once the child is
// published; its result arrives with Run.Result. req.Notify is set by the
// client (a subject under its own inbox prefix, subscribed before the start);
// a value given there is replaced.
func (c *Client) StartRun(ctx context.Context, req protocol.RunStartRequest) (*Run, error) {
	prefix, err := c.ensureNotify()
	if err != nil {
		if protocol.CodeOf(err) != "" {
			return nil, err
		}
		return nil, protocol.Errorf(protocol.CodeUnavailable, "subscribe for results: %w", err)
	}
	token := nuid.Next()
	ch := make(chan protocol.RunNotice, noticesBuffered)
	c.mu.Lock()
	c.waiters[token] = ch
	c.mu.Unlock()
	req.Notify = prefix + "." + token
	var reply protocol.RunStartReply
	if err := c.Call(ctx, protocol.EpRunsStart, req, &reply); err != nil {
		c.mu.Lock()
		delete(c.waiters, token)
		c.mu.Unlock()
		return nil, err
	}
	return &Run{c: c, RunID: reply.RunID, ChildID: reply.ChildID, State: reply.State, parent: req.Parent, notice: ch, token: token}, nil
}

// Result waits for the run's result: its notice, or runs.await when none came
// within Options.AwaitFallback (asked again while the deployment is
// UNAVAILABLE, a broker or coordinator restarting, for up to
// Options.OutageMax; then UNAVAILABLE, at once when the connection is
// closed for good). A child that did not complete is a result with another stop
// reason, not an error; a cancelled ctx is CANCELLED (the run goes on:
// Result again, whose notice still comes to it, or Dispose it).
func (r *Run) Result(ctx context.Context) (protocol.SubagentResult, error) {
	t := time.NewTimer(r.c.opts.AwaitFallback)
	defer t.Stop()
	down := outage{c: r.c}
	for {
		select {
		case n := <-r.notice:
			if n.RunID != r.RunID {
				continue // not this run's: someone else's notice on its subject
			}
			r.forget()
			return n.Result, nil
		case <-ctx.Done():
			// The notice stays subscribed: a wait cut short (a budget's
			// deadline, internal/agent's subagent tool) that asks again
			// gets the child's end as it comes, not after AwaitFallback.
			return protocol.SubagentResult{}, protocol.Errorf(protocol.CodeCancelled, "waiting for run %s: %w", r.RunID, ctx.Err())
		case <-t.C:
			st, err := r.c.Await(ctx, protocol.RunRef{RunID: r.RunID, Parent: &r.parent, WaitMs: r.c.opts.AwaitFallback.Milliseconds()})
			if err != nil {
				if ctx.Err() != nil {
					return protocol.SubagentResult{}, protocol.Errorf(protocol.CodeCancelled, "waiting for run %s: %w", r.RunID, ctx.Err())
				}
				// The deployment may be restarting: ask again, for up to
				// Options.OutageMax (issue 37, item 1).
				if gaveUp := down.failed(err, "waiting for run "+r.RunID); gaveUp != nil {
					r.forget()
					return protocol.SubagentResult{}, gaveUp
				}
				t.Reset(min(r.c.opts.AwaitFallback, outageRetryWait))
				continue
			}
			down.ok()
			if st.State == protocol.RunSettled && st.Result != nil {
				r.forget()
				return *st.Result, nil
			}
			t.Reset(r.c.opts.AwaitFallback)
		}
	}
}

func (r *Run) forget() {
	r.c.mu.Lock()
	delete(r.c.waiters, r.token)
	r.c.mu.Unlock()
}

// Dispose cancels the run (runs.dispose; idempotent) and returns its settled
// status.
func (r *Run) Dispose(ctx context.Context) (protocol.RunStatus, error) {
	st, err := r.c.Dispose(ctx, protocol.RunRef{RunID: r.RunID, Parent: &r.parent})
	if err == nil && st.State == protocol.RunSettled {
		r.forget() // its result is st's; no notice is waited for any more
	}
	return st, err
}

// Await asks runs.await for a run's status, waiting up to ref.WaitMs
// (capped by the coordinator at 60 s) for it to settle.
func (c *Client) Await(ctx context.Context, ref protocol.RunRef) (protocol.RunStatus, error) {
	var st protocol.RunStatus
	err := c.callWaiting(ctx, protocol.EpRunsAwait, ref.WaitMs, ref, &st)
	return st, err
}

// Dispose asks runs.dispose to cancel a run and returns its settled status.
// ctx without a deadline gets DisposeTimeout.
func (c *Client) Dispose(ctx context.Context, ref protocol.RunRef) (protocol.RunStatus, error) {
	var st protocol.RunStatus
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DisposeTimeout)
		defer cancel()
	}
	err := c.Call(ctx, protocol.EpRunsDispose, ref, &st)
	return st, err
}

// ResultError returns nil for a completed result and a *RunError for any
// other stop reason (for callers that treat non-completion as failure).
func ResultError(res protocol.SubagentResult) error {
	if res.StopReason == protocol.StopCompleted {
		return nil
	}
	return &RunError{Result: res}
}

// RunError is a run that settled without completing, as an error: Result is
// what it settled with (stop reason, errorCode, diagnostic, partial output).
// It wraps the *protocol.Error of its code, the result's errorCode or, when
// it has none, CANCELLED for aborted and INTERNAL for any other stop reason:
// errors.Is(err, protocol.ErrHostLost) holds for a run settled HOST_LOST,
// protocol.CodeOf gives the code, and errors.As(err, &runErr) the result.
type RunError struct {
	Result protocol.SubagentResult
}

// StopReason is the stop reason the run settled with.
func (e *RunError) StopReason() protocol.StopReason { return e.Result.StopReason }

// Code is the catalogue code of the run's end (see RunError).
func (e *RunError) Code() protocol.Code {
	switch {
	case e.Result.ErrorCode != "":
		return e.Result.ErrorCode
	case e.Result.StopReason == protocol.StopAborted:
		return protocol.CodeCancelled
	default:
		return protocol.CodeInternal
	}
}

func (e *RunError) Error() string { return e.protocolError().Error() }

// Unwrap returns the *protocol.Error of the run's code.
func (e *RunError) Unwrap() error { return e.protocolError() }

func (e *RunError) protocolError() *protocol.Error {
	msg := "run ended with stopReason " + string(e.Result.StopReason)
	if e.Result.Diagnostic != "" {
		msg += ": " + e.Result.Diagnostic
	}
	return &protocol.Error{Code: e.Code(), Message: msg, Details: map[string]any{"stopReason": string(e.Result.StopReason)}}
}

// String renders a run for logs.
func (r *Run) String() string { return fmt.Sprintf("run %s (child %s)", r.RunID, r.ChildID) }
