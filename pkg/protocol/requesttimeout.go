package protocol

import (
	"fmt"
	"time"
)

// A start's request timeout (docs/protocol.md §5.5, "requestTimeoutMs";
// issue 33, item 5): how long a request of the child (and of its
// descendants) waits for its answer before it is timed-out, a denial.
// Absent everywhere, the coordinator's default holds (RequestTimeout,
// coordinator setting). Like the turn limits it only tightens down the
// tree: a child's is at most its parent's.

// RequestTimeoutMsMax bounds a start's requestTimeoutMs, in milliseconds
// (24 hours): a parked call holds its turn, so a turn's own limit usually
// ends it sooner.
const RequestTimeoutMsMax int64 = 24 * 60 * 60 * 1000

// CheckRequestTimeout checks a requestTimeoutMs as a start sets it: 0 is
// absent; a negative value is INVALID_ARGUMENT, one above
// RequestTimeoutMsMax is LIMIT_EXCEEDED, each naming the field and its unit.
func CheckRequestTimeout(ms int64) error {
	switch {
	case ms < 0:
		return NewError(CodeInvalidArgument, map[string]any{"limit": "requestTimeoutMs",
			"reason": fmt.Sprintf("requestTimeoutMs must be a positive number of milliseconds (or absent), not %d", ms)})
	case ms > RequestTimeoutMsMax:
		return NewError(CodeLimitExceeded, map[string]any{"limit": "requestTimeoutMs", "requested": ms, "allowed": RequestTimeoutMsMax,
			"reason": fmt.Sprintf("requestTimeoutMs %d is above the %d milliseconds (24 hours) a request may wait", ms, RequestTimeoutMsMax)})
	}
	return nil
}

// ResolveRequestTimeout decides a child's SessionHeader.RequestTimeoutMs
// from its parent's header and the start's requestTimeoutMs (0 when
// absent): absent, the child inherits its parent's (0: the coordinator's
// default); set, it must pass CheckRequestTimeout and be at most its
// parent's, when the parent has one (else INVALID_ARGUMENT naming the
// field, what was asked and what is allowed: a start may only tighten it).
func ResolveRequestTimeout(parent SessionHeader, requested int64) (int64, error) {
	if err := CheckRequestTimeout(requested); err != nil {
		return 0, err
	}
	switch {
	case requested == 0:
		return parent.RequestTimeoutMs, nil
	case parent.RequestTimeoutMs > 0 && requested > parent.RequestTimeoutMs:
		return 0, NewError(CodeInvalidArgument, map[string]any{"limit": "requestTimeoutMs", "requested": requested, "allowed": parent.RequestTimeoutMs,
			"reason": fmt.Sprintf("requestTimeoutMs %d is above the %d milliseconds of the parent session %s; a start may only tighten it", requested, parent.RequestTimeoutMs, parent.ID)})
	}
	return requested, nil
}

// RequestTimeout is how long a request of session h waits for its
// answer: its header's requestTimeoutMs, else def (the coordinator's
// default).
func (h SessionHeader) RequestTimeout(def time.Duration) time.Duration {
	if h.RequestTimeoutMs > 0 {
		return time.Duration(h.RequestTimeoutMs) * time.Millisecond
	}
	return def
}
