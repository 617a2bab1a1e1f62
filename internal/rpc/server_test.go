package rpc_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/internal/gopool"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type echo struct {
	Text string `msgpack:"text" json:"text"`
}

func serve(t *testing.T, inFlightMax int, h rpc.Handler) (*nats.Conn, *rpc.Server, *rpc.Service) {
	t.Helper()
	srvNATS := testutil.Server(t)
	nc := testutil.Connect(t, srvNATS.ClientURL())
	snc := testutil.Connect(t, srvNATS.ClientURL())
	srv := rpc.NewServer(snc, inFlightMax, slog.Default())
	svc, err := srv.AddService(rpc.ServiceConfig{Name: "test-svc", Version: "1.0.0", Description: "test", QueueGroup: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.AddEndpoint("work", "test.work", h); err != nil {
		t.Fatal(err)
	}
	if err := snc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(context.Background()) })
	return nc, srv, svc
}

// TestStopWaitsForHandlersInFlight: Stop returns only after every handler
// returned; a handler still running when the grace ends has its context
// cancelled, and its caller is told UNAVAILABLE (retry elsewhere).
func TestStopWaitsForHandlersInFlight(t *testing.T) {
	tests := []struct {
		name     string
		grace    time.Duration
		release  bool // the handler finishes by itself within the grace
		wantCode protocol.Code
	}{
		{"finishes within the grace", 30 * time.Second, true, ""},
		{"cancelled when the grace ends", 100 * time.Millisecond, false, protocol.CodeUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			var returned atomic.Bool
			nc, srv, _ := serve(t, 4, func(ctx context.Context, req rpc.Request) (any, error) {
				close(started)
				defer returned.Store(true)
				select {
				case <-release:
					return echo{"done"}, nil
				case <-ctx.Done():
					return nil, protocol.Errorf(protocol.CodeCancelled, "cancelled")
				}
			})
			callErr := make(chan error, 1)
			go func() { callErr <- rpc.Call(context.Background(), nc, "test.work", echo{"x"}, nil) }()
			select {
			case <-started:
			case err := <-callErr:
				t.Fatalf("the request did not reach its handler: %v", err)
			}
			stopped := make(chan struct{})
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), tc.grace)
				defer cancel()
				srv.Stop(ctx)
				close(stopped)
			}()
			if tc.release {
				select {
				case <-stopped:
					t.Fatal("Stop returned while a handler was in flight")
				case <-time.After(200 * time.Millisecond):
				}
				close(release)
			}
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("Stop did not return")
			}
			if !returned.Load() {
				t.Fatal("Stop returned before the handler did")
			}
			if err := <-callErr; protocol.CodeOf(err) != tc.wantCode {
				t.Fatalf("caller got %v, want code %q", err, tc.wantCode)
			}
		})
	}
}

// TestEndpointRequestsRunConcurrently: requests to one endpoint do not wait
// for each other (each handler here waits for all of them to arrive), and at
// most inFlightMax run at once.
func TestEndpointRequestsRunConcurrently(t *testing.T) {
	const n, limit = 8, 8
	var arrived sync.WaitGroup
	arrived.Add(n)
	var running, peak atomic.Int32
	nc, _, _ := serve(t, limit, func(ctx context.Context, req rpc.Request) (any, error) {
		cur := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
		}
		arrived.Done()
		arrived.Wait()
		return echo{"ok"}, nil
	})
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs <- rpc.Call(ctx, nc, "test.work", echo{"x"}, nil)
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if peak.Load() != n {
		t.Fatalf("peak concurrency %d, want %d", peak.Load(), n)
	}
}

// TestMicroStatsAreTruthful: `nats micro stats` (STATS on $SRV) counts every
// request, its error replies, and the time handlers took, although handlers
// answer from their own goroutines; PING and INFO answer as nats.go micro's.
func TestMicroStatsAreTruthful(t *testing.T) {
	const took = 30 * time.Millisecond
	nc, _, svc := serve(t, 16, func(ctx context.Context, req rpc.Request) (any, error) {
		var r echo
		if err := req.Decode(&r); err != nil {
			return nil, err
		}
		time.Sleep(took)
		if r.Text == "bad" {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "bad request")
		}
		return r, nil
	})
	var wg sync.WaitGroup
	for _, text := range []string{"a", "b", "bad", "c", "bad"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rpc.Call(context.Background(), nc, "test.work", echo{text}, nil)
		}()
	}
	wg.Wait()
	ask := func(subject string, v any) {
		t.Helper()
		m, err := nc.Request(subject, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
		if err := json.Unmarshal(m.Data, v); err != nil {
			t.Fatalf("%s: %v", subject, err)
		}
	}
	// A request's stats are counted once its handler returned, which can
	// be just after its caller heard the reply: read until all five are.
	var stats micro.Stats
	testutil.Eventually(t, 10*time.Second, func() bool {
		stats = micro.Stats{}
		ask("$SRV.STATS.test-svc."+svc.ID(), &stats)
		if stats.Type != micro.StatsResponseType || len(stats.Endpoints) != 1 {
			t.Fatalf("stats = %+v", stats)
		}
		return stats.Endpoints[0].NumRequests >= 5
	}, "all five requests counted in the stats")
	e := stats.Endpoints[0]
	if e.Name != "work" || e.Subject != "test.work" || e.QueueGroup != "q" || e.NumRequests != 5 || e.NumErrors != 2 ||
		!strings.HasPrefix(e.LastError, "1001:INVALID_ARGUMENT: ") {
		t.Fatalf("endpoint stats = %+v", e)
	}
	if e.ProcessingTime < 5*took || e.AverageProcessingTime < took {
		t.Fatalf("processing time %s (average %s), want at least %s (average %s)", e.ProcessingTime, e.AverageProcessingTime, 5*took, took)
	}
	var info micro.Info
	ask("$SRV.INFO.test-svc", &info)
	if info.Type != micro.InfoResponseType || info.ID != svc.ID() || info.Version != "1.0.0" || len(info.Endpoints) != 1 || info.Endpoints[0].Subject != "test.work" {
		t.Fatalf("info = %+v", info)
	}
	var ping micro.Ping
	ask("$SRV.PING", &ping)
	if ping.Type != micro.PingResponseType || ping.Name != "test-svc" || ping.ID != svc.ID() {
		t.Fatalf("ping = %+v", ping)
	}
}

// TestAReplyOverMaxPayloadIsLimitExceeded: a reply larger than the server's
// max_payload is answered LIMIT_EXCEEDED with the sizes and a hint, in
// either encoding, instead of no reply at all (issue 17: runs.await in JSON
// of a large result got nothing); a reply that fits is sent.
func TestAReplyOverMaxPayloadIsLimitExceeded(t *testing.T) {
	var size atomic.Int64
	nc, _, _ := serve(t, 4, func(ctx context.Context, req rpc.Request) (any, error) {
		return echo{strings.Repeat("x", int(size.Load()))}, nil
	})
	max := nc.MaxPayload()
	for _, tc := range []struct {
		name    string
		size    int64
		json    bool
		wantErr bool
	}{
		{"fits, MessagePack", max / 2, false, false},
		{"fits, JSON", max / 2, true, false},
		{"too large, MessagePack", max, false, true},
		{"too large, JSON", max - 8, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size.Store(tc.size)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			var got echo
			if tc.json {
				var m *nats.Msg
				if m, err = nc.RequestWithContext(ctx, "test.work", []byte(`{"text":"x"}`)); err == nil {
					if perr := rpc.ErrorOf(m); perr != nil {
						err = perr
					} else {
						err = json.Unmarshal(m.Data, &got)
					}
				}
			} else {
				err = rpc.Call(ctx, nc, "test.work", echo{"x"}, &got)
			}
			if !tc.wantErr {
				if err != nil || int64(len(got.Text)) != tc.size {
					t.Fatalf("a reply of %d bytes (max_payload %d): %d bytes, %v", tc.size, max, len(got.Text), err)
				}
				return
			}
			if protocol.CodeOf(err) != protocol.CodeLimitExceeded || !strings.Contains(err.Error(), "max_payload") {
				t.Fatalf("a reply over max_payload %d: %v, want LIMIT_EXCEEDED naming max_payload", max, err)
			}
		})
	}
}

// goroutineID is the calling goroutine's id, from the first line of its
// stack ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// goroutines records the goroutines that ran something, by id.
type goroutines struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (g *goroutines) add(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen == nil {
		g.seen = map[string]bool{}
	}
	g.seen[id] = true
}

func (g *goroutines) distinct() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.seen)
}

// callInSeries makes n requests to test.work, one after another.
func callInSeries(t *testing.T, nc *nats.Conn, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := rpc.Call(context.Background(), nc, "test.work", echo{"x"}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHandlerGoroutinesAreReused: sequential requests run on the goroutine
// the first one started (its stack already grown), not on a fresh one
// each; Stop ends the idle goroutine (goleak, TestMain) and waits for it.
func TestHandlerGoroutinesAreReused(t *testing.T) {
	var seen goroutines
	nc, srv, _ := serve(t, 4, func(ctx context.Context, req rpc.Request) (any, error) {
		seen.add(goroutineID())
		return echo{"ok"}, nil
	})
	const n = 20
	callInSeries(t, nc, n)
	// A reply is sent before its goroutine goes back to wait, so the next
	// request can come first and start another goroutine; never one each.
	if distinct := seen.distinct(); distinct > n/2 {
		t.Fatalf("%d sequential requests ran on %d goroutines; want them reused", n, distinct)
	}
	stopped := make(chan struct{})
	go func() { srv.Stop(context.Background()); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return with an idle handler goroutine")
	}
}

// TestAHandlersHelpersReuseTheServersGoroutines: the goroutines a handler
// starts with gopool.Go (the coordinator's parallel writes, a run's spec
// write) run on the server's reused goroutines, not on a fresh one each
// (whose stack grows again: issue 12's profile), and Stop waits for them.
func TestAHandlersHelpersReuseTheServersGoroutines(t *testing.T) {
	var seen goroutines
	var block atomic.Bool
	release := make(chan struct{})
	helperEnded := make(chan struct{})
	nc, srv, _ := serve(t, 4, func(ctx context.Context, req rpc.Request) (any, error) {
		if block.Load() { // a helper the handler does not wait for
			gopool.Go(ctx, func() { <-release; close(helperEnded) })
			return echo{"ok"}, nil
		}
		id := make(chan string)
		gopool.Go(ctx, func() { id <- goroutineID() })
		seen.add(<-id)
		return echo{"ok"}, nil
	})
	const n = 20
	callInSeries(t, nc, n)
	if distinct := seen.distinct(); distinct > n/2 {
		t.Fatalf("the helpers of %d sequential requests ran on %d goroutines; want them reused", n, distinct)
	}
	block.Store(true)
	if err := rpc.Call(context.Background(), nc, "test.work", echo{"x"}, nil); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { srv.Stop(context.Background()); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a handler's helper was still running")
	case <-time.After(200 * time.Millisecond): // Stop waits: it returns only after the helper
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return once the helper ended")
	}
	select {
	case <-helperEnded:
	default:
		t.Fatal("Stop returned before the helper ended")
	}
}
