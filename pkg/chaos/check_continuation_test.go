package chaos

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// continuedRun logs one-shot run R1 of the root whose host died in its
// turn's step 1 with run_command's call logged and its result not; a
// coordinator took it over and another worker continued it: the call's
// interrupted result closes step 1, step 2 answers, the run settles
// completed once, with one takeover. between runs after the takeover,
// before the continuing host's writes.
func continuedRun(b *histBuilder, between func()) *Op {
	b.header("R1", tRoot, 1)
	op := b.op(&Op{Kind: OpRun, Root: tRoot, Parent: tRoot, RunID: "R1", Child: "R1"})
	op.Marker = Marker(op.ID)
	b.event("R1", protocol.EvSubagentDescriptor, protocol.DescriptorData{Version: 2, Mode: protocol.ModeOneShot, Provider: "spawn"})
	b.event("R1", protocol.EvTurnStart, protocol.TurnData{Turn: 1})
	b.event("R1", protocol.EvUserMessage, protocol.UserMessageData{ID: "R1-m0", Turn: 1, Content: protocol.Text("say " + op.Marker), Source: protocol.MessageSource{Kind: protocol.SourceUser}})
	b.event("R1", protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1})
	b.event("R1", protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 1})
	b.event("R1", protocol.EvToolCall, protocol.ToolCallData{Turn: 1, Step: 1, CallID: "c1", Name: "run_command", Arguments: "{}"})
	b.event("R1", protocol.EvAgentTakeover, struct{}{})
	between()
	b.event("R1", protocol.EvToolResult, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c1", Name: "run_command", IsError: true,
		Content: protocol.Text("run_command was interrupted: its host stopped (host-lost) after the call was logged and before its result was; ...")})
	b.event("R1", protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: 1})
	b.event("R1", protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 2})
	b.event("R1", protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 2, Message: protocol.AssistantMessage{Content: protocol.Text("done")}})
	b.event("R1", protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: 2})
	b.event("R1", protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
	b.epoch("R1", "R1", protocol.ModeOneShot, op.Invoke, b.tick())
	rec := b.h.Snapshot.Runs["R1"]
	rec.Takeovers = 1
	b.h.Snapshot.Runs["R1"] = rec
	op.Notices = []Notice{{At: rec.SettledAt, StopReason: string(protocol.StopCompleted)}}
	return op
}

// TestCheckerContinuation: I12 holds a turn continued after a host loss
// (docs/protocol.md §8.4) to redoing nothing its log holds, counts the
// continuation, and names a step recorded twice, a model request answered
// twice and a tool result without its call or answering one twice.
func TestCheckerContinuation(t *testing.T) {
	cases := []struct {
		name    string
		between func(b *histBuilder)
		after   func(b *histBuilder)
		want    map[string]string
	}{
		{"a continued turn", nil, nil, nil},
		{"a fork child's own steps numbered as its seed's", func(b *histBuilder) {
			b.header("F", tRoot, 1)
			b.event("F", protocol.EvTurnStart, protocol.TurnData{Turn: 1})
			b.event("F", protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1})
			b.event("F", protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 1})
			b.event("F", protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: 1})
			b.event("F", protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
			b.event("F", protocol.EvSessionEndSeed, struct{}{})
			b.event("F", protocol.EvTurnStart, protocol.TurnData{Turn: 1})
			b.event("F", protocol.EvStepStart, protocol.StepData{Turn: 1, Step: 1})
			b.event("F", protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 1})
			b.event("F", protocol.EvStepEnd, protocol.StepData{Turn: 1, Step: 1})
			b.event("F", protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, nil, nil},
		{"continued twice: a completed step logged again", nil, func(b *histBuilder) {
			// Both continuing hosts sent the model request of step 2 and
			// logged its answer, one after the other.
			if !logStepAgain(b.h.Snapshot, "R1", 1, 2) {
				t.Fatal("no step 2 to log again")
			}
		}, map[string]string{"I12": "turn 1 step 2 has two step/start records"}},
		{"a model result logged twice in one step", func(b *histBuilder) {
			b.event("R1", protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: 1, Step: 1})
		}, nil, map[string]string{"I12": "turn 1 step 1 has two model results"}},
		{"a tool result without its call", func(b *histBuilder) {
			b.event("R1", protocol.EvToolResult, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c9", Name: "read_file"})
		}, nil, map[string]string{"I12": "tool/result of read_file c9", "I7": "without its call"}},
		{"a call answered twice", func(b *histBuilder) {
			b.event("R1", protocol.EvToolResult, protocol.ToolResultData{Turn: 1, Step: 1, CallID: "c1", Name: "run_command"})
		}, nil, map[string]string{"I12": "run_command c1 answered twice", "I7": "without its call, or twice"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHist(t)
			continuedRun(b, func() {
				if tc.between != nil {
					tc.between(b)
				}
			})
			if tc.after != nil {
				tc.after(b)
			}
			r := b.check()
			expect(t, r, tc.want)
			if r.Verdict("I12").Checked == 0 {
				t.Error("I12 checked nothing")
			}
			if s := r.Summary; s.Continued != 1 || s.Takeovers != 1 || s.ContinuedHostLost != 0 {
				t.Errorf("summary: %d continued, %d takeovers, %d HOST_LOST after one; want 1, 1, 0", s.Continued, s.Takeovers, s.ContinuedHostLost)
			}
		})
	}
}
