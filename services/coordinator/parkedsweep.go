package coordinator

import (
	"context"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// The parked sweep (docs/protocol.md §5.21, "Waking a parked child";
// RELIABILITY.md, I10): a turn parked on a request is continued by its
// session's next activation, which a takeover starts at once and an answer
// or a timeout starts when no activation holds the session (wakeParked).
// Should those resumes fail (no live host of its provider then, a replica
// that stopped), or the session's host drain without its answer, nothing
// would wake the session again, and a request no one reads would outlive
// its deadline. So every ParkedSweepInterval each replica looks through
// the request records its watch of brood_agents holds (agentIndex: no
// listing of the bucket, which would be a consumer created per replica
// per sweep), reading at most ParkedSweepRequestsMax of them from the
// store: a pending one past its deadline is timed out (which wakes its
// session), and the session of a record whose log ends parked, with no
// live activation, is resumed. A record found with nothing to wake is not
// read again until it changes (its revision); a resume is an epoch taken
// by compare-and-set, so sweeps of several replicas, a takeover and an
// answer resume a session once.

// DefaultParkedSweepInterval is Config.ParkedSweepInterval's default.
const DefaultParkedSweepInterval = 10 * time.Second

// ParkedSweepRequestsMax bounds the request records one sweep reads from
// the store (those found quiet at their revision are not read); the rest
// wait for the next sweep.
const ParkedSweepRequestsMax = 1024

// parkedSweep runs the sweep every Config.ParkedSweepInterval until ctx ends.
func (c *Coordinator) parkedSweep(ctx context.Context) {
	every := c.cfg.ParkedSweepInterval
	if every <= 0 {
		every = DefaultParkedSweepInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	quiet := map[string]uint64{} // request id → the revision found with nothing to wake
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.sweepParked(ctx, quiet)
	}
}

// sweepParked is one sweep (parkedSweep); quiet is updated in place.
func (c *Coordinator) sweepParked(ctx context.Context, quiet map[string]uint64) {
	ids, revs := c.agents.requestRevisions()
	listed := make(map[string]bool, len(ids))
	reads := 0
	for i, id := range ids {
		listed[id] = true
		if ctx.Err() != nil {
			return
		}
		if rev, ok := quiet[id]; ok && rev == revs[i] || reads == ParkedSweepRequestsMax {
			continue
		}
		reads++
		rec, err := c.st.Request(ctx, id)
		if err != nil || quiet[id] == rec.Revision {
			continue
		}
		if rec, err = c.expiredRecord(ctx, rec); err != nil {
			continue
		}
		child := rec.Value.SessionID
		if c.residentCached(ctx, child) != nil {
			continue // its activation reads the request itself
		}
		h, err := c.headers.get(ctx, c.st, child)
		if err != nil {
			continue
		}
		parked, err := c.parkedTurn(ctx, h)
		switch {
		case err != nil:
			continue
		case !parked || h.Origin != protocol.OriginSubagent:
			quiet[id] = rec.Revision
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, c.resumeTimeout())
		c.resumePending(rctx, child)
		cancel()
	}
	for id := range quiet {
		if !listed[id] {
			delete(quiet, id) // gone (its TTL passed)
		}
	}
}
