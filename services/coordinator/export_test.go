package coordinator

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator/slotrecord"
)

// For the external tests of admission (slots_test.go): a parent's slot
// record as brood_agents `slots.<parent>` holds it, and the bound of one
// admission's compare-and-set attempts.
type ChildSlotsRecord = childSlotsRecord

type ChildSlot = childSlot

const SlotAttemptsMax = slotrecord.AttemptsMax

// Resident is resident, for TestResidentWaitsForATakeoverInProgress.
func (c *Coordinator) Resident(ctx context.Context, childID string) (*store.Record[protocol.AgentRecord], error) {
	return c.resident(ctx, childID)
}

// HoldTakeover marks a takeover of id in progress in this replica, as a
// goroutine taking it over does, until the returned release.
func (c *Coordinator) HoldTakeover(id string) (release func()) {
	if !c.claim(id) {
		panic("a takeover of " + id + " is already in progress")
	}
	return func() { c.release(id) }
}

const ResidentWaitMax = residentWaitMax

// ReserveChild is reserveChild (a one-shot child's slot), for
// TestAStaleSlotRevisionDoesNotWait.
func (c *Coordinator) ReserveChild(ctx context.Context, parent, child string) error {
	return c.reserveChild(ctx, parent, child, "")
}

// CountSlotBackoffs makes the replica count (and skip) the waits of its
// contended slot compare-and-sets; call before it serves.
func (c *Coordinator) CountSlotBackoffs(n *atomic.Int64) {
	c.slotBackoff = func() time.Duration { n.Add(1); return 0 }
}

// WatchedKeys returns the keys this replica's watches hold of brood_hosts,
// brood_agents and brood_runs (kvwatch.Watch.Keys).
func (c *Coordinator) WatchedKeys() (hosts, agents, runs int64) {
	return c.hostsWatch.Keys(), c.agentsWatch.Keys(), c.runsWatch.Keys()
}

// SettledReservationGrace is settledReservationGrace, for
// TestALateSettleOfASettledRunChargesWhatWasUsed.
const SettledReservationGrace = settledReservationGrace

// FailQueued is failQueued, for TestAQueuedStartFailedTwiceIsGivenBackOnce:
// two replicas' passes over a parent gone fail its entries at once.
func (c *Coordinator) FailQueued(ctx context.Context, parent string, e protocol.QueuedStart, cause error) {
	c.failQueued(ctx, parent, e, cause)
}
