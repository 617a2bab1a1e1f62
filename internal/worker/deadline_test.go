package worker

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestWithDeadlineDropsStaleRequests: a request whose deadline passed is
// dropped as UNAVAILABLE before anything is written (docs/design.md §14); one
// without a deadline (0) gets ClaimBudgetMax; a near deadline bounds the
// claim, a far one is capped at ClaimBudgetMax.
func TestWithDeadlineDropsStaleRequests(t *testing.T) {
	var logged syncLog
	h := &Host{log: slog.New(slog.NewTextHandler(&logged, nil)), id: "host-1"}
	ctx := context.Background()
	now := time.Now()
	for _, tc := range []struct {
		name     string
		deadline int64
		stale    bool
		within   time.Duration // the bound's distance from now, at most
		atLeast  time.Duration
	}{
		{"passed", now.Add(-time.Second).UnixMilli(), true, 0, 0},
		{"none", 0, false, ClaimBudgetMax, ClaimBudgetMax - 5*time.Second},
		{"near", now.Add(3 * time.Second).UnixMilli(), false, 3 * time.Second, time.Second},
		{"far", now.Add(time.Hour).UnixMilli(), false, ClaimBudgetMax, ClaimBudgetMax - 5*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, cancel, err := h.withDeadline(ctx, tc.deadline, "start", "run-1")
			if tc.stale {
				if protocol.CodeOf(err) != protocol.CodeUnavailable || !strings.Contains(err.Error(), "after its deadline") || c != nil {
					t.Fatalf("a request past its deadline: %v, want UNAVAILABLE and no context", err)
				}
				// How late it came, in the answer and the log: a second, not less, not negative.
				late := regexp.MustCompile(`run-1 (1(\.\d+)?s) after its deadline`).FindStringSubmatch(err.Error())
				if late == nil {
					t.Fatalf("the answer does not say how late the request came: %v", err)
				}
				if !regexp.MustCompile(`late=1(\.\d+)?s`).MatchString(logged.String()) {
					t.Fatalf("the warning does not say how late the request came: %s", logged.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer cancel()
			d, ok := c.Deadline()
			left := time.Until(d)
			if !ok || left > tc.within || left < tc.atLeast {
				t.Fatalf("bound %s from now, want between %s and %s", left, tc.atLeast, tc.within)
			}
		})
	}
}

// TestUnsettledKeepsAtMostUnsettledMax: past UnsettledMax waiting
// settlements, the oldest is given up, one for one.
func TestUnsettledKeepsAtMostUnsettledMax(t *testing.T) {
	var u unsettled
	for i := 0; i <= UnsettledMax; i++ {
		u.add(fmt.Sprintf("run-%d", i), func(context.Context) bool { return true })
	}
	if len(u.order) != UnsettledMax || len(u.pending) != UnsettledMax {
		t.Fatalf("%d waiting (%d in the map), want %d", len(u.order), len(u.pending), UnsettledMax)
	}
	if _, ok := u.pending["run-0"]; ok || u.order[0] != "run-1" {
		t.Fatalf("the oldest was kept: first is %s", u.order[0])
	}
	if _, ok := u.pending[fmt.Sprintf("run-%d", UnsettledMax)]; !ok {
		t.Fatal("the newest was not kept")
	}
}

// syncLog is a log destination safe for concurrent writes.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
