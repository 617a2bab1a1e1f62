package store

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// gapExpiry is the expiry of gapLoop's HeartbeatLoop: long enough that a
// loaded machine's scheduling delays between two 5 ms beats are no gap.
const gapExpiry = time.Second

// gapLoop runs HeartbeatLoop with a 5 ms interval and a gapExpiry expiry whose
// beats fail while failing is set, and whose onGap reports each call on
// entered and blocks until release is closed.
type gapLoop struct {
	beats   atomic.Int64 // successful beats
	failing atomic.Bool
	entered chan time.Duration
	release chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

func startGapLoop(t *testing.T) *gapLoop {
	t.Helper()
	l := &gapLoop{entered: make(chan time.Duration, 4), release: make(chan struct{}), done: make(chan struct{})}
	var ctx context.Context
	ctx, l.cancel = context.WithCancel(context.Background())
	beat := func(context.Context) error {
		if l.failing.Load() {
			return errors.New("no leader")
		}
		l.beats.Add(1)
		return nil
	}
	onGap := func(gap time.Duration) {
		l.entered <- gap
		<-l.release
	}
	go func() {
		defer close(l.done)
		HeartbeatLoop(ctx, 5*time.Millisecond, gapExpiry, beat, onGap, func(error) {})
	}()
	t.Cleanup(func() {
		select {
		case <-l.release:
		default:
			close(l.release)
		}
		l.cancel()
		<-l.done
	})
	return l
}

// gap fails the beats for longer than the expiry, then lets them land again.
func (l *gapLoop) gap() {
	l.failing.Store(true)
	time.Sleep(gapExpiry + gapExpiry/2) // the outage itself: longer than the expiry
	l.failing.Store(false)
}

func (l *gapLoop) waitEntered(t *testing.T) time.Duration {
	t.Helper()
	select {
	case g := <-l.entered:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("onGap was not called after a gap longer than the expiry")
		return 0
	}
}

// beatsAdvance waits until n more beats landed.
func (l *gapLoop) beatsAdvance(t *testing.T, n int64, what string) {
	t.Helper()
	from := l.beats.Load()
	for deadline := time.Now().Add(10 * time.Second); l.beats.Load() < from+n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d beats in 10 s, want %d", what, l.beats.Load()-from, n)
		}
	}
}

// TestHeartbeatLoopBeatsWhileOnGapRuns: what a host does after a heartbeat
// gap (a worker reads every lease, each read retried through the election
// that caused the gap) must not hold up its beats, or others judge the live
// host dead right after the gap; HeartbeatLoop still returns only once onGap
// finished, and a gap that comes while onGap runs gets a call of its own.
func TestHeartbeatLoopBeatsWhileOnGapRuns(t *testing.T) {
	l := startGapLoop(t)
	l.beatsAdvance(t, 3, "before any gap")
	if len(l.entered) != 0 {
		t.Fatal("onGap ran without a gap")
	}
	l.gap()
	if g := l.waitEntered(t); g <= gapExpiry {
		t.Errorf("onGap got a gap of %s, want more than the %s expiry", g, gapExpiry)
	}
	// onGap is blocked: the beats go on.
	l.beatsAdvance(t, 20, "while onGap runs")

	// A second gap while the first call still runs: no call beside it, one
	// more after it.
	l.gap()
	l.beatsAdvance(t, 3, "after the second gap")
	select {
	case <-l.entered:
		t.Fatal("onGap ran twice at once")
	default:
	}

	l.cancel()
	select {
	case <-l.done:
		t.Fatal("HeartbeatLoop returned while onGap was still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(l.release)
	if g := l.waitEntered(t); g <= gapExpiry {
		t.Errorf("the second gap's call got %s, want more than the %s expiry", g, gapExpiry)
	}
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("HeartbeatLoop did not return after onGap finished")
	}
}
