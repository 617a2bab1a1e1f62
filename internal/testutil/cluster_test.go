package testutil

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records the failure and ends
// the calling goroutine, as t.Fatalf does, without failing the test.
type fatalRecorder struct {
	testing.TB
	failed chan string
}

func (f fatalRecorder) Fatalf(format string, args ...any) {
	f.failed <- fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f fatalRecorder) Helper() {}

// TestStopRefusesABadIndexWithoutTheLock: Stop of an index that names no
// node fails the test and leaves the cluster usable (its lock free): a
// Stop(-1) panicked under the lock and the cleanup that stops every node
// hung on it (issue 37, item 9).
func TestStopRefusesABadIndexWithoutTheLock(t *testing.T) {
	c := NewCluster(t, 3)
	rec := fatalRecorder{TB: t, failed: make(chan string, 1)}
	real := c.t
	c.t = rec
	for _, i := range []int{-1, 3} {
		done := make(chan struct{})
		go func() { defer close(done); c.Stop(i) }()
		select {
		case msg := <-rec.failed:
			t.Logf("Stop(%d): %s", i, msg)
		case <-time.After(10 * time.Second):
			t.Fatalf("Stop(%d) neither failed nor returned in 10 s", i)
		}
		<-done
	}
	c.t = real
	stopped := make(chan struct{})
	go func() { defer close(stopped); c.Stop(0) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop(0) after the bad indexes hung: the cluster's lock was left held")
	}
}
