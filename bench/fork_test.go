package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// forkParent writes turns completed turns (testutil.TurnHistory: 6 events
// each) into a new root's log, as a root that talks to a model has, and
// returns the root.
func forkParent(b *testing.B, s *stack.Stack, turns int) *client.Root {
	b.Helper()
	root := s.Root()
	evs := testutil.TurnHistory(b, turns, false)
	w := s.Store.NewLogWriter(protocol.ScopeRoot, root.SessionID, 0, 0)
	for len(evs) > 0 { // records of 60 events
		n := min(60, len(evs))
		if _, err := w.Append(context.Background(), evs[:n]...); err != nil {
			b.Fatal(err)
		}
		evs = evs[n:]
	}
	return root
}

// BenchmarkForkStart: a one-shot fork run of `say ok`, sequential, from a
// root whose log holds 10 or 500 completed turns (60 or 3,000 events):
// start to result, which includes the prepare (the parent's completed
// prefix) and the child's seed copied into its log.
func BenchmarkForkStart(b *testing.B) {
	for _, turns := range []int{10, 500} {
		b.Run(fmt.Sprintf("turns=%d", turns), func(b *testing.B) {
			s := newBareStack(b)
			addServices(b, s, 1, 0, stackMods{})
			labelComponent("worker")
			s.AddForkWorker(func(*worker.InProcessConfig) {})
			labelComponent("client")
			root := forkParent(b, s, turns)
			ctx := context.Background()
			once := func() time.Duration {
				t := time.Now()
				run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "fork", Prompt: protocol.Text("say ok")})
				if err != nil {
					b.Fatal(err)
				}
				res, err := run.Result(ctx)
				if err != nil || res.StopReason != protocol.StopCompleted {
					b.Fatalf("result %+v, %v", res, err)
				}
				return time.Since(t)
			}
			for i := 0; i < 5; i++ { // warm up caches and connections
				once()
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				lat = append(lat, once())
			}
			b.StopTimer()
			p50, p99 := percentile(lat, 0.5), percentile(lat, 0.99)
			b.ReportMetric(ms(p50), "p50-ms")
			b.ReportMetric(ms(p99), "p99-ms")
			fmt.Printf("fork start, %d parent turns: p50 %.3f ms, p99 %.3f ms\n", turns, ms(p50), ms(p99))
		})
	}
}
