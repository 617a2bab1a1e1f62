package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// How the cost grows with the fleet (issue 12, point 5; make bench-scale):
// one-shot p50 and runs/s against the number of coordinators and worker
// processes, against the sessions stored, and against the continuable
// children held resident on one worker, with the memory each takes. Every
// service runs in this process on its own connection (a worker process is
// a worker host with its own connection), so memory is measured for all of
// them at once, server included: the heap in use plus goroutine stacks
// after a GC, before and after adding what is measured.

var scaleOut = flag.String("scale.out", "out", "directory make bench-scale writes scale.md and scale.svg to")

const (
	scaleSequentialRuns  = 300  // samples of one-shot p50
	scaleThroughputRuns  = 3000 // runs of one runs/s figure
	scaleParents         = 64
	scaleStoredSessions  = 100_000
	scaleResidentMax     = 10_000
	scaleChildrenPerRoot = 50 // under the 64 live children per parent
)

// oneShotFigures are a one-shot p50 and runs/s with their same-run baselines.
type oneShotFigures struct {
	p50, floor  time.Duration
	runsPerSec  float64
	publishRate float64
}

func (f oneShotFigures) String() string {
	return fmt.Sprintf("p50 %.3f ms (floor %.3f ms, ratio %.2f); %.0f runs/s (async publish %.0f msg/s, ratio to rate/12 %.2f)",
		ms(f.p50), ms(f.floor), float64(f.p50)/float64(f.floor), f.runsPerSec, f.publishRate, f.runsPerSec/f.publishRate*12)
}

// measureOneShot takes one-shot p50 (sequential, from one root) and runs/s
// (scaleParents roots at once) on s, with their baselines.
func measureOneShot(b *testing.B, s *stack.Stack, roots []*client.Root) oneShotFigures {
	b.Helper()
	js, err := jetstream.New(s.NC)
	if err != nil {
		b.Fatal(err)
	}
	var f oneShotFigures
	f.floor = 2*requestReplyP50(b, s.NC) + 5*fencedPublishP50(b, js)
	f.publishRate = asyncPublishRate(b, js)
	ctx := context.Background()
	one := func(root *client.Root) {
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			b.Fatalf("result %+v, %v", res, err)
		}
	}
	for i := 0; i < 30; i++ {
		one(roots[0])
	}
	lat := make([]time.Duration, 0, scaleSequentialRuns)
	for i := 0; i < scaleSequentialRuns; i++ {
		t := time.Now()
		one(roots[0])
		lat = append(lat, time.Since(t))
	}
	f.p50 = percentile(lat, 0.5)
	start := time.Now()
	runAtOnce(scaleThroughputRuns, scaleParents, func(p int) { one(roots[p%len(roots)]) })
	f.runsPerSec = scaleThroughputRuns / time.Since(start).Seconds()
	return f
}

// runAtOnce makes n calls of run from parents goroutines at once, each
// passing its goroutine's index (0 to parents-1), and returns when all end.
func runAtOnce(n, parents int, run func(p int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for p := 0; p < parents; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				run(p)
			}
		}()
	}
	wg.Wait()
}

func openRoots(s *stack.Stack, n int) []*client.Root {
	roots := make([]*client.Root, n)
	for i := range roots {
		roots[i] = s.Root()
	}
	return roots
}

// memInUse is the heap in use plus goroutine stacks after a GC, in bytes.
func memInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// prefillSessions stores n finished one-shot sessions under one parent, as
// a long-lived deployment holds them: a header, one log record (the whole
// turn) and a settled run record each, published asynchronously.
func prefillSessions(b *testing.B, s *stack.Stack, n int) {
	b.Helper()
	js, err := jetstream.New(s.NC, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	parent := ulid.Make().String()
	pub := func(subject string, v any) {
		data, err := protocol.Marshal(protocol.Msgpack, v)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(subject, data, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		id := ulid.Make().String()
		now := store.NowMs()
		pub(s.Store.Subj.Session(id), protocol.SessionHeader{
			Version: protocol.SessionHeaderVersion, ID: id, CreatedAt: now, Cwd: "/tmp", ParentSession: parent,
			Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn",
		})
		evs := turnEvents(b, 1, "say ok", "ok")
		pub(s.Store.Subj.Log("spawn", id), protocol.LogRecord{Events: evs})
		// A run is its spec and its state (store.RunSpecKey, RunStateKey).
		run := store.Settled(protocol.RunRecord{
			RunID: id, ChildID: id, ParentSession: parent, Provider: "spawn", Mode: protocol.ModeOneShot,
			State: protocol.RunRunning, CreatedAt: now, HostID: "spawn.gone",
		}, "spawn.gone", protocol.SubagentResult{Output: protocol.Text("ok"), StopReason: protocol.StopCompleted})
		pub("$KV."+s.Store.Subj.BucketRuns()+"."+store.RunSpecKey(run.Provider, id), run)
		pub("$KV."+s.Store.Subj.BucketRuns()+"."+store.RunStateKey("spawn", id), run)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("prefill not acknowledged within 5 minutes")
	}
}

// countingModel counts the model requests of the worker's scripted models.
type countingModel struct {
	model.Model
	n *atomic.Int64
}

func (m countingModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	m.n.Add(1)
	return m.Model.Stream(ctx, req, onText)
}

// holdResident starts continuable children that sleep in their first model
// request across roots (scaleChildrenPerRoot each) until `total` are
// resident, counting the model requests to know they are.
func holdResident(b *testing.B, s *stack.Stack, calls *atomic.Int64, roots *[]*client.Root, total int) time.Duration {
	b.Helper()
	start := time.Now()
	have := int(calls.Load())
	var next atomic.Int64
	next.Store(int64(have))
	for len(*roots)*scaleChildrenPerRoot < total {
		*roots = append(*roots, s.Root())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				ref := (*roots)[i/scaleChildrenPerRoot].Ref()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Label: "resident", Parent: ref, Prompt: protocol.Text("sleep 1h\nsay done")})
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for calls.Load() < int64(total) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d children resident after 5 minutes", calls.Load(), total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

type scaleRow struct {
	what  string
	cells []string
}

// BenchmarkScale: make bench-scale's figures, each part a sub-benchmark
// run once (-benchtime 1x; each part has its own fixed sample counts, and
// its stack stops when it ends), written to -scale.out as scale.md (the
// tables) and scale.svg (the plot).
func BenchmarkScale(b *testing.B) {
	var md strings.Builder
	var panels []panel
	fmt.Fprintf(&md, "Load average (1 min) at start: %s\n\n", loadAverage())

	// Coordinators and worker processes.
	fmt.Fprintf(&md, "| coordinators × worker processes | one-shot p50 | floor (same run) | ratio | runs/s, %d parents | async publish rate | ratio to rate/12 |\n|---|---|---|---|---|---|---|\n", scaleParents)
	p50s, rates := panel{title: "one-shot p50 by fleet", unit: "ms (N coordinators × N workers)"}, panel{title: "one-shot runs/s by fleet", unit: "runs/s, 64 parents"}
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("fleet=%d", n), func(b *testing.B) {
			s := newBareStack(b)
			addServices(b, s, n, n, stackMods{})
			f := measureOneShot(b, s, openRoots(s, scaleParents))
			fmt.Printf("fleet %d×%d: %s\n", n, n, f)
			fmt.Fprintf(&md, "| %d × %d | %.3f ms | %.3f ms | %.2f | %.0f | %.0f msg/s | %.2f |\n", n, n, ms(f.p50), ms(f.floor), float64(f.p50)/float64(f.floor), f.runsPerSec, f.publishRate, f.runsPerSec/f.publishRate*12)
			p50s.bars = append(p50s.bars, bar{fmt.Sprintf("%d×%d", n, n), ms(f.p50)})
			rates.bars = append(rates.bars, bar{fmt.Sprintf("%d×%d", n, n), f.runsPerSec})
		})
	}
	panels = append(panels, p50s, rates)

	// Stored sessions, and memory per coordinator.
	fmt.Fprintf(&md, "\n| sessions stored | coordinator and worker ready in | one-shot p50 | floor | ratio | runs/s | async publish rate | ratio to rate/12 | memory per coordinator |\n|---|---|---|---|---|---|---|---|---|\n")
	sp50, srate := panel{title: "one-shot p50 by sessions stored", unit: "ms"}, panel{title: "runs/s by sessions stored", unit: "runs/s, 64 parents"}
	for _, stored := range []int{0, scaleStoredSessions} {
		b.Run(fmt.Sprintf("stored=%d", stored), func(b *testing.B) {
			s := newBareStack(b)
			if stored > 0 {
				t := time.Now()
				prefillSessions(b, s, stored)
				fmt.Printf("prefilled %d sessions in %s\n", stored, time.Since(t).Round(time.Millisecond))
			}
			t := time.Now()
			addServices(b, s, 1, 1, stackMods{})
			ready := time.Since(t)
			roots := openRoots(s, scaleParents)
			f := measureOneShot(b, s, roots)
			before := memInUse()
			addServices(b, s, 1, 0, stackMods{}) // one more coordinator, then load through both
			measureOneShotLight(b, s, roots[0], 200)
			perCoordinator := (int64(memInUse()) - int64(before)) >> 10
			fmt.Printf("%d sessions stored: coordinator and worker ready in %s; %s; memory per coordinator %d KiB\n", stored, ready.Round(time.Millisecond), f, perCoordinator)
			fmt.Fprintf(&md, "| %d | %s | %.3f ms | %.3f ms | %.2f | %.0f | %.0f msg/s | %.2f | %d KiB |\n", stored, ready.Round(time.Millisecond), ms(f.p50), ms(f.floor), float64(f.p50)/float64(f.floor), f.runsPerSec, f.publishRate, f.runsPerSec/f.publishRate*12, perCoordinator)
			label := fmt.Sprintf("%dk", stored/1000)
			sp50.bars = append(sp50.bars, bar{label, ms(f.p50)})
			srate.bars = append(srate.bars, bar{label, f.runsPerSec})
		})
	}
	panels = append(panels, sp50, srate)

	// Resident continuable children on one worker.
	fmt.Fprintf(&md, "\n| continuable children resident on one worker | roots | reached in | one-shot p50 (sequential) | memory in use (process, server included) | per resident child |\n|---|---|---|---|---|---|\n")
	rp50, rmem := panel{title: "one-shot p50 by resident children", unit: "ms, one worker"}, panel{title: "memory per resident child", unit: "KiB, server included"}
	b.Run("resident", func(b *testing.B) {
		var calls atomic.Int64
		s := newBareStack(b)
		addServices(b, s, 1, 1, stackMods{worker: func(c *worker.InProcessConfig) {
			c.Models = func() (model.Model, error) { return countingModel{Model: model.NewScripted(), n: &calls}, nil }
		}})
		probe := s.Root()
		measureOneShotLight(b, s, probe, 50)
		base := memInUse()
		p50 := measureOneShotLight(b, s, probe, scaleSequentialRuns)
		fmt.Fprintf(&md, "| 0 | 0 | | %.3f ms | %d MiB | |\n", ms(p50), base>>20)
		rp50.bars = append(rp50.bars, bar{"0", ms(p50)})
		calls.Store(0)
		var roots []*client.Root
		for _, n := range []int{1000, scaleResidentMax} {
			took := holdResident(b, s, &calls, &roots, n)
			mem := memInUse()
			per := float64(int64(mem)-int64(base)) / float64(n) / 1024
			p50 := measureOneShotLight(b, s, probe, scaleSequentialRuns)
			fmt.Printf("%d resident children across %d roots (in %s): one-shot p50 %.3f ms; memory in use %d MiB, %.1f KiB per child\n", n, len(roots), took.Round(time.Millisecond), ms(p50), mem>>20, per)
			fmt.Fprintf(&md, "| %d | %d | %s | %.3f ms | %d MiB | %.1f KiB |\n", n, len(roots), took.Round(time.Millisecond), ms(p50), mem>>20, per)
			rp50.bars = append(rp50.bars, bar{fmt.Sprint(n), ms(p50)})
			rmem.bars = append(rmem.bars, bar{fmt.Sprint(n), per})
		}
	})
	panels = append(panels, rp50, rmem)

	if err := os.MkdirAll(*scaleOut, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*scaleOut, "scale.md"), []byte(md.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := writeSVG(filepath.Join(*scaleOut, "scale.svg"), "Brood: how the cost grows (make bench-scale)", panels); err != nil {
		b.Fatal(err)
	}
	fmt.Print(md.String())
}

// measureOneShotLight is the p50 of n sequential one-shot runs from root.
func measureOneShotLight(b *testing.B, s *stack.Stack, root *client.Root, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t := time.Now()
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
		if err != nil {
			b.Fatal(err)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			b.Fatalf("result %+v, %v", res, err)
		}
		lat = append(lat, time.Since(t))
	}
	return percentile(lat, 0.5)
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(data))[0]
}
