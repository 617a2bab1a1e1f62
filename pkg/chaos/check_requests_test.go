package chaos

import (
	"encoding/json"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// askTurn logs a turn of child that calls tool with args (call callID) and
// parks it on its request; it returns the turn's number.
func (b *histBuilder) askTurn(child, callID, tool, args string) int64 {
	n := int64(1)
	for _, ev := range b.h.Snapshot.Logs[child] {
		if ev.Type == protocol.EvTurnStart {
			n++
		}
	}
	kind := protocol.RequestApproval
	if tool == "ask" {
		kind = protocol.RequestQuestion
	}
	b.event(child, protocol.EvTurnStart, protocol.TurnData{Turn: n})
	b.event(child, protocol.EvStepStart, protocol.StepData{Turn: n, Step: 1})
	b.event(child, protocol.EvAssistantMessage, protocol.AssistantMessageData{Turn: n, Step: 1, Message: protocol.AssistantMessage{
		Content: protocol.Text(""), ToolCalls: []protocol.ToolCall{{ID: callID, Name: tool, Arguments: args}}}})
	b.event(child, protocol.EvToolCall, protocol.ToolCallData{Turn: n, Step: 1, CallID: callID, Name: tool, Arguments: args})
	if tool != protocol.ToolAnswerRequest {
		b.event(child, protocol.EvRequestOpen, protocol.RequestOpenData{RequestID: protocol.RequestID(child, callID), Kind: kind,
			Turn: n, Step: 1, CallID: callID, Tool: tool, Deadline: b.now + 8000})
	}
	return n
}

func (b *histBuilder) answerLogged(child, callID, state string, by protocol.Answerer) {
	b.event(child, protocol.EvRequestAnswer, protocol.RequestAnswerData{RequestID: protocol.RequestID(child, callID), CallID: callID, State: state, By: by})
}

func (b *histBuilder) result(child, callID, tool string, turn int64, isError bool) {
	b.event(child, protocol.EvToolResult, protocol.ToolResultData{Turn: turn, Step: 1, CallID: callID, Name: tool, Content: protocol.Text("r"), IsError: isError})
}

func (b *histBuilder) endTurn(child string, turn int64, kind string) {
	b.event(child, protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: 1})
	b.event(child, protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: protocol.TurnEndReason{Kind: kind}})
}

// request stores child's request record of callID: pending when state is,
// else answered by by with answer id.
func (b *histBuilder) request(child, callID, tool, state string, by protocol.Answerer, id string) string {
	rid := protocol.RequestID(child, callID)
	rec := protocol.RequestRecord{Version: 1, ID: rid, SessionID: child, Kind: protocol.RequestApproval, CallID: callID, Tool: tool,
		State: state, CreatedAt: b.now, Deadline: b.now + 8000}
	if state != protocol.RequestPending {
		rec.Answer = &protocol.RequestAnswer{State: state, By: by, At: b.tick(), ID: id}
	}
	if b.h.Snapshot.Requests == nil {
		b.h.Snapshot.Requests = map[string]protocol.RequestRecord{}
	}
	b.h.Snapshot.Requests[rid] = rec
	return rid
}

func (b *histBuilder) answerOp(rid, verb, answerID, state string, code protocol.Code) *Op {
	op := &Op{Kind: OpAnswer, Root: tRoot, Sender: "grant:client-1", RequestID: rid, Verb: verb, AnswerID: answerID, AnswerState: state}
	if code != "" {
		op.Outcome, op.Code, op.AnswerID, op.AnswerState = OutcomeFail, string(code), "", ""
	}
	return b.op(op)
}

var (
	byUser    = protocol.Answerer{Kind: protocol.AnswererUser}
	byTimeout = protocol.Answerer{Kind: protocol.AnswererTimeout}
)

// ranArgs are a workload run_command call's arguments for token tok.
func ranArgs(tok string) string {
	b, _ := json.Marshal(map[string]string{"command": "echo " + tok + " >> " + RanFile})
	return string(b)
}

// approvedRun logs child A's run_command r9-1 approved by the user
// (answer id x1, one op), run once, its turn completed.
func approvedRun(b *histBuilder) string {
	b.child("A", 0)
	n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
	rid := b.request("A", "c1", "run_command", protocol.RequestApproved, byUser, "x1")
	b.answerOp(rid, protocol.AnswerApprove, "x1", protocol.RequestApproved, "")
	b.answerLogged("A", "c1", protocol.RequestApproved, byUser)
	b.result("A", "c1", "run_command", n, false)
	b.endTurn("A", n, protocol.TurnCompleted)
	b.h.Workspace = map[string]string{RanFile: "r9-1\n"}
	return rid
}

// Requests (I10): each case is a log, records, answers and a workspace a
// build leaves; the checker must name exactly the invariants it breaks.
func TestCheckerRequests(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(b *histBuilder)
		want   map[string]string
		check  func(t *testing.T, s Summary)
	}{
		{"approved, ran once, a second answer refused", func(b *histBuilder) {
			rid := approvedRun(b)
			b.answerOp(rid, protocol.AnswerDeny, "", "", protocol.CodeAlreadyAnswered)
		}, nil, func(t *testing.T, s Summary) {
			if s.Requests != 1 || s.RequestsAnswered != 1 || s.Answers != 1 || s.AnswersRefused != 1 {
				t.Errorf("summary %+v", s)
			}
		}},
		{"an answer without its compare-and-set: two answers taken", func(b *histBuilder) {
			rid := approvedRun(b)
			b.answerOp(rid, protocol.AnswerDeny, "x2", protocol.RequestDenied, "")
			b.request("A", "c1", "run_command", protocol.RequestDenied, byUser, "x2")
		}, map[string]string{"I10": "2 answers were taken"}, nil},
		{"answered twice in the log", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "write_file", `{"path":"w/r9-1.txt","content":"r9-1"}`)
			b.request("A", "c1", "write_file", protocol.RequestApproved, byUser, "x1")
			b.answerLogged("A", "c1", protocol.RequestApproved, byUser)
			b.answerLogged("A", "c1", protocol.RequestApproved, byUser)
			b.result("A", "c1", "write_file", n, false)
			b.endTurn("A", n, protocol.TurnCompleted)
		}, map[string]string{"I10": "answered 2 times in its log"}, nil},
		{"a tool ran with no answer logged", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "write_file", `{"path":"x","content":"y"}`)
			b.request("A", "c1", "write_file", protocol.RequestPending, byUser, "")
			b.result("A", "c1", "write_file", n, false)
			b.endTurn("A", n, protocol.TurnCompleted)
		}, map[string]string{"I10": "has a result that is no error"}, nil},
		{"closed interrupted while parked (its host lost)", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
			b.request("A", "c1", "run_command", protocol.RequestPending, byUser, "")
			b.result("A", "c1", "run_command", n, true)
			b.endTurn("A", n, protocol.TurnInterrupted)
			b.h.Workspace = map[string]string{}
		}, nil, func(t *testing.T, s Summary) {
			if s.RequestsClosed != 1 {
				t.Errorf("summary %+v", s)
			}
		}},
		{"continued after its host was lost: answered once in the same turn", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
			rid := b.request("A", "c1", "run_command", protocol.RequestApproved, byUser, "x1")
			b.event("A", protocol.EvAgentTakeover, protocol.TakeoverData{HostID: "h1", By: "coordinator", Epoch: 2})
			b.answerOp(rid, protocol.AnswerApprove, "x1", protocol.RequestApproved, "")
			b.answerLogged("A", "c1", protocol.RequestApproved, byUser)
			b.result("A", "c1", "run_command", n, false)
			b.endTurn("A", n, protocol.TurnCompleted)
			b.h.Workspace = map[string]string{RanFile: "r9-1\n"}
		}, nil, nil},
		{"the turn went on without the answer", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
			b.request("A", "c1", "run_command", protocol.RequestPending, byUser, "")
			b.result("A", "c1", "run_command", n, true)
			b.endTurn("A", n, protocol.TurnCompleted)
		}, map[string]string{"I10": "went on (completed)"}, nil},
		{"a request logged open with no record: lost", func(b *histBuilder) {
			b.child("A", 0)
			b.askTurn("A", "c1", "ask", `{"question":"go on?"}`)
		}, map[string]string{"I10": "has no record: lost", "I7": "does not replay"}, nil},
		{"an approved call that ran twice", func(b *histBuilder) {
			approvedRun(b)
			b.h.Workspace[RanFile] = "r9-1\nr9-1\n"
		}, map[string]string{"I10": "ran 2 times"}, nil},
		{"a denied call that ran", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
			b.request("A", "c1", "run_command", protocol.RequestDenied, byUser, "x1")
			b.answerLogged("A", "c1", protocol.RequestDenied, byUser)
			b.result("A", "c1", "run_command", n, false)
			b.endTurn("A", n, protocol.TurnCompleted)
			b.h.Workspace = map[string]string{RanFile: "r9-1\n"}
		}, map[string]string{"I10": "was denied, yet its call"}, nil},
		{"a timed-out call that left its effect", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
			b.request("A", "c1", "run_command", protocol.RequestTimedOut, byTimeout, "x1")
			b.answerLogged("A", "c1", protocol.RequestTimedOut, byTimeout)
			b.result("A", "c1", "run_command", n, true)
			b.endTurn("A", n, protocol.TurnCompleted)
			b.h.Workspace = map[string]string{RanFile: "r9-1\n"}
		}, map[string]string{"I10": "ran without an approval"}, nil},
		{"a timed-out request, denied, nothing ran", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "run_command", ranArgs("r9-1"))
			b.request("A", "c1", "run_command", protocol.RequestTimedOut, byTimeout, "x1")
			b.answerLogged("A", "c1", protocol.RequestTimedOut, byTimeout)
			b.result("A", "c1", "run_command", n, true)
			b.endTurn("A", n, protocol.TurnCompleted)
			b.h.Workspace = map[string]string{}
		}, nil, func(t *testing.T, s Summary) {
			if s.RequestsTimedOut != 1 {
				t.Errorf("summary %+v", s)
			}
		}},
		{"the child went on with another answer than the record's", func(b *histBuilder) {
			approvedRun(b)
			b.request("A", "c1", "run_command", protocol.RequestDenied, protocol.Answerer{Kind: protocol.AnswererAgent, SessionID: "P"}, "x9")
		}, map[string]string{"I10": "but the record holds denied by agent P"}, nil},
		{"an agent's answer and a user's both taken", func(b *histBuilder) {
			rid := approvedRun(b)
			b.child("P", 0)
			args, _ := json.Marshal(map[string]string{"requestId": rid, "decision": "approve"})
			n := b.askTurn("P", "p1", protocol.ToolAnswerRequest, string(args))
			b.result("P", "p1", protocol.ToolAnswerRequest, n, false)
			b.endTurn("P", n, protocol.TurnCompleted)
		}, map[string]string{"I10": "2 answers were taken (op 2 (grant:client-1), agent P)"}, nil},
		{"an agent that passed the request up answered nothing", func(b *histBuilder) {
			rid := approvedRun(b)
			b.child("P", 0)
			args, _ := json.Marshal(map[string]string{"requestId": rid, "decision": "pass_up"})
			n := b.askTurn("P", "p1", protocol.ToolAnswerRequest, string(args))
			b.result("P", "p1", protocol.ToolAnswerRequest, n, false)
			b.endTurn("P", n, protocol.TurnCompleted)
		}, nil, func(t *testing.T, s Summary) {
			if s.Answers != 1 {
				t.Errorf("summary %+v: a pass_up counted as an answer", s)
			}
		}},
		{"an answer logged in a later turn", func(b *histBuilder) {
			b.child("A", 0)
			n := b.askTurn("A", "c1", "ask", `{"question":"go on?"}`)
			b.request("A", "c1", "ask", protocol.RequestAnswered, byUser, "x1")
			b.result("A", "c1", "ask", n, true)
			b.endTurn("A", n, protocol.TurnAborted)
			b.event("A", protocol.EvTurnStart, protocol.TurnData{Turn: n + 1})
			b.answerLogged("A", "c1", protocol.RequestAnswered, byUser)
			b.event("A", protocol.EvTurnEnd, protocol.TurnEndData{Turn: n + 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}})
		}, map[string]string{"I10": "answered in turn 3: a second turn resumed"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newHist(t)
			tc.mutate(b)
			r := b.check()
			expect(t, r, tc.want)
			if r.Verdict("I10").Checked == 0 {
				t.Error("I10 checked nothing")
			}
			if tc.check != nil {
				tc.check(t, r.Summary)
			}
		})
	}
}
