package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// Where the time of a one-shot run goes. Two tools, both off the figures'
// path (the ratio benchmarks run without them):
//
//   - CPU by component: every benchmark stack starts the embedded server,
//     the coordinator, the worker and the client each under its own pprof
//     label (component=server|coordinator|worker|client); goroutines inherit
//     their creator's labels, so a connection's read loop, a subscription's
//     handler and the server's per-client goroutines carry their component's
//     label. `make bench-profile` takes a CPU profile of the throughput
//     benchmark and prints it by component (go tool pprof -tags) and each
//     component's hottest functions (-tagfocus). What carries no label is
//     the runtime's own work (GC, timers).
//   - The timeline of one run (BenchmarkOneShotTimeline): every store write
//     of the coordinator and the worker (store.WithFaults hooks, which see
//     each write before it is sent and when JetStream answered) and every
//     span (an in-memory OpenTelemetry recorder), as offsets from the
//     client's runs.start, medians over sequential runs.

// labelComponent gives the calling goroutine (and every goroutine it starts
// from now on) the pprof label component=name.
func labelComponent(name string) {
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("component", name)))
}

// stackMods changes the services of a benchmark stack (nil: none).
type stackMods struct {
	coordinator func(*coordinator.Config)
	worker      func(*worker.InProcessConfig)
}

// withStores is stackMods that wrap the coordinator's and the worker's stores.
func withStores(coordStore, workerStore func(*store.Store) *store.Store) stackMods {
	return stackMods{
		coordinator: func(c *coordinator.Config) { c.Store = coordStore(c.Store) },
		worker:      func(c *worker.InProcessConfig) { c.Store = workerStore(c.Store) },
	}
}

// newLabelledStack starts a stack whose server, coordinator, spawn worker
// and client each run under their own pprof label; the calling goroutine
// is left labelled client.
func newLabelledStack(b *testing.B, mods stackMods) *stack.Stack {
	b.Helper()
	s := newBareStack(b)
	addServices(b, s, 1, 1, mods)
	return s
}

// newBareStack starts a labelled server and a client on it, no services.
func newBareStack(b *testing.B) *stack.Stack {
	b.Helper()
	labelComponent("server")
	srv := testutil.Server(b)
	labelComponent("client")
	return stack.On(b, srv)
}

// addServices adds coordinators and spawn workers to s, each on its own
// connection and under its pprof label.
func addServices(b *testing.B, s *stack.Stack, coordinators, workers int, mods stackMods) {
	b.Helper()
	for i := 0; i < coordinators; i++ {
		labelComponent("coordinator")
		s.AddCoordinator(func(c *coordinator.Config) {
			if mods.coordinator != nil {
				mods.coordinator(c)
			}
		})
	}
	for i := 0; i < workers; i++ {
		labelComponent("worker")
		s.AddSpawnWorker(func(c *worker.InProcessConfig) {
			if mods.worker != nil {
				mods.worker(c)
			}
		})
	}
	labelComponent("client")
}

// writeEvent is one store write seen by the timeline's hooks.
type writeEvent struct {
	component  string
	w          store.Write
	start, end time.Time // end is zero for an asynchronous publish
}

// writeRecorder records the writes of the stores it wraps while on.
type writeRecorder struct {
	mu      sync.Mutex
	open    map[string][]time.Time // key of a write in flight → its starts
	writes  []writeEvent
	deleted chan string // keys of brood_agents deletes (a lease released)
}

func newWriteRecorder() *writeRecorder {
	return &writeRecorder{open: map[string][]time.Time{}, deleted: make(chan string, 1024)}
}

func writeKey(component string, w store.Write) string {
	return fmt.Sprintf("%s|%s|%s|%s|%s|%d|%s", component, w.Op, w.Bucket, w.Key, w.Stream, w.Seq, w.Subject)
}

func (r *writeRecorder) wrap(component string) func(*store.Store) *store.Store {
	return func(s *store.Store) *store.Store {
		return s.WithFaults(store.Faults{
			Before: func(_ context.Context, w store.Write) error {
				if strings.HasSuffix(w.Bucket, "_hosts") {
					return nil // heartbeats: not the run's
				}
				now := time.Now()
				r.mu.Lock()
				defer r.mu.Unlock()
				if w.Async {
					r.writes = append(r.writes, writeEvent{component: component, w: w, start: now})
					return nil
				}
				k := writeKey(component, w)
				r.open[k] = append(r.open[k], now)
				return nil
			},
			After: func(_ context.Context, w store.Write, err error) error {
				if strings.HasSuffix(w.Bucket, "_hosts") {
					return err
				}
				now := time.Now()
				r.mu.Lock()
				k := writeKey(component, w)
				if starts := r.open[k]; len(starts) > 0 {
					r.writes = append(r.writes, writeEvent{component: component, w: w, start: starts[0], end: now})
					if len(starts) == 1 {
						delete(r.open, k)
					} else {
						r.open[k] = starts[1:]
					}
				}
				r.mu.Unlock()
				if w.Op == store.OpKVDelete && err == nil {
					select {
					case r.deleted <- w.Key:
					default:
					}
				}
				return err
			},
		})
	}
}

// take returns the writes recorded since the last take.
func (r *writeRecorder) take() []writeEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.writes
	r.writes = nil
	return w
}

// describe names a write with the run's ids replaced by placeholders, and
// what it holds where that tells writes apart (a log record's event types,
// a run record's state).
func describe(e writeEvent, ids map[string]string) string {
	w := e.w
	name := w.Subject
	if w.Bucket != "" {
		name = strings.TrimPrefix(w.Bucket, "brood_") + ":" + w.Key
	}
	if w.Op == store.OpMsgDelete {
		name = w.Stream + " message"
	}
	for id, ph := range ids {
		name = strings.ReplaceAll(name, id, ph)
	}
	name = otherID.ReplaceAllString(name, otherRun)
	name = strings.TrimPrefix(name, "brood.v1.")
	detail := ""
	switch {
	case strings.HasPrefix(name, "log."):
		var rec protocol.LogRecord
		if err := protocol.Unmarshal(protocol.Msgpack, w.Msg.Data, &rec); err == nil {
			var types []string
			for _, ev := range rec.Events {
				types = append(types, ev.Type)
			}
			detail = " [" + strings.Join(types, " ") + "]"
		}
	case strings.HasPrefix(name, "runs:") && w.Value != nil:
		var rec protocol.RunRecord
		if err := protocol.Unmarshal(protocol.Msgpack, w.Value, &rec); err == nil {
			detail = " [" + string(rec.State)
			if rec.HostID != "" && rec.State == protocol.RunRunning {
				detail += ", claimed"
			}
			detail += "]"
		}
	case strings.HasPrefix(name, "events."):
		// the kind is the subject's last token
	}
	async := ""
	if e.w.Async {
		async = " (async)"
	}
	return fmt.Sprintf("%s %s %s%s%s", e.component, w.Op, name, detail, async)
}

// otherID matches an id (a ULID) left in a write's name once the run's own
// ids were replaced: another run's (the coordinator's sweep rewrites settled
// runs' specs with their TTL, off every run's path).
var otherID = regexp.MustCompile(`[0-9A-HJKMNP-TV-Z]{26}`)

const otherRun = "<other run>"

// runWrites counts a run's own writes (not other runs' in its window):
// acknowledged and asynchronous, and the acknowledged ones in series: the
// number of groups left once writes whose intervals overlap are merged (two
// writes in flight at once count as one step of the path).
func runWrites(writes []writeEvent, names []string) (acked, async, series int) {
	var iv [][2]time.Time
	for i, e := range writes {
		if strings.Contains(names[i], otherRun) {
			continue
		}
		if e.w.Async || e.end.IsZero() {
			async++
			continue
		}
		acked++
		iv = append(iv, [2]time.Time{e.start, e.end})
	}
	sort.Slice(iv, func(i, j int) bool { return iv[i][0].Before(iv[j][0]) })
	var end time.Time
	for _, x := range iv {
		if series == 0 || x[0].After(end) {
			series++
			end = x[1]
		} else if x[1].After(end) {
			end = x[1]
		}
	}
	return acked, async, series
}

// timelineRow is one write or span of the run's timeline, aggregated over runs.
type timelineRow struct {
	name         string
	starts, ends []time.Duration // offsets from the client's start
	n            int             // occurrences
}

func median(d []time.Duration) time.Duration { return percentile(d, 0.5) }

var timelineFleet = flag.Int("timeline.fleet", 1, "coordinators and spawn workers of BenchmarkOneShotTimeline's stack")

// BenchmarkOneShotTimeline: sequential one-shot runs of `say ok`, each
// waited out to its lease release (the last write of a run), with every
// store write of the coordinator and the worker and every span recorded;
// prints the median timeline of a run: each write and span with its start
// and end offset from the client's runs.start, and the writes per run. The
// hooks and the span recorder cost time of their own: this is where the
// time goes, not a figure (BenchmarkOneShotLatency is).
func BenchmarkOneShotTimeline(b *testing.B) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	b.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	rec := newWriteRecorder()
	s := newBareStack(b)
	addServices(b, s, *timelineFleet, *timelineFleet, withStores(rec.wrap("coordinator"), rec.wrap("worker")))
	root := s.Root()
	ctx := context.Background()
	runOne := func() (id string, t0, started, resulted time.Time) {
		t0 = time.Now()
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
		if err != nil {
			b.Fatal(err)
		}
		started = time.Now()
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			b.Fatalf("result %+v, %v", res, err)
		}
		resulted = time.Now()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case k := <-rec.deleted:
				if strings.HasSuffix(k, run.ChildID) {
					return run.ChildID, t0, started, resulted
				}
			case <-deadline:
				b.Fatalf("lease of %s not released within 10s", run.ChildID)
			}
		}
	}
	for i := 0; i < 20; i++ { // warm up
		runOne()
	}
	rec.take()
	spans.Reset()

	rows := map[string]*timelineRow{}
	var startReplies, results []time.Duration
	// counts, as durations for median()
	var writesPerRun, ackedPerRun, asyncPerRun, seriesPerRun []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		child, t0, started, resulted := runOne()
		startReplies = append(startReplies, started.Sub(t0))
		results = append(results, resulted.Sub(t0))
		ids := map[string]string{child: "<child>", root.Ref().SessionID: "<root>"}
		seen := map[string]int{}
		writes := rec.take()
		names := make([]string, len(writes))
		for i, e := range writes {
			names[i] = describe(e, ids)
		}
		acked, async, series := runWrites(writes, names)
		writesPerRun = append(writesPerRun, time.Duration(acked+async))
		ackedPerRun = append(ackedPerRun, time.Duration(acked))
		asyncPerRun = append(asyncPerRun, time.Duration(async))
		seriesPerRun = append(seriesPerRun, time.Duration(series))
		for i, e := range writes {
			name := names[i]
			seen[name]++
			if seen[name] > 1 && !strings.Contains(name, otherRun) {
				name = fmt.Sprintf("%s #%d", name, seen[name])
			}
			row := rows[name]
			if row == nil {
				row = &timelineRow{name: name}
				rows[name] = row
			}
			row.n++
			row.starts = append(row.starts, e.start.Sub(t0))
			if !e.end.IsZero() {
				row.ends = append(row.ends, e.end.Sub(t0))
			}
		}
		for _, sp := range spans.Ended() {
			if sp.StartTime().Before(t0) {
				continue
			}
			name := "span " + sp.Name() + " (" + sp.SpanKind().String() + ")"
			row := rows[name]
			if row == nil {
				row = &timelineRow{name: name}
				rows[name] = row
			}
			row.n++
			row.starts = append(row.starts, sp.StartTime().Sub(t0))
			row.ends = append(row.ends, sp.EndTime().Sub(t0))
		}
		spans.Reset()
	}
	b.StopTimer()
	list := make([]*timelineRow, 0, len(rows))
	for _, r := range rows {
		list = append(list, r)
	}
	sort.Slice(list, func(i, j int) bool { return median(list[i].starts) < median(list[j].starts) })
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "one-shot timeline over %d sequential runs (medians, ms from the client's runs.start; hooks and spans on):\n", b.N)
	fmt.Fprintf(tw, "what\tper run\tstart\tend\tduration\n")
	for _, r := range list {
		end, dur := "", ""
		if len(r.ends) > 0 {
			end = fmt.Sprintf("%.3f", ms(median(r.ends)))
			durs := make([]time.Duration, 0, len(r.ends))
			for i := range r.ends {
				durs = append(durs, r.ends[i]-r.starts[i])
			}
			dur = fmt.Sprintf("%.3f", ms(median(durs)))
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.3f\t%s\t%s\n", r.name, float64(r.n)/float64(b.N), ms(median(r.starts)), end, dur)
	}
	fmt.Fprintf(tw, "client: runs.start answered\t\t\t%.3f\t\n", ms(median(startReplies)))
	fmt.Fprintf(tw, "client: result received\t\t\t%.3f\t\n", ms(median(results)))
	tw.Flush()
	fmt.Printf("writes per run (coordinator + worker, the run's own, medians): %d: %d acknowledged (%d in series: overlapping writes count once), %d asynchronous\n",
		int(median(writesPerRun)), int(median(ackedPerRun)), int(median(seriesPerRun)), int(median(asyncPerRun)))
	b.ReportMetric(float64(median(writesPerRun)), "writes/run")
	b.ReportMetric(float64(median(ackedPerRun)), "acked-writes/run")
	b.ReportMetric(float64(median(seriesPerRun)), "acked-in-series/run")
	b.ReportMetric(ms(median(results)), "result-p50-ms")
}
