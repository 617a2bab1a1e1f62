package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestResidentWaitsForATakeoverInProgress: a session whose lease names a
// host that is not live, while another goroutine of this replica takes it
// over, is read again until that takeover is done, within the caller's
// budget and residentWaitMax, not for a fixed number of reads: a takeover
// through a leader election takes seconds, and a followup refused "session
// changing hands" after 200 ms had most of its budget left
// (TestLeaderElectionsAreNotFailures). A takeover that does not end within
// the budget is UNAVAILABLE.
func TestResidentWaitsForATakeoverInProgress(t *testing.T) {
	s := stack.New(t)
	c := s.AddCoordinator()
	for _, tc := range []struct {
		name     string
		takeover time.Duration // how long the takeover in progress takes; 0: it does not end
		budget   time.Duration
	}{
		{"a takeover that ends within the budget", time.Second, 10 * time.Second},
		{"a takeover that outlasts the budget", 0, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			id := "resident-" + nuid.Next()
			if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: id, CreatedAt: store.NowMs(),
				ParentSession: "P-" + id, Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn"}); err != nil {
				t.Fatal(err)
			}
			rev, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: id, Kind: protocol.AgentContinuable,
				HostID: "spawn.gone", Epoch: 1, RunID: "run-" + id, Provider: "spawn", ParentSession: "P-" + id, CreatedAt: store.NowMs()})
			if err != nil {
				t.Fatal(err)
			}
			release := c.HoldTakeover(id)
			defer release()
			if tc.takeover > 0 {
				done := time.AfterFunc(tc.takeover, func() { // the takeover settles the session and lets go
					if err := s.Store.ReleaseLease(ctx, id, rev); err != nil {
						t.Errorf("release the lease: %v", err)
					}
					release()
				})
				defer done.Stop()
			}
			rctx, cancel := context.WithTimeout(ctx, tc.budget)
			defer cancel()
			began := time.Now()
			l, err := c.Resident(rctx, id)
			took := time.Since(began)
			if tc.takeover > 0 {
				if err != nil || l != nil {
					t.Fatalf("resident after a takeover of %s: %v, %v; want no lease and no error", tc.takeover, l, err)
				}
				if took < tc.takeover {
					t.Errorf("resident answered after %s, before the takeover in progress ended (%s)", took, tc.takeover)
				}
				return
			}
			if protocol.CodeOf(err) != protocol.CodeUnavailable {
				t.Fatalf("resident while a takeover outlasts the budget: %v, %v; want UNAVAILABLE", l, err)
			}
			if took < tc.budget || took > coordinator.ResidentWaitMax {
				t.Errorf("resident gave up after %s; want the budget (%s)", took, tc.budget)
			}
		})
	}
}
