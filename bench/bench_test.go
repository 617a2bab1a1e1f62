// Package bench measures Brood against baselines taken in the same run on the
// same embedded server (docs/design.md §13): shared machines are noisy, so every
// figure is reported next to its baseline and as a ratio. Run with
// `make bench`; compare runs with benchstat.
package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// baselineSamples is how many request-replies and publishes the floor is measured with.
const baselineSamples = 2000

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// requestReplyP50 measures a core NATS request-reply to an echo responder.
func requestReplyP50(b *testing.B, nc *nats.Conn) time.Duration {
	b.Helper()
	sub, err := nc.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	payload := make([]byte, 200)
	lat := make([]time.Duration, 0, baselineSamples)
	for i := 0; i < baselineSamples; i++ {
		t := time.Now()
		if _, err := nc.Request("bench.echo", payload, 5*time.Second); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	return percentile(lat, 0.5)
}

// fencedPublishP50 measures one publish of a small record with an expected
// last subject sequence, as a session log append is made.
func fencedPublishP50(b *testing.B, js jetstream.JetStream) time.Duration {
	b.Helper()
	ctx := context.Background()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.log.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 300)
	lat := make([]time.Duration, 0, baselineSamples)
	last := uint64(0)
	for i := 0; i < baselineSamples; i++ {
		t := time.Now()
		ack, err := js.Publish(ctx, "bench.log.s", payload, jetstream.WithExpectLastSequencePerSubject(last))
		if err != nil {
			b.Fatal(err)
		}
		last = ack.Sequence
		lat = append(lat, time.Since(t))
	}
	return percentile(lat, 0.5)
}

// asyncPublishRate measures JetStream async publishes per second.
func asyncPublishRate(b *testing.B, js jetstream.JetStream) float64 {
	b.Helper()
	ctx := context.Background()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BENCHA", Subjects: []string{"bench.async.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	const n = 20000
	payload := make([]byte, 300)
	start := time.Now()
	for i := 0; i < n; i++ {
		// A loaded machine acknowledges late: wait for room rather than fail.
		if _, err := js.PublishAsync("bench.async.s", payload, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		b.Fatal("async publishes not acknowledged")
	}
	return n / time.Since(start).Seconds()
}

// newStack starts a server, a coordinator and a spawn worker, each under its
// pprof label (profile_test.go), and opens a root.
func newStack(b *testing.B) (*stack.Stack, *client.Root) {
	s := newLabelledStack(b, stackMods{})
	return s, s.Root()
}

// BenchmarkOneShotLatency: one-shot delegation of `say ok`, sequential, from a
// root; p50/p99 next to the floor of the design (2 request-replies + 5
// single-record fenced publishes) measured on the same server in the same
// run. Budget: ratio ≤ 1.5.
func BenchmarkOneShotLatency(b *testing.B) {
	s, root := newStack(b)
	js, _ := jetstream.New(s.NC)
	rr := requestReplyP50(b, s.NC)
	pub := fencedPublishP50(b, js)
	floor := 2*rr + 5*pub
	ctx := context.Background()
	for i := 0; i < 50; i++ { // warm up caches and connections
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok"), Options: protocol.StartOptions{}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := run.Result(ctx); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok"), Options: protocol.StartOptions{}})
		if err != nil {
			b.Fatal(err)
		}
		res, err := run.Result(ctx)
		if err != nil || res.StopReason != protocol.StopCompleted {
			b.Fatalf("result %+v, %v", res, err)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	p50, p99 := percentile(lat, 0.5), percentile(lat, 0.99)
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(ms(rr), "rr-p50-ms")
	b.ReportMetric(ms(pub), "pub-p50-ms")
	b.ReportMetric(ms(floor), "floor-p50-ms")
	b.ReportMetric(float64(p50)/float64(floor), "ratio-p50/floor")
	fmt.Printf("one-shot latency: p50 %.3f ms, p99 %.3f ms; floor (2 RR %.3f ms + 5 fenced publishes %.3f ms) %.3f ms; ratio %.2f (budget ≤ 1.5)\n",
		ms(p50), ms(p99), ms(rr), ms(pub), ms(floor), float64(p50)/float64(floor))
}

// BenchmarkOneShotThroughput: 64 concurrent parents delegating `say ok` in a
// loop; runs/s next to the async publish rate of the same server. Budget:
// runs/s ≥ 1/12 of the publish rate. Also prints the CPU per run over the
// same loop (cpu_test.go): the whole process's, and Brood's own
// (coordinator + worker) against the embedded server's (issue 31, item 5:
// acceptance ≤ 2).
func BenchmarkOneShotThroughput(b *testing.B) {
	const parents = 64
	s, _ := newStack(b)
	js, _ := jetstream.New(s.NC)
	rate := asyncPublishRate(b, js)
	roots := make([]*client.Root, parents)
	for i := range roots {
		roots[i] = s.Root()
	}
	ctx := context.Background()
	var next atomic.Int64
	cpu := startCPUWindow(b)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for p := 0; p < parents; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: roots[p].Ref(), Provider: "spawn", Prompt: protocol.Text("say ok"), Options: protocol.StartOptions{}})
				if err != nil {
					b.Error(err)
					return
				}
				if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
					b.Errorf("result %+v, %v", res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpuUsed := cpu.stop(b)
	runsPerSec := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(runsPerSec, "runs/s")
	b.ReportMetric(rate, "async-pub/s")
	b.ReportMetric(runsPerSec/rate*12, "ratio-x12")
	fmt.Printf("one-shot throughput: %.0f runs/s with %d parents; async publish rate %.0f msg/s; runs/s ÷ (rate/12) = %.2f (budget ≥ 1)\n",
		runsPerSec, parents, rate, runsPerSec/rate*12)
	reportCPU(b, "one-shot CPU", cpuUsed, b.N)
}
