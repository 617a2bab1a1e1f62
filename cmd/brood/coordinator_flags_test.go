package main

import (
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestCoordinatorRequestTimeoutFlag: --request-timeout takes 1 ms to 24 h
// and refuses anything else INVALID_ARGUMENT, naming the flag.
func TestCoordinatorRequestTimeoutFlag(t *testing.T) {
	base := coordinatorLimits{liveChildrenMax: 64, startQueueMax: protocol.DefaultStartQueueMax, userOpenRootsMax: 1, userRequestsPerSecond: 1, userRequestsBurst: 1, continueWaitMax: time.Second, takeoversMax: 1}
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{protocol.RequestTimeout, true}, {time.Millisecond, true}, {24 * time.Hour, true}, {8 * time.Second, true},
		{0, false}, {-time.Second, false}, {time.Microsecond, false}, {24*time.Hour + time.Millisecond, false},
	} {
		l := base
		l.requestTimeout = tc.d
		err := l.validate()
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.d, err)
		case !tc.ok && (protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "--request-timeout")):
			t.Errorf("%s: %v; want INVALID_ARGUMENT naming --request-timeout", tc.d, err)
		}
	}
}

// TestCoordinatorStartQueueMaxFlag: --start-queue-max takes a positive
// bound or -1 (no queue), and refuses 0 and anything below -1
// INVALID_ARGUMENT, naming the flag.
func TestCoordinatorStartQueueMaxFlag(t *testing.T) {
	base := coordinatorLimits{liveChildrenMax: 64, userOpenRootsMax: 1, userRequestsPerSecond: 1, userRequestsBurst: 1, requestTimeout: protocol.RequestTimeout, continueWaitMax: time.Second, takeoversMax: 1}
	for _, tc := range []struct {
		n  int
		ok bool
	}{{protocol.DefaultStartQueueMax, true}, {1, true}, {-1, true}, {0, false}, {-2, false}} {
		l := base
		l.startQueueMax = tc.n
		err := l.validate()
		switch {
		case tc.ok && err != nil:
			t.Errorf("%d: %v", tc.n, err)
		case !tc.ok && (protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "--start-queue-max")):
			t.Errorf("%d: %v; want INVALID_ARGUMENT naming --start-queue-max", tc.n, err)
		}
	}
}

// TestCoordinatorContinuationFlags: --continue-wait-max is any non-zero
// duration (negative: runs are never continued), --takeovers-max a positive
// count; anything else is INVALID_ARGUMENT naming the flags.
func TestCoordinatorContinuationFlags(t *testing.T) {
	for _, tc := range []struct {
		wait      time.Duration
		takeovers int
		ok        bool
	}{
		{30 * time.Second, 3, true}, {-time.Second, 1, true}, {time.Millisecond, 100, true},
		{0, 3, false}, {time.Second, 0, false}, {time.Second, -1, false},
	} {
		l := coordinatorLimits{liveChildrenMax: 64, startQueueMax: protocol.DefaultStartQueueMax, userOpenRootsMax: 1, userRequestsPerSecond: 1, userRequestsBurst: 1,
			requestTimeout: protocol.RequestTimeout, continueWaitMax: tc.wait, takeoversMax: tc.takeovers}
		err := l.validate()
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s, %d: %v", tc.wait, tc.takeovers, err)
		case !tc.ok && (protocol.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), "--takeovers-max")):
			t.Errorf("%s, %d: %v; want INVALID_ARGUMENT naming the flags", tc.wait, tc.takeovers, err)
		}
	}
}
