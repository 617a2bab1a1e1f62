package bench

import (
	"context"
	"runtime/pprof"
	"sync"
	"testing"
	"time"
)

func TestComponentOf(t *testing.T) {
	for _, c := range []struct{ labels, want string }{
		{"", unlabelled},
		{"component=worker", "worker"},
		{"component=server", "server"},
		{"account=$G,stream=BROOD_LOG_spawn,type=stream", "server"},
		{"account=$G,consumer=c1,stream=S,type=consumer", "server"},
		{"component=coordinator,stream=X", "coordinator"}, // a component label wins
		{"other=x", unlabelled},
	} {
		if got := componentOf(c.labels); got != c.want {
			t.Errorf("componentOf(%q) = %q, want %q", c.labels, got, c.want)
		}
	}
}

// burn spends about d of CPU on the calling goroutine (its own thread's
// clock is not at hand, so it spins on the wall clock: on a loaded machine
// it spends less, never more).
func burn(d time.Duration) (x uint64) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	return x
}

// TestCPUWindowSplitsByComponent: work done under component=worker and
// under nats-server's own labels (a stream's goroutine) is read back from
// the window's profile as the worker's and the server's, and the process's
// getrusage figure covers it.
func TestCPUWindowSplitsByComponent(t *testing.T) {
	w := startCPUWindow(t)
	if !w.profiling {
		t.Skipf("a CPU profile is already running: %v", w.err)
	}
	var wg sync.WaitGroup
	for _, labels := range []pprof.LabelSet{
		pprof.Labels("component", "worker"),
		pprof.Labels("account", "$G", "stream", "S", "type", "stream"),
	} {
		wg.Add(1)
		go pprof.Do(context.Background(), labels, func(context.Context) {
			defer wg.Done()
			burn(300 * time.Millisecond)
		})
	}
	wg.Wait()
	f := w.stop(t)
	by, samples := f.byComponent, f.samples
	if samples == 0 || by["worker"] == 0 || by["server"] == 0 {
		t.Fatalf("samples %d, by component %v: want the worker's and the server's work in it", samples, by)
	}
	if by["worker"]+by["server"] < by[unlabelled] {
		t.Errorf("by component %v: the labelled work is less than the unlabelled", by)
	}
	if f.process < (by["worker"]+by["server"])/2 {
		t.Errorf("process CPU %v (getrusage) below half the labelled work sampled (%v)", f.process, by)
	}
}
