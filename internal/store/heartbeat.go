package store

import (
	"context"
	"sync"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Host records (brood_hosts <hostId>, docs/protocol.md §7.7): each worker host
// and coordinator replica puts its own record on every heartbeat and deletes
// it when it stops; liveness is judged from the heartbeats (docs/design.md §4).

// PutHost writes rec as its host's record (a heartbeat).
func (s *Store) PutHost(ctx context.Context, rec protocol.HostRecord) (uint64, error) {
	return Put(ctx, s.Hosts, HostKey(rec.HostID), rec)
}

// DeleteHost removes a host's record (a host that stops).
func (s *Store) DeleteHost(ctx context.Context, hostID string) error {
	return Delete(ctx, s.Hosts, HostKey(hostID), 0)
}

// HeartbeatLoop calls beat every interval until ctx is done. When the time
// since the last successful beat exceeds expiry (the process was paused or
// cut off), onGap (if set) runs after the next successful beat, since others
// may have judged this process dead meanwhile. A failed beat goes to onErr
// unless ctx is done.
//
// onGap runs beside the beats, one call at a time (a gap while one runs
// makes it run once more when it ends), and HeartbeatLoop returns only once
// it finished: what onGap does after a gap (a worker reads every lease, each
// read retried through the election that caused the gap) can take longer
// than an expiry, and beats held up behind it would make others judge this
// live process dead right after the gap: after one election, every worker
// verifies its leases at once, and all of a provider's instances could go
// silent together (TestLeaderElectionsAreNotFailures: starts refused
// UNAVAILABLE, "none heartbeated within" the expiry).
func HeartbeatLoop(ctx context.Context, interval, expiry time.Duration, beat func(context.Context) error, onGap func(gap time.Duration), onErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	gaps := gapRunner{onGap: onGap}
	defer gaps.wg.Wait()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		gap := time.Since(last)
		if err := beat(ctx); err != nil {
			if ctx.Err() == nil {
				onErr(err)
			}
			continue
		}
		last = time.Now()
		if gap > expiry && onGap != nil {
			gaps.run(gap)
		}
	}
}

// gapRunner runs HeartbeatLoop's onGap in a goroutine of its own, one call at
// a time: a gap that comes while a call runs is handled by one more call
// after it (the latest such gap).
type gapRunner struct {
	onGap   func(time.Duration)
	wg      sync.WaitGroup
	mu      sync.Mutex
	running bool
	pending time.Duration // a gap that came while a call ran; 0: none
}

func (g *gapRunner) run(gap time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running {
		g.pending = gap
		return
	}
	g.running = true
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			g.onGap(gap)
			g.mu.Lock()
			if g.pending == 0 {
				g.running = false
				g.mu.Unlock()
				return
			}
			gap, g.pending = g.pending, 0
			g.mu.Unlock()
		}
	}()
}
