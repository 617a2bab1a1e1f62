package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Model retries (docs/protocol.md §8.3 model/retry; issue 32, item 3): a
// model request that fails temporarily (model.Error.Retryable: HTTP 408,
// 429, 5xx, a connection reset, an attempt's timeout, before any of the
// answer arrived) does not end the turn. The turn pauses and sends the
// same request again after a backoff, as often as it takes, until the
// model answers, fails for good (that failure ends the turn error
// MODEL_ERROR at once), or the turn's context ends: its deadline (the turn
// time limit, LIMIT_EXCEEDED, the diagnostic naming the last model error;
// any deadline a caller puts on the turn's context bounds the pauses the
// same way) or its owner's cancellation (aborted at once, as always).
const (
	modelRetryBackoffDefault    = 500 * time.Millisecond
	modelRetryBackoffMaxDefault = 30 * time.Second
	modelRetryAfterMaxDefault   = 60 * time.Second
)

// modelCall is the outcome of one step's model request, its retries
// included.
type modelCall struct {
	resp model.Response
	// err is the final failure (nil when the model answered): a permanent
	// *model.Error, or ctx's error when the turn's context ended.
	err error
	// partial is the text the last attempt streamed before it failed.
	partial string
	// retried is the last temporary failure that was retried, attempt its
	// number (1 the first request); nil and 0 when none was.
	retried *model.Error
	attempt int64
}

// retriedNote is what a turn that ran out of time adds to its diagnostic
// when it was retrying the model: the last model error.
func (mc modelCall) retriedNote() string {
	if mc.retried == nil {
		return ""
	}
	return fmt.Sprintf(" while it retried the model after a temporary failure; the last model error (attempt %d): %s", mc.attempt, mc.retried.Diagnostic)
}

// callModelRetrying makes the step's model request, pausing and retrying
// it after each temporary failure: each retry is logged first as one
// model/retry record (inside the turn, before the step's step/start),
// counted (brood_model_retries_total), and shown by ModelRetry while the
// turn waits. ok is false when the model/retry record could not be logged;
// out then says how the turn ended.
func (a *Agent) callModelRetrying(ctx context.Context, turn, step int64, req model.Request) (mc modelCall, out Outcome, ok bool) {
	for attempt := int64(1); ; attempt++ {
		var partial strings.Builder
		resp, err := a.callModel(ctx, req, func(s string) { partial.WriteString(s) })
		mc.resp, mc.err, mc.partial = resp, err, partial.String()
		var me *model.Error
		if err == nil || ctx.Err() != nil || !errors.As(err, &me) || !me.Retryable {
			return mc, Outcome{}, true
		}
		mc.retried, mc.attempt = me, attempt
		wait := jitter(a.limits.modelRetryWait(attempt, me.RetryAfter), me.RetryAfter)
		d := protocol.ModelRetryData{
			Turn: turn, Step: step, Attempt: attempt, Status: int64(me.Status),
			RetryAfterMs: me.RetryAfter.Milliseconds(), WaitMs: wait.Milliseconds(),
			NextAt: a.cfg.Now().Add(wait).UnixMilli(), Diagnostic: protocol.TruncateDiagnostic(me.Diagnostic),
		}
		m := a.cfg.Model
		a.cfg.Metrics.ModelRetry(m.Provider(), m.Name(), me.Status)
		a.log.Warn("model request failed temporarily; the turn pauses, then retries",
			"turn", turn, "step", step, "attempt", attempt, "status", me.Status, "wait", wait, "err", me.Diagnostic)
		var b eventBuf
		b.add(a, protocol.EvModelRetry, d)
		if b.err != nil {
			return mc, a.end(ctx, turn, nil, errReason(protocol.CodeInternal, b.err.Error())), false
		}
		if out, ok := a.append(ctx, turn, b.evs); !ok {
			return mc, out, false
		}
		if !a.pause(ctx, d, wait) {
			mc.err, mc.partial = ctx.Err(), ""
			return mc, Outcome{}, true
		}
	}
}

// pause waits wait, or until ctx ends (false), showing d as the turn's
// model retry meanwhile.
func (a *Agent) pause(ctx context.Context, d protocol.ModelRetryData, wait time.Duration) bool {
	a.mu.Lock()
	a.retry = &d
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.retry = nil
		a.mu.Unlock()
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ModelRetry returns the model retry the running turn is paused on (a copy
// of its model/retry data), nil when it is not paused on one. Safe for
// concurrent use; continuable.state shows it (docs/protocol.md §5.10).
func (a *Agent) ModelRetry() *protocol.ModelRetryData {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.retry == nil {
		return nil
	}
	d := *a.retry
	return &d
}

// modelRetryWait is the pause after failed attempt number attempt (1 the
// first request): ModelRetryBackoff doubled for each earlier retry, at most
// ModelRetryBackoffMax, or the endpoint's Retry-After (at most
// ModelRetryAfterMax) when that is longer. l has its defaults applied.
func (l Limits) modelRetryWait(attempt int64, retryAfter time.Duration) time.Duration {
	d := l.ModelRetryBackoff
	for i := int64(1); i < attempt && d < l.ModelRetryBackoffMax; i++ {
		d *= 2
	}
	d = min(d, l.ModelRetryBackoffMax)
	return max(d, min(retryAfter, l.ModelRetryAfterMax))
}

// jitter spreads a backoff pause over [wait/2, wait] at random ("equal
// jitter"), so the children of a fleet that hit one rate limit together do
// not all retry in the same instant; a pause the endpoint's Retry-After
// decided (retryAfter >= wait) is kept whole, and no pause is made shorter
// than retryAfter.
func jitter(wait, retryAfter time.Duration) time.Duration {
	if wait <= 0 || retryAfter >= wait {
		return wait
	}
	return max(wait/2+rand.N(wait-wait/2+1), retryAfter)
}
