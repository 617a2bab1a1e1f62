package sessionlog

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

func ev(t *testing.T, typ string, at int64, data any) protocol.SessionEvent {
	t.Helper()
	e, err := protocol.NewEvent(typ, at, data)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestOwnUsage(t *testing.T) {
	step := func(turn, n int64) protocol.StepData { return protocol.StepData{Turn: turn, Step: n} }
	msg := func(turn, n int64, u *protocol.Usage) protocol.AssistantMessageData {
		return protocol.AssistantMessageData{Turn: turn, Step: n, Message: protocol.AssistantMessage{Content: protocol.Text("x")}, Usage: u}
	}
	tests := []struct {
		name   string
		events func(t *testing.T) []protocol.SessionEvent
		want   protocol.RunUsage
	}{
		{"empty log", func(*testing.T) []protocol.SessionEvent { return nil }, protocol.RunUsage{}},
		{"two turns, a tool step, one unreported request", func(t *testing.T) []protocol.SessionEvent {
			return []protocol.SessionEvent{
				ev(t, protocol.EvTurnStart, 1000, protocol.TurnData{Turn: 1}),
				ev(t, protocol.EvStepStart, 1001, step(1, 1)),
				ev(t, protocol.EvAssistantMessage, 1002, msg(1, 1, &protocol.Usage{InputTokens: 10, OutputTokens: 4})),
				ev(t, protocol.EvToolCall, 1002, protocol.ToolCallData{Turn: 1, Step: 1, CallID: "a", Name: "read_file"}),
				ev(t, protocol.EvToolCall, 1002, protocol.ToolCallData{Turn: 1, Step: 1, CallID: "b", Name: "read_file"}),
				ev(t, protocol.EvStepEnd, 1003, step(1, 1)),
				ev(t, protocol.EvStepStart, 1004, step(1, 2)),
				ev(t, protocol.EvAssistantMessage, 1005, msg(1, 2, &protocol.Usage{InputTokens: 20, OutputTokens: 1})),
				ev(t, protocol.EvStepEnd, 1005, step(1, 2)),
				ev(t, protocol.EvTurnEnd, 1250, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}),
				ev(t, protocol.EvTurnStart, 2000, protocol.TurnData{Turn: 2}),
				ev(t, protocol.EvStepStart, 2001, step(2, 1)), // a failed request: no message
				ev(t, protocol.EvStepEnd, 2002, step(2, 1)),
				ev(t, protocol.EvTurnEnd, 2100, protocol.TurnEndData{Turn: 2, Reason: protocol.TurnEndReason{Kind: protocol.TurnError}}),
			}
		}, protocol.RunUsage{InputTokens: 30, OutputTokens: 5, ModelRequests: 3, UnreportedRequests: 1, ToolCalls: 2, WallMs: 350}},
		{"unknown usage is unreported, never zero; an open turn adds no time", func(t *testing.T) []protocol.SessionEvent {
			return []protocol.SessionEvent{
				ev(t, protocol.EvTurnStart, 1000, protocol.TurnData{Turn: 1}),
				ev(t, protocol.EvStepStart, 1001, step(1, 1)),
				ev(t, protocol.EvAssistantMessage, 1002, msg(1, 1, &protocol.Usage{Unknown: true})),
			}
		}, protocol.RunUsage{ModelRequests: 1, UnreportedRequests: 1}},
		{"a step's second message does not count twice", func(t *testing.T) []protocol.SessionEvent {
			return []protocol.SessionEvent{
				ev(t, protocol.EvStepStart, 1001, step(1, 1)),
				ev(t, protocol.EvAssistantMessage, 1002, msg(1, 1, &protocol.Usage{InputTokens: 3, OutputTokens: 2})),
				ev(t, protocol.EvAssistantMessage, 1002, msg(1, 1, &protocol.Usage{InputTokens: 3, OutputTokens: 2})),
			}
		}, protocol.RunUsage{InputTokens: 3, OutputTokens: 2, ModelRequests: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OwnUsage(tt.events(t)); got != tt.want {
				t.Fatalf("OwnUsage = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestUsageCountsEachDelegationOnce: the subtree adds each foreground
// child's usage once per runId and each background child's notice once per
// messageId, whether it was seen (enqueue), claimed (user/message) or
// discarded; a notice of another kind, or a result without childUsage,
// adds nothing (docs/protocol.md §6.6).
func TestUsageCountsEachDelegationOnce(t *testing.T) {
	child := func(in int64) *protocol.UsageSummary {
		u := protocol.RunUsage{InputTokens: in, OutputTokens: 1, ModelRequests: 1, ToolCalls: 1, WallMs: 10}
		return &protocol.UsageSummary{Own: protocol.RunUsage{InputTokens: 1}, Subtree: u}
	}
	settled := func(u *protocol.UsageSummary) protocol.MessageSource {
		return protocol.MessageSource{Kind: protocol.SourceSubagentSettled, Form: "notice", Usage: u}
	}
	events := []protocol.SessionEvent{
		ev(t, protocol.EvStepStart, 1, protocol.StepData{Turn: 1, Step: 1}),
		ev(t, protocol.EvAssistantMessage, 2, protocol.AssistantMessageData{Turn: 1, Step: 1, Usage: &protocol.Usage{InputTokens: 5, OutputTokens: 5}}),
		ev(t, protocol.EvToolCall, 2, protocol.ToolCallData{Turn: 1, Step: 1, CallID: "c1", Name: "subagent"}),
		ev(t, protocol.EvToolResult, 3, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c1", Name: "subagent", Meta: map[string]string{"runId": "r1"}, ChildUsage: child(100)}),
		// a copy of the same run's result (never logged twice, but counted once if it were)
		ev(t, protocol.EvToolResult, 3, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c9", Name: "subagent", Meta: map[string]string{"runId": "r1"}, ChildUsage: child(100)}),
		ev(t, protocol.EvToolResult, 3, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c2", Name: "read_file"}),
		// a claimed notice: enqueue and user/message name the same item
		ev(t, protocol.EvInboxEnqueue, 4, protocol.InboxEnqueueData{MessageID: "m1", InboxSeq: 7, Source: settled(child(1000))}),
		ev(t, protocol.EvInboxDequeue, 4, protocol.InboxDequeueData{MessageID: "m1", InboxSeq: 7, Turn: 2}),
		ev(t, protocol.EvUserMessage, 4, protocol.UserMessageData{ID: "m1", Turn: 2, Source: settled(child(1000))}),
		// a discarded notice still counts: the child spent it
		ev(t, protocol.EvInboxEnqueue, 5, protocol.InboxEnqueueData{MessageID: "m2", InboxSeq: 8, Source: settled(child(10000))}),
		ev(t, protocol.EvInboxDiscard, 5, protocol.InboxDiscardData{MessageID: "m2", InboxSeq: 8, Reason: "parent"}),
		// a report is no end
		ev(t, protocol.EvUserMessage, 6, protocol.UserMessageData{ID: "m3", Turn: 3, Source: protocol.MessageSource{Kind: protocol.SourceSubagentReport, Usage: child(99999)}}),
	}
	got := Usage(events)
	own := protocol.RunUsage{InputTokens: 5, OutputTokens: 5, ModelRequests: 1, ToolCalls: 1}
	if got.Own != own {
		t.Fatalf("own %+v, want %+v", got.Own, own)
	}
	want := own.Add(child(100).Subtree).Add(child(1000).Subtree).Add(child(10000).Subtree)
	if got.Subtree != want {
		t.Fatalf("subtree %+v, want %+v", got.Subtree, want)
	}
}
