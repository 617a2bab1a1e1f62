package worker

import (
	"context"
	"time"
)

// HeartbeatLoop calls beat every interval until ctx is done. When the time
// since the last successful beat exceeds expiry (the process was paused or
// cut off), onGap runs after the next successful beat, since others may have
// judged this process dead meanwhile.
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
