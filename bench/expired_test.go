package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// What a coordinator keeps of runs whose records expired (issue 12, point
// 5: memory per coordinator with its caches bounded). Runs settle and their
// brood_runs keys expire by their TTL (RunsMaxAge, short here); the memory
// in use (the process's: server, coordinator, worker and client, after a
// GC) is taken before the runs and once the bucket is empty again, so what
// it grew by is what the services still hold of runs that no longer exist.
// Run it with -bench '^BenchmarkExpiredRunsMemory$' -benchtime 1x.

var (
	expiredRuns = flag.Int("expired.runs", 20_000, "one-shot runs of BenchmarkExpiredRunsMemory")
	expiredHeap = flag.String("expired.heap", "", "file BenchmarkExpiredRunsMemory writes the heap profile to once the records expired")
)

// expiredRunsMaxAge is the RunsMaxAge of BenchmarkExpiredRunsMemory.
const expiredRunsMaxAge = 2 * time.Second

// The coordinator's windows by age that BenchmarkExpiredRunsMemory waits
// out (services/coordinator: endedKeptFor, kvLapseSlack, kvLapseSweep).
const (
	coordinatorEndedKeptFor = 10 * time.Second
	coordinatorLapseSlack   = 2 * time.Second
	coordinatorLapseSweep   = time.Second
)

func BenchmarkExpiredRunsMemory(b *testing.B) {
	s := newBareStack(b)
	s.Store.Cfg.RunsMaxAge = expiredRunsMaxAge // before any service binds the store
	addServices(b, s, 1, 1, stackMods{})
	roots := openRoots(s, scaleParents)
	ctx := context.Background()
	one := func(i int) {
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: roots[i%len(roots)].Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			b.Fatalf("result %+v, %v", res, err)
		}
	}
	bucketEmpty := func() {
		testutil.Eventually(b, 5*time.Minute, func() bool {
			info, err := s.Store.Runs.Status(ctx)
			return err == nil && info.Values() == 0
		}, "brood_runs empty once every run's keys expired")
	}
	empty := func() {
		bucketEmpty()
		// The replica's window of recently settled runs drops a run once it
		// is older than endedKeptFor, when the next run settles (a window by
		// age: no state to wait on); then that run's keys expire, and the
		// watch forgets lapsed keys kvLapseSlack after, at its next sweep.
		time.Sleep(coordinatorEndedKeptFor)
		one(0)
		bucketEmpty()
		time.Sleep(coordinatorLapseSlack + coordinatorLapseSweep)
	}
	for i := 0; i < 200; i++ { // warm up
		one(i)
	}
	empty()
	before := memInUse()
	n := *expiredRuns
	start := time.Now()
	runAtOnce(n, scaleParents, one)
	took := time.Since(start)
	during := memInUse()
	empty()
	after := memInUse()
	if *expiredHeap != "" {
		f, err := os.Create(*expiredHeap)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
	}
	grew := int64(after) - int64(before)
	fmt.Printf("%d one-shot runs in %s (RunsMaxAge %s), load %s: memory in use %d KiB before, %d KiB after the runs, %d KiB once their records expired: %+d KiB, %.1f B per run\n",
		n, took.Round(time.Millisecond), expiredRunsMaxAge, loadAverage(), before>>10, during>>10, after>>10, grew>>10, float64(grew)/float64(n))
	b.ReportMetric(float64(grew)/float64(n), "B/run-kept")
}
