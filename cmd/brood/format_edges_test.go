package main

import (
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestLogShowsTheEdgeEvents: `brood log` renders the events issue 14 added
// (a renamed tool-call id, ACP permission answers, late ACP output), and
// those of issue 33 (requests, their answers, a request's notice), and
// issue 32's model/retry.
func TestLogShowsTheEdgeEvents(t *testing.T) {
	ev := func(typ string, data any) protocol.SessionEvent { return newEvent(t, typ, data) }
	tests := []struct {
		ev   protocol.SessionEvent
		want string
	}{
		{ev(protocol.EvToolCall, protocol.ToolCallData{CallID: "call_0_2", Name: "list_dir", Arguments: "{}", ModelCallID: "call_0"}),
			"call_0_2 list_dir {} [the model's id call_0]"},
		{ev(protocol.EvACPPermission, protocol.ACPPermissionData{Turn: 1, ToolCallID: "p1", Title: "Write a file", Policy: "reject", Why: "provider policy",
			Outcome: "selected", OptionID: "no", OptionKind: "reject_once"}),
			"p1 Write a file: denied (selected no reject_once; reject: provider policy)"},
		{ev(protocol.EvACPPermission, protocol.ACPPermissionData{Turn: 2, Late: true, ToolCallID: "p2", Policy: "reject", Why: "no turn is running", Outcome: "cancelled"}),
			"[late, turn 2]"},
		{ev(protocol.EvACPLateUpdate, protocol.ACPLateUpdateData{Turn: 3, Kind: "agent_message_chunk", Text: " late"}),
			"turn 3, after its end: agent_message_chunk  late"},
		{ev(protocol.EvRequestOpen, protocol.RequestOpenData{RequestID: "r1", CallID: "call_1_0", Tool: "write_file"}),
			"call_1_0 write_file waits for approval: request r1"},
		{ev(protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: "r1", State: protocol.RequestDenied, Reason: "no",
			By: protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: "P"}}),
			"r1 denied by agent P: no"},
		{ev(protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: "r2", State: protocol.RequestTimedOut, By: protocol.Answerer{Kind: protocol.AnswererTimeout}}),
			"r2 timed out: no answer came before its deadline"},
		{ev(protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: "r5", State: protocol.RequestCancelled, Reason: "its run was disposed", By: protocol.Answerer{Kind: protocol.AnswererEnded}}),
			"r5 cancelled: its asking turn ended first: its run was disposed"},
		{ev(protocol.EvRequestOpen, protocol.RequestOpenData{RequestID: "r3", Kind: protocol.RequestQuestion, CallID: "call_2_0"}),
			"call_2_0 ask waits for an answer: request r3"},
		{ev(protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: "r3", State: protocol.RequestAnswered, Text: "postgres", By: protocol.Answerer{Kind: protocol.AnswererUser}}),
			"r3 answered by user: postgres"},
		{ev(protocol.EvUserMessage, protocol.UserMessageData{ID: "m1", Turn: 2, Content: protocol.Text("Subagent C asks for approval to run write_file (request r4).\nArguments: {}"),
			Source: protocol.MessageSource{Kind: protocol.SourceSubagentRequest, Form: "notice", SenderSessionID: "C"}}),
			"[request of C] Subagent C asks for approval to run write_file (request r4).⏎Arguments: {}"},
		{ev(protocol.EvModelRetry, protocol.ModelRetryData{Turn: 1, Step: 2, Attempt: 3, Status: 429, WaitMs: 2000, NextAt: 5, Diagnostic: "HTTP 429 from https://x: slow down"}),
			"turn 1 step 2: model attempt 3 failed temporarily, retry in 2s: HTTP 429 from https://x: slow down"},
	}
	for _, tt := range tests {
		if got := formatEvent(tt.ev, protocol.SessionHeader{}); !strings.Contains(got, tt.want) {
			t.Errorf("%s rendered %q, want it to contain %q", tt.ev.Type, got, tt.want)
		}
	}
}

// newEvent is an event of type typ with data, at time 1 ms.
func newEvent(t *testing.T, typ string, data any) protocol.SessionEvent {
	t.Helper()
	e, err := protocol.NewEvent(typ, 1, data)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestModelRetryNote: brood state's stderr line for a turn paused on a
// model retry names the attempt, the turn and step, the error and the next
// attempt's local time.
func TestModelRetryNote(t *testing.T) {
	next := time.Date(2026, 12, 7, 15, 4, 5, 0, time.Local)
	got := modelRetryNote(protocol.ModelRetryData{Turn: 1, Step: 3, Attempt: 2, Status: 429, WaitMs: 1000, NextAt: next.UnixMilli(), Diagnostic: "HTTP 429 from https://x: slow down"})
	if want := "paused: model attempt 2 of turn 1 step 3 failed (HTTP 429 from https://x: slow down); next attempt at 15:04:05"; got != want {
		t.Fatalf("note %q\nwant %q", got, want)
	}
}
