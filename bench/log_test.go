package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// turnEvents is one completed turn as a host logs it: its opening, a user
// message, one step with an answer, its end.
func turnEvents(b *testing.B, turn int64, question, answer string) []protocol.SessionEvent {
	b.Helper()
	var evs []protocol.SessionEvent
	for _, spec := range []struct {
		typ  string
		data any
	}{
		{protocol.EvTurnStart, protocol.TurnData{Turn: turn}},
		{protocol.EvUserMessage, protocol.UserMessageData{ID: fmt.Sprintf("u%d", turn), Turn: turn, Content: protocol.Text(question)}},
		{protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1}},
		{protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 1, Message: protocol.AssistantMessage{Content: protocol.Text(answer)}}},
		{protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 1}},
		{protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}},
	} {
		ev, err := protocol.NewEvent(spec.typ, store.NowMs(), spec.data)
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// appendTurns appends completed turns to a session's log through w, one
// record each, until it holds at least events events, and returns how many
// it holds.
func appendTurns(b *testing.B, w *store.LogWriter, turn int64, events int) int {
	b.Helper()
	for w.NextSeq() < int64(events) {
		turn++
		if _, err := w.Append(context.Background(), turnEvents(b, turn, "a question of some length, as users ask them", "an answer of some length, as models give them")...); err != nil {
			b.Fatal(err)
		}
	}
	return int(w.NextSeq())
}

// orderedReadAll reads every record of subject, a log subject of scope,
// with a bare ordered consumer, decoding each (the baseline of a whole-log
// read).
func orderedReadAll(b *testing.B, s *stack.Stack, scope, subject string) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	str, err := s.Store.LogStream(ctx, scope)
	if err != nil {
		b.Fatal(err)
	}
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		b.Fatal(err)
	}
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			var rec protocol.LogRecord
			if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &rec); err != nil {
				b.Fatal(err)
			}
			meta, err := m.Metadata()
			if err != nil {
				b.Fatal(err)
			}
			if meta.NumPending == 0 {
				return time.Since(start)
			}
		}
		if batch.Error() != nil {
			b.Fatal(batch.Error())
		}
	}
}

// BenchmarkReadLog10k: reading a 10,000-event log (a fork seed or a cold
// resume) next to a bare ordered consumer reading the same records in the
// same run. Budget (docs/design.md §13, cold resume): ratio ≤ 2.
func BenchmarkReadLog10k(b *testing.B) {
	s := stack.New(b)
	const events = 10000
	stored := appendTurns(b, s.Store.NewLogWriter(protocol.ScopeRoot, "LONG", 0, 0), 0, events)
	// Another session's records interleave in the stream, as in production.
	appendTurns(b, s.Store.NewLogWriter(protocol.ScopeRoot, "OTHER", 0, 0), 0, 2000)
	ctx := context.Background()
	var ours, base time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		log, err := s.Store.ReadLog(ctx, protocol.ScopeRoot, "LONG")
		if err != nil || len(log.Events) != stored {
			b.Fatalf("read %d events, %v", len(log.Events), err)
		}
		ours += time.Since(t)
		base += orderedReadAll(b, s, protocol.ScopeRoot, s.Store.Subj.Log(protocol.ScopeRoot, "LONG"))
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return ms(d) / float64(b.N) }
	b.ReportMetric(per(ours), "readlog-ms")
	b.ReportMetric(per(base), "ordered-consumer-ms")
	b.ReportMetric(float64(ours)/float64(base), "ratio")
	fmt.Printf("10,000-event log (%d records): ReadLog %.2f ms, bare ordered consumer %.2f ms; ratio %.2f (budget ≤ 2)\n",
		stored/6, per(ours), per(base), float64(ours)/float64(base))
}
