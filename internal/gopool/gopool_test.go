package gopool

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGoRunsOnThePoolTheContextCarries: with a Pool in the context, tasks
// given one after another run on goroutines it reuses (never one each);
// without one, a task still runs. Once the Pool's context is done, Wait
// returns: its idle goroutines exited.
func TestGoRunsOnThePoolTheContextCarries(t *testing.T) {
	pctx, cancel := context.WithCancel(context.Background())
	p := New(pctx)
	ctx := WithPool(context.Background(), p)
	const n = 20
	for i := 0; i < n; i++ {
		done := make(chan struct{})
		Go(ctx, func() { close(done) })
		<-done
	}
	// A task is done before its goroutine goes back to wait, so the next
	// one can come first and start another goroutine; never one each.
	if started := p.started.Load(); started > n/2 {
		t.Fatalf("%d tasks in series started %d goroutines; want them reused", n, started)
	}
	ran := make(chan struct{})
	Go(context.Background(), func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("a task without a pool did not run")
	}
	cancel()
	waited := make(chan struct{})
	go func() { p.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return once the pool's context was done")
	}
	late := make(chan struct{})
	Go(ctx, func() { close(late) }) // after Wait: runs, untracked
	<-late
}
