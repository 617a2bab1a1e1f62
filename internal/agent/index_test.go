package agent

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// logBuilder builds a session log, event by event, with seqs from 0.
type logBuilder struct {
	t   *testing.T
	evs []protocol.SessionEvent
}

func (b *logBuilder) add(typ string, data any) *logBuilder {
	b.t.Helper()
	ev, err := protocol.NewEvent(typ, 1795979443122, data)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.raw(typ, ev.Data)
}

// raw adds an event with data as its payload bytes (garbage included).
func (b *logBuilder) raw(typ string, data []byte) *logBuilder {
	b.evs = append(b.evs, protocol.SessionEvent{Seq: int64(len(b.evs)), Type: typ, Time: 1795979443122, Data: data})
	return b
}

func (b *logBuilder) turn(n int64) *logBuilder {
	return b.add(protocol.EvTurnStart, protocol.TurnData{Turn: n})
}
func (b *logBuilder) end(n int64) *logBuilder {
	return b.add(protocol.EvTurnEnd, protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
}
func (b *logBuilder) step(n int64) *logBuilder {
	return b.add(protocol.EvStepStart, protocol.StepData{Turn: 1, Step: n})
}
func (b *logBuilder) stepEnd(n int64) *logBuilder {
	return b.add(protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: n})
}
func (b *logBuilder) user(text string) *logBuilder {
	return b.add(protocol.EvUserMessage, protocol.UserMessageData{ID: "m-" + text, Turn: 1, Content: protocol.Text(text)})
}

// say adds an assistant message; each call is "id" or "id:arguments".
func (b *logBuilder) say(text string, calls ...string) *logBuilder {
	msg := protocol.AssistantMessage{Content: protocol.Text(text)}
	for _, c := range calls {
		id, args, _ := strings.Cut(c, ":")
		msg.ToolCalls = append(msg.ToolCalls, protocol.ToolCall{ID: id, Name: "list_dir", Arguments: args})
	}
	return b.add(protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 1, Message: msg})
}
func (b *logBuilder) call(id string) *logBuilder {
	return b.add(protocol.EvToolCall, protocol.ToolCallData{Turn: 1, Step: 1, CallID: id, Name: "list_dir", Arguments: "{}"})
}
func (b *logBuilder) result(id string) *logBuilder {
	return b.add(protocol.EvToolResult, protocol.ToolResultData{Turn: 1, Step: 1, CallID: id, Name: "list_dir", Content: protocol.Text("r-" + id)})
}
func (b *logBuilder) inbox(typ string, seq protocol.Seq, id string) *logBuilder {
	switch typ {
	case protocol.EvInboxEnqueue:
		return b.add(typ, protocol.InboxEnqueueData{MessageID: id, InboxSeq: seq})
	case protocol.EvInboxDequeue:
		return b.add(typ, protocol.InboxDequeueData{MessageID: id, InboxSeq: seq, Turn: 1})
	default:
		return b.add(typ, protocol.InboxDiscardData{MessageID: id, InboxSeq: seq, Reason: "r"})
	}
}

// indexLogs are logs that exercise each rule History and the log walks
// keep (issue 14's replay rules, the open turn, the inbox cursor).
func indexLogs(t *testing.T) map[string][]protocol.SessionEvent {
	b := func() *logBuilder { return &logBuilder{t: t} }
	thought, empty := "hmm", ""
	reasoning := b()
	reasoning.user("q").add(protocol.EvAssistantMessage, protocol.AssistantMessageData{Message: protocol.AssistantMessage{Content: protocol.Text("a"), ReasoningContent: &thought}})
	reasoning.add(protocol.EvAssistantMessage, protocol.AssistantMessageData{Message: protocol.AssistantMessage{Content: []protocol.ContentBlock{}, ReasoningContent: &empty}})
	garbage := []byte{0xc1, 0xff, 0x00}
	return map[string][]protocol.SessionEvent{
		"a completed turn with a call": b().turn(1).user("q").step(1).say("", "c1:{}").call("c1").result("c1").stepEnd(1).
			step(2).say("done").stepEnd(2).end(1).evs,
		"a call without a result (cut at the token limit)": b().turn(1).user("q").step(1).say("", "c1:{}", "c2:{}").call("c1").result("c1").
			end(1).turn(2).user("again").say("ok").evs,
		"a result without a call, a second result": b().turn(1).user("q").result("ghost").say("", "c1").call("c1").result("c1").result("c1").say("done").evs,
		"an id repeated across steps and within one message": b().turn(1).user("q").say("", "call_0:{}", "call_0:{\"a\":1}").result("call_0").
			say("", "call_0").result("call_0").say("", "call_1", "call_1").result("call_1").result("call_1").evs,
		"a result before its call, and one after": b().turn(1).user("q").result("x").say("", "x:{}").say("", "x:{}").result("x").evs,
		"a result before its call only":           b().turn(1).user("q").result("y").say("", "y").say("done").evs,
		"arguments replayed as a JSON object": b().user("q").say("", "a:", "b:[1]", "c: {\"k\":1} ", "d:{\"k\":", "e:\u00a0{}").
			result("a").result("b").result("c").result("d").result("e").evs,
		"reasoning content present, empty and absent": reasoning.evs,
		"an undecodable user message":                 b().turn(1).user("q").raw(protocol.EvUserMessage, garbage).say("a", "c").result("c").evs,
		"an undecodable result after an undecodable message": b().turn(1).user("q").raw(protocol.EvAssistantMessage, garbage).say("a", "c").
			raw(protocol.EvToolResult, garbage).result("c").evs,
		"undecodable turn, step and call events": b().raw(protocol.EvTurnStart, garbage).turn(3).raw(protocol.EvTurnStart, garbage).
			raw(protocol.EvStepStart, garbage).say("", "c").raw(protocol.EvToolCall, garbage).call("c").evs,
		"undecodable turn starts after one that decodes": b().turn(1).step(2).raw(protocol.EvTurnStart, garbage).raw(protocol.EvTurnStart, garbage).
			raw(protocol.EvStepStart, garbage).evs,
		"an open turn with a pending call and an open step": b().turn(1).user("q").step(1).say("", "c1", "c2").call("c1").call("c2").
			result("c1").evs,
		"calls after a turn's end, then a new turn": b().turn(1).user("q").say("", "c1").call("c1").end(1).call("c9").turn(2).step(1).
			call("c2").stepEnd(1).evs,
		"the inbox: seen, claimed, discarded, copies": b().inbox(protocol.EvInboxEnqueue, 1, "m1").inbox(protocol.EvInboxEnqueue, 2, "").
			turn(1).inbox(protocol.EvInboxDequeue, 1, "m1").user("q").inbox(protocol.EvInboxDiscard, 2, "").
			inbox(protocol.EvInboxDequeue, 5, "m5").raw(protocol.EvInboxDequeue, garbage).inbox(protocol.EvInboxDiscard, 7, "m7").end(1).evs,
	}
}

// checkIndexAtEveryPrefix feeds events to an Index one at a time and holds
// it, at every prefix, to the functions it replaces: History (messages or
// error), NewCallIDs, sessionlog.InboxCursor and DoneMessages, LastTurn,
// OpenTurn and CloseOpenTurn. Each prefix's messages are checked again at
// the end: a later Add must not change what Messages returned before.
func checkIndexAtEveryPrefix(t *testing.T, events []protocol.SessionEvent) {
	t.Helper()
	x := NewIndex(true)
	got := make([][]model.Message, len(events)+1)
	for i := 0; i <= len(events); i++ {
		if i > 0 {
			x.Add(events[i-1])
		}
		prefix := events[:i]
		want, werr := History(prefix)
		msgs, err := x.Messages()
		if fmt.Sprint(err) != fmt.Sprint(werr) || !reflect.DeepEqual(msgs, want) {
			t.Fatalf("prefix %d: Messages = %+v, %v; History = %+v, %v", i, msgs, err, want, werr)
		}
		got[i] = msgs
		if ids := NewCallIDs(prefix); !reflect.DeepEqual(x.CallIDs().used, ids.used) {
			t.Fatalf("prefix %d: call ids %v, NewCallIDs %v", i, x.CallIDs().used, ids.used)
		}
		seen, done := sessionlog.InboxCursor(prefix)
		il := x.InboxLog()
		if !reflect.DeepEqual(il.Seen, seen) || !reflect.DeepEqual(il.Done, done) || !reflect.DeepEqual(il.DoneIDs, sessionlog.DoneMessages(prefix)) {
			t.Fatalf("prefix %d: inbox log %+v; InboxCursor %v %v, DoneMessages %v", i, il, seen, done, sessionlog.DoneMessages(prefix))
		}
		if x.LastTurn() != sessionlog.LastTurn(prefix) {
			t.Fatalf("prefix %d: last turn %d, LastTurn %d", i, x.LastTurn(), sessionlog.LastTurn(prefix))
		}
		wturn, wopen, wstep, wstepOpen, wpending := sessionlog.OpenTurn(prefix)
		// The index asked at every prefix, and one given the prefix at once
		// (its turn/start and step/start events decoded when asked).
		whole := NewIndex(true)
		whole.Add(prefix...)
		for _, x := range []*Index{x, whole} {
			turn, open, step, stepOpen, pending := x.OpenTurn()
			if turn != wturn || open != wopen || step != wstep || stepOpen != wstepOpen || !reflect.DeepEqual(pending, wpending) {
				t.Fatalf("prefix %d: open turn %d %v %d %v %+v; OpenTurn %d %v %d %v %+v", i, turn, open, step, stepOpen, pending, wturn, wopen, wstep, wstepOpen, wpending)
			}
		}
		fresh := NewIndex(false)
		fresh.Add(prefix...)
		if got := fresh.LastTurn(); got != sessionlog.LastTurn(prefix) {
			t.Fatalf("prefix %d given at once: last turn %d, LastTurn %d", i, got, sessionlog.LastTurn(prefix))
		}
		reason := protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}
		closing, cerr := x.CloseOpenTurn(reason, 7)
		wclosing, wcerr := sessionlog.CloseOpenTurn(prefix, reason, 7)
		if !reflect.DeepEqual(closing, wclosing) || fmt.Sprint(cerr) != fmt.Sprint(wcerr) {
			t.Fatalf("prefix %d: closing %+v, %v; CloseOpenTurn %+v, %v", i, closing, cerr, wclosing, wcerr)
		}
	}
	for i := range got {
		if want, _ := History(events[:i]); !reflect.DeepEqual(got[i], want) {
			t.Fatalf("the messages of prefix %d changed after later events were added: %+v, want %+v", i, got[i], want)
		}
	}
}

// TestIndexAnswersAsTheLogWalksDo: the incremental conversation, call ids,
// inbox cursor and open turn equal what History and the sessionlog walks
// read from the same events, at every prefix of logs that exercise each
// replay rule (FuzzToolArguments checks the same on its corpus's logs).
func TestIndexAnswersAsTheLogWalksDo(t *testing.T) {
	for name, events := range indexLogs(t) {
		t.Run(name, func(t *testing.T) { checkIndexAtEveryPrefix(t, events) })
	}
}

// historyModel is the scripted model that also records each request's
// messages.
type historyModel struct {
	*model.Scripted
	requests [][]model.Message
}

func (m *historyModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	m.requests = append(m.requests, req.Messages)
	return m.Scripted.Stream(ctx, req, onText)
}

// priorTurns is a log of n completed turns, each with one tool call.
func priorTurns(t testing.TB, n int) []protocol.SessionEvent {
	var evs []protocol.SessionEvent
	for turn := int64(1); turn <= int64(n); turn++ {
		id := fmt.Sprintf("call_%d", turn)
		evs = appendLogged(t, evs,
			logged{protocol.EvTurnStart, protocol.TurnData{Turn: turn}},
			logged{protocol.EvUserMessage, protocol.UserMessageData{ID: fmt.Sprintf("u%d", turn), Turn: turn, Content: protocol.Text("a question of some length, as users ask them")}},
			logged{protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1}},
			logged{protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 1, Message: protocol.AssistantMessage{
				Content: []protocol.ContentBlock{}, ToolCalls: []protocol.ToolCall{{ID: id, Name: "list_dir", Arguments: `{"path":"."}`}}}}},
			logged{protocol.EvToolCall, protocol.ToolCallData{Turn: turn, Step: 1, CallID: id, Name: "list_dir", Arguments: `{"path":"."}`}},
			logged{protocol.EvToolResult, protocol.ToolResultData{Turn: turn, Step: 1, CallID: id, Name: "list_dir", Content: protocol.Text("a.txt\nb.txt\n")}},
			logged{protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 1}},
			logged{protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 2}},
			logged{protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 2, Message: protocol.AssistantMessage{Content: protocol.Text("an answer of some length, as models give them")}}},
			logged{protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 2}},
			logged{protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}},
		)
	}
	return evs
}

// logged is an event to append to a test log: its type and payload.
type logged struct {
	typ  string
	data any
}

// appendLogged appends es to evs as events numbered on from len(evs).
func appendLogged(tb testing.TB, evs []protocol.SessionEvent, es ...logged) []protocol.SessionEvent {
	tb.Helper()
	for _, e := range es {
		ev, err := protocol.NewEvent(e.typ, 1795979443122, e.data)
		if err != nil {
			tb.Fatal(err)
		}
		ev.Seq = int64(len(evs))
		evs = append(evs, ev)
	}
	return evs
}

// TestATurnDecodesEachEventOncePerActivation: an agent built over a log of
// prior turns runs a turn of three steps (two with tool calls). Its Index
// decodes each event's payload once, whichever step reads the conversation:
// the prior events' payloads are overwritten with bytes that do not decode
// once the agent is built, and every request still carries the whole
// conversation (before the Index, each step rebuilt it from the log with
// History, and the turn ended "the session log cannot be replayed").
func TestATurnDecodesEachEventOncePerActivation(t *testing.T) {
	prior := priorTurns(t, 20)
	log := &memLog{next: int64(len(prior))}
	m := &historyModel{Scripted: model.NewScripted()}
	reg, err := NewRegistry(ListDirTool(AnyWorkspace))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: t.TempDir()}, Log: log, Model: m, Tools: reg, Events: prior})
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	for i := range a.events {
		if a.events[i].Type != protocol.EvTurnEnd && a.events[i].Type != protocol.EvStepEnd {
			a.events[i].Data = []byte{0xc1} // never a valid MessagePack value
		}
	}
	a.mu.Unlock()
	out := a.RunTurn(context.Background(), userInput("call list_dir {}\nsleep 0s\ncall list_dir {}\nsay done"))
	if out.Err != nil || out.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("outcome %+v", out)
	}
	priorMsgs := 20 * 4 // user, assistant with a call, its result, the answer
	if len(m.requests) != 3 {
		t.Fatalf("%d model requests, want 3", len(m.requests))
	}
	for i, req := range m.requests {
		if want := priorMsgs + 1 + 2*i; len(req) != want || protocol.PlainText(req[0].Content) != "a question of some length, as users ask them" {
			t.Fatalf("request %d has %d messages, want %d beginning with the first turn's question", i+1, len(req), want)
		}
	}
	// Messages, calls and results are decoded as they are added; of the
	// turn/start and step/start events only the last, when asked: the prior
	// log's last turn/start when the agent was built (its LastTurn), the
	// turn's own and its last step/start by CloseOpenTurn.
	messages := 0
	for _, ev := range a.Events() {
		switch ev.Type {
		case protocol.EvUserMessage, protocol.EvAssistantMessage, protocol.EvToolCall, protocol.EvToolResult:
			messages++
		}
	}
	decodes := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.index.decodes
	}
	if got := decodes(); got != messages+1 {
		t.Fatalf("%d payload decodes for %d messages, calls and results and one turn/start: want one each", got, messages)
	}
	if closing, err := a.CloseOpenTurn(protocol.TurnEndReason{Kind: protocol.TurnInterrupted}, 0); err != nil || closing != nil {
		t.Fatalf("closing %+v, %v: the turn ended", closing, err)
	}
	if got := decodes(); got != messages+3 {
		t.Fatalf("%d payload decodes after CloseOpenTurn, want %d", got, messages+3)
	}
	a.CloseOpenTurn(protocol.TurnEndReason{Kind: protocol.TurnInterrupted}, 0)
	if got := decodes(); got != messages+3 {
		t.Fatalf("%d payload decodes after a second CloseOpenTurn, want %d: each event is decoded once", got, messages+3)
	}
}

// BenchmarkAgentStepLongSession: the history a step sends, for an agent
// over a log of 10,000 events (about 900 prior turns of one tool call each):
// "rebuild" is History over the whole log, what every step did before the
// Index; "index" is the Index's conversation, what a step does now; "step"
// is a whole one-step turn (opening, model call, end) on that agent, and
// "resume" the agent's construction over the log and such a turn (the
// agent's share of a cold resume).
func BenchmarkAgentStepLongSession(b *testing.B) {
	prior := priorTurns(b, 10000/11+1)
	reg, err := NewRegistry(ListDirTool(AnyWorkspace))
	if err != nil {
		b.Fatal(err)
	}
	build := func(b *testing.B) *Agent {
		a, err := New(Config{Header: protocol.SessionHeader{ID: "S1", Cwd: b.TempDir()}, Log: &memLog{next: int64(len(prior))},
			Model: model.NewScripted(), Tools: reg, Events: prior})
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	b.Run("rebuild", func(b *testing.B) {
		a := build(b)
		b.ResetTimer()
		for range b.N {
			if _, err := History(a.Events()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("index", func(b *testing.B) {
		a := build(b)
		b.ResetTimer()
		for range b.N {
			a.mu.Lock()
			_, err := a.index.Messages()
			a.mu.Unlock()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("resume", func(b *testing.B) {
		for range b.N {
			if out := build(b).RunTurn(context.Background(), userInput("say ok")); out.Reason.Kind != protocol.TurnCompleted {
				b.Fatalf("outcome %+v", out)
			}
		}
	})
	b.Run("step", func(b *testing.B) {
		a := build(b)
		b.ResetTimer()
		for range b.N {
			if out := a.RunTurn(context.Background(), userInput("say ok")); out.Reason.Kind != protocol.TurnCompleted {
				b.Fatalf("outcome %+v", out)
			}
		}
	})
}

// BenchmarkResumeReads10k: what a cold resume reads from a log of 10,000
// events of one-step turns (the shape of bench's BenchmarkColdResume10k)
// before its first model request. "walks" is each read by its own walk,
// as before the Index: LastTurn, NewCallIDs, sessionlog.CloseOpenTurn, the
// inbox cursors of the turn's claim and of its first step's (four
// InboxCursor and two DoneMessages walks) and History; "index" is the same
// reads from one Index.
func BenchmarkResumeReads10k(b *testing.B) {
	var events []protocol.SessionEvent
	for turn := int64(1); len(events) < 10000; turn++ {
		events = appendLogged(b, events,
			logged{protocol.EvTurnStart, protocol.TurnData{Turn: turn}},
			logged{protocol.EvUserMessage, protocol.UserMessageData{ID: fmt.Sprintf("u%d", turn), Turn: turn, Content: protocol.Text("a question of some length, as users ask them")}},
			logged{protocol.EvStepStart, protocol.StepData{Turn: turn, Step: 1}},
			logged{protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: turn, Step: 1, Message: protocol.AssistantMessage{Content: protocol.Text("an answer of some length, as models give them")}}},
			logged{protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 1}},
			logged{protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}},
		)
	}
	reason := protocol.TurnEndReason{Kind: protocol.TurnInterrupted, Cause: protocol.CauseHostLost}
	b.Run("walks", func(b *testing.B) {
		for range b.N {
			_ = sessionlog.LastTurn(events)
			_ = NewCallIDs(events)
			if _, err := sessionlog.CloseOpenTurn(events, reason, 0); err != nil {
				b.Fatal(err)
			}
			for range 4 {
				_, _ = sessionlog.InboxCursor(events)
			}
			for range 2 {
				_ = sessionlog.DoneMessages(events)
			}
			if _, err := History(events); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("index", func(b *testing.B) {
		for range b.N {
			x := NewIndex(true)
			x.Add(events...)
			_ = x.LastTurn()
			if _, err := x.CloseOpenTurn(reason, 0); err != nil {
				b.Fatal(err)
			}
			for range 2 {
				_ = x.InboxLog()
			}
			if _, err := x.Messages(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
