package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// longLog writes a session of n events in records of five (a step each) and
// returns the number of records.
func longLog(b *testing.B, s *stack.Stack, id string, n int) int {
	b.Helper()
	w := s.Store.NewLogWriter(protocol.ScopeRoot, id, 0, 0)
	ctx := context.Background()
	records := 0
	for turn := int64(1); w.NextSeq() < int64(n); turn++ {
		var evs []protocol.SessionEvent
		for _, spec := range []struct {
			typ  string
			data any
		}{
			{protocol.EvTurnStart, protocol.TurnData{Turn: turn}},
			{protocol.EvUserMessage, protocol.UserMessageData{ID: "u", Turn: turn, Content: protocol.Text("a question of some length, as users ask them")}},
			{protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1}},
			{protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 1, Message: protocol.AssistantMessage{Content: protocol.Text("an answer of some length, as models give them")}}},
			{protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}},
		} {
			ev, err := protocol.NewEvent(spec.typ, 1, spec.data)
			if err != nil {
				b.Fatal(err)
			}
			evs = append(evs, ev)
		}
		if _, err := w.Append(ctx, evs...); err != nil {
			b.Fatal(err)
		}
		records++
	}
	return records
}

// orderedRead reads a subject with a bare ordered consumer (the baseline).
func orderedRead(b *testing.B, s *stack.Stack, subject string, records int) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	cons, err := s.Store.Log.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		b.Fatal(err)
	}
	got := 0
	for got < records {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			var rec protocol.LogRecord
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &rec); err != nil {
				b.Fatal(err)
			}
			got++
		}
	}
	return time.Since(start)
}

// BenchmarkReadLog10k: reading a 10,000-event log (a fork seed or a cold
// resume) next to a bare ordered consumer reading the same records in the
// same run. Budget (DESIGN.md §13, cold resume): ratio ≤ 2.
func BenchmarkReadLog10k(b *testing.B) {
	s := stack.New(b)
	const events = 10000
	records := longLog(b, s, "LONG", events)
	// Another session's records interleave in the stream, as in production.
	longLog(b, s, "OTHER", 2000)
	ctx := context.Background()
	var ours, base time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		log, err := s.Store.ReadLog(ctx, protocol.ScopeRoot, "LONG")
		if err != nil || len(log.Events) != events {
			b.Fatalf("read %d events, %v", len(log.Events), err)
		}
		ours += time.Since(t)
		base += orderedRead(b, s, s.Store.Subj.Log(protocol.ScopeRoot, "LONG"), records)
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return ms(d) / float64(b.N) }
	b.ReportMetric(per(ours), "readlog-ms")
	b.ReportMetric(per(base), "ordered-consumer-ms")
	b.ReportMetric(float64(ours)/float64(base), "ratio")
	fmt.Printf("10,000-event log (%d records): ReadLog %.2f ms, bare ordered consumer %.2f ms; ratio %.2f (budget ≤ 2)\n",
		records, per(ours), per(base), float64(ours)/float64(base))
}
