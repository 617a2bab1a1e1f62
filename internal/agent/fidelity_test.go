package agent_test

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestConversationSurvivesTheLogByteForByte writes a conversation whose values
// are easy to corrupt (null, "" and absent; integers at the edges of float64
// and int64; non-ASCII text; large tool output) through JetStream and reads it
// back: the events are identical byte for byte and rebuild the same history.
func TestConversationSurvivesTheLogByteForByte(t *testing.T) {
	st := testutil.NewStore(t)
	ctx := context.Background()
	empty := ""
	thought := "思考: 🙂"
	args := `{"a":null,"b":"","n":9007199254740993,"max":9223372036854775807,"neg":-1,"zero":0,"f":1.5e300,"u":"héllo 世界 🎉","esc":"\u0000\n\""}`
	large := strings.Repeat("línea de salida ✓\n", 30000) // ~600 KB of non-ASCII tool output
	mk := func(typ string, data any) protocol.SessionEvent {
		ev, err := protocol.NewEvent(typ, 1795979443122, data)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	in := []protocol.SessionEvent{
		mk(protocol.EvTurnStart, protocol.TurnData{Turn: 1}),
		mk(protocol.EvUserMessage, protocol.UserMessageData{ID: "m", Turn: 1, Content: protocol.Text("¿qué hay? \u2028 ok"), Source: protocol.MessageSource{Kind: protocol.SourceUser}}),
		mk(protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1}),
		mk(protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 1, Message: protocol.AssistantMessage{
			Content: []protocol.ContentBlock{}, ToolCalls: []protocol.ToolCall{{ID: "c1", Name: "list_dir", Arguments: args}}, ReasoningContent: &empty}}),
		mk(protocol.EvToolCall, protocol.ToolCallData{Turn: 1, Step: 1, CallID: "c1", Name: "list_dir", Arguments: args}),
		mk(protocol.EvToolResult, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c1", Name: "list_dir", Content: protocol.Text(large)}),
		mk(protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: 1}),
		mk(protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 2}),
		mk(protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 2, Message: protocol.AssistantMessage{
			Content: protocol.Text("done ✓"), ReasoningContent: &thought}, Usage: &protocol.Usage{InputTokens: 0, OutputTokens: 1<<53 + 1}}),
		mk(protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 2, Message: protocol.AssistantMessage{Content: protocol.Text("no reasoning")}}),
		mk(protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: 2}),
		mk(protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}),
	}
	w := st.NewLogWriter(protocol.ScopeRoot, "F", 0, 0)
	// Two records, as a step writes them; the large result alone is over half a MiB.
	if _, err := w.Append(ctx, in[:5]...); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, in[5:]...); err != nil {
		t.Fatal(err)
	}
	log, err := st.ReadLog(ctx, protocol.ScopeRoot, "F")
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Events) != len(in) {
		t.Fatalf("read %d events, wrote %d", len(log.Events), len(in))
	}
	for i := range in {
		if !bytes.Equal(log.Events[i].Data, in[i].Data) || log.Events[i].Type != in[i].Type || log.Events[i].Time != in[i].Time {
			t.Fatalf("event %d changed on the way through the log", i)
		}
	}
	want, _ := agent.History(in)
	got, err := agent.History(log.Events)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("history differs after the round trip: %v", err)
	}
	if got[1].ToolCalls[0].Arguments != args {
		t.Fatalf("arguments re-encoded: %s", got[1].ToolCalls[0].Arguments)
	}
	if got[1].ReasoningContent == nil || *got[1].ReasoningContent != "" {
		t.Fatal(`reasoning_content "" must stay present and empty`)
	}
	if got[4].ReasoningContent != nil {
		t.Fatal("absent reasoning_content must stay absent")
	}
	if *got[3].ReasoningContent != thought || protocol.PlainText(got[2].Content) != large {
		t.Fatal("text changed")
	}
	var usage protocol.AssistantMessageData
	_ = log.Events[8].Decode(&usage)
	if usage.Usage.OutputTokens != 1<<53+1 || usage.Usage.InputTokens != 0 {
		t.Fatalf("usage = %+v", usage.Usage)
	}
	// The decoded tool arguments keep exact integers.
	v, err := sessionlog.DecodeJSONValue(args)
	if err != nil {
		t.Fatal(err)
	}
	m := v.(map[string]any)
	if m["n"] != int64(9007199254740993) || m["max"] != int64(9223372036854775807) || m["a"] != nil || m["b"] != "" {
		t.Fatalf("decoded = %#v", m)
	}
	if _, ok := m["absent"]; ok {
		t.Fatal("absent key appeared")
	}
}

// TestOversizedToolOutputIsRefusedNotTruncated: a tool result over the limit
// is an explicit LIMIT_EXCEEDED error result; nothing is cut silently.
func TestOversizedToolOutputIsRefusedNotTruncated(t *testing.T) {
	st := testutil.NewStore(t)
	huge := &agent.Tool{Name: "huge", Parameters: []byte(`{"type":"object"}`),
		Run: func(context.Context, agent.ToolContext, string) agent.ToolResult {
			return agent.TextResult(strings.Repeat("x", 2<<20))
		}}
	reg, _ := agent.NewRegistry(huge)
	a, _ := agent.New(agent.Config{Header: protocol.SessionHeader{ID: "H"}, Log: st.NewLogWriter(protocol.ScopeRoot, "H", 0, 0), Model: model.NewScripted(), Tools: reg})
	out := a.RunTurn(context.Background(), agent.Input{Content: protocol.Text("call huge {}\nsay ok")})
	if out.Err != nil || out.Reason.Kind != protocol.TurnCompleted {
		t.Fatalf("outcome = %+v", out)
	}
	var d protocol.ToolResultData
	for _, ev := range a.Events() {
		if ev.Type == protocol.EvToolResult {
			_ = ev.Decode(&d)
		}
	}
	if !d.IsError || !strings.HasPrefix(protocol.PlainText(d.Content), "LIMIT_EXCEEDED") {
		t.Fatalf("result = %.200s", protocol.PlainText(d.Content))
	}
}
