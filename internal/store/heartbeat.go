package store

import (
	"context"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Host records (brood_hosts <hostId>, docs/protocol.md §7.7): each worker host
// and coordinator replica puts its own record on every heartbeat and deletes
// it when it stops; liveness is judged from the heartbeats (DESIGN.md §4).

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
func HeartbeatLoop(ctx context.Context, interval, expiry time.Duration, beat func(context.Context) error, onGap func(gap time.Duration), onErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
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
			onGap(gap)
		}
	}
}
