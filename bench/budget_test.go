package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// BenchmarkOneShotBudget (issue 32, item 2): the one-shot `say ok` run with
// a budget of its own (as `brood run --budget` starts it: its ledger
// created at admission, its model request reserved and settled) against
// the same run without one, alternating in the same stack so both see the
// same load. Acceptance: the budgeted p50 within 10 % of the plain one.
func BenchmarkOneShotBudget(b *testing.B) {
	s, root := newStack(b)
	ctx := context.Background()
	budget := &protocol.Budget{Tokens: 1_000_000, ModelRequests: 1_000, ToolCalls: 1_000, Children: 100}
	one := func(opts protocol.StartOptions) time.Duration {
		t := time.Now()
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok"), Options: opts})
		if err != nil {
			b.Fatal(err)
		}
		res, err := run.Result(ctx)
		if err != nil || res.StopReason != protocol.StopCompleted {
			b.Fatalf("result %+v, %v", res, err)
		}
		return time.Since(t)
	}
	for i := 0; i < 50; i++ { // warm up caches and connections
		one(protocol.StartOptions{})
		one(protocol.StartOptions{Budget: budget})
	}
	plain := make([]time.Duration, 0, b.N)
	budgeted := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// The order alternates too (P B B P P B …): each kind follows
		// each kind as often, so what a run leaves to do after its result
		// (its lease's release, a budgeted run's last settlement) weighs
		// on both alike.
		if i%2 == 0 {
			plain = append(plain, one(protocol.StartOptions{}))
			budgeted = append(budgeted, one(protocol.StartOptions{Budget: budget}))
		} else {
			budgeted = append(budgeted, one(protocol.StartOptions{Budget: budget}))
			plain = append(plain, one(protocol.StartOptions{}))
		}
	}
	b.StopTimer()
	p, q := percentile(plain, 0.5), percentile(budgeted, 0.5)
	b.ReportMetric(ms(p), "plain-p50-ms")
	b.ReportMetric(ms(q), "budget-p50-ms")
	b.ReportMetric(float64(q)/float64(p), "ratio-budget/plain")
	fmt.Printf("one-shot with a budget: p50 %.3f ms (p99 %.3f ms); without, same run: p50 %.3f ms (p99 %.3f ms); ratio %.2f (budget ≤ 1.10)\n",
		ms(q), ms(percentile(budgeted, 0.99)), ms(p), ms(percentile(plain, 0.99)), float64(q)/float64(p))
}
