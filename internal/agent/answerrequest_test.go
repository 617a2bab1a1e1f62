package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// fakeAnswerer takes one answer and refuses every later one, as the
// coordinator's compare-and-set does.
type fakeAnswerer struct {
	got []protocol.RequestAnswerRequest
	err error // the first answer's, when set
}

func (f *fakeAnswerer) AnswerRequest(_ context.Context, r protocol.RequestAnswerRequest) (protocol.RequestRecord, error) {
	f.got = append(f.got, r)
	switch {
	case f.err != nil:
		return protocol.RequestRecord{}, f.err
	case len(f.got) > 1:
		return protocol.RequestRecord{}, protocol.NewError(protocol.CodeAlreadyAnswered, map[string]any{"requestId": r.RequestID, "state": "approved", "by": "agent"})
	}
	if r.Answer == protocol.AnswerPassUp {
		return protocol.RequestRecord{ID: r.RequestID, SessionID: "C", Tool: "write_file", State: protocol.RequestPending, Handler: "G", PassedBy: []string{"P"}}, nil
	}
	state := map[string]string{protocol.AnswerApprove: protocol.RequestApproved, protocol.AnswerDeny: protocol.RequestDenied, protocol.AnswerAnswer: protocol.RequestAnswered}[r.Answer]
	return protocol.RequestRecord{ID: r.RequestID, SessionID: "C", Tool: "write_file", State: state}, nil
}

// TestAnswerRequestTool (issue 33, item 4): answer_request calls
// requests.answer with the agent's own credential and the decision as
// given (json compacted); the coordinator's typed errors, a second answer's
// ALREADY_ANSWERED among them, are error results; bad arguments ask
// nothing.
func TestAnswerRequestTool(t *testing.T) {
	tc := ToolContext{Header: protocol.SessionHeader{ID: "P"}, Credential: "cred"}
	tests := []struct {
		name    string
		args    []string // one call each, in order
		err     error
		want    []string // each result contains
		isError []bool
		sent    protocol.RequestAnswerRequest // the first answer sent
	}{
		{"approve", []string{`{"requestId":"r1","decision":"approve"}`}, nil, []string{"request r1 approved: subagent C's write_file call runs now"}, []bool{false},
			protocol.RequestAnswerRequest{RequestID: "r1", Answer: "approve"}},
		{"deny with a reason", []string{`{"requestId":"r1","decision":"deny","reason":"no"}`}, nil, []string{"request r1 denied"}, []bool{false},
			protocol.RequestAnswerRequest{RequestID: "r1", Answer: "deny", Reason: "no"}},
		{"answer with json", []string{`{"requestId":"r1","decision":"answer","json":{ "n" : 1 }}`}, nil, []string{"request r1 answered"}, []bool{false},
			protocol.RequestAnswerRequest{RequestID: "r1", Answer: "answer", JSON: `{"n":1}`}},
		{"a second answer is ALREADY_ANSWERED", []string{`{"requestId":"r1","decision":"approve"}`, `{"requestId":"r1","decision":"deny"}`}, nil,
			[]string{"approved", "answer_request: the answer was not taken: ALREADY_ANSWERED"}, []bool{false, true},
			protocol.RequestAnswerRequest{RequestID: "r1", Answer: "approve"}},
		{"pass it up", []string{`{"requestId":"r1","decision":"pass_up"}`}, nil, []string{"request r1 passed up: subagent C's request now waits on agent G"}, []bool{false},
			protocol.RequestAnswerRequest{RequestID: "r1", Answer: "pass_up"}},
		{"a stranger is UNAUTHORIZED", []string{`{"requestId":"r1","decision":"approve"}`}, protocol.Errorf(protocol.CodeUnauthorized, "not an ancestor"),
			[]string{"the answer was not taken: UNAUTHORIZED: not authorized: not an ancestor"}, []bool{true}, protocol.RequestAnswerRequest{RequestID: "r1", Answer: "approve"}},
		{"a decision is required", []string{`{"requestId":"r1"}`}, nil, []string{"requestId and decision are both required"}, []bool{true}, protocol.RequestAnswerRequest{}},
		{"unknown arguments are refused", []string{`{"requestId":"r1","decision":"approve","pass":true}`}, nil, []string{"invalid arguments"}, []bool{true}, protocol.RequestAnswerRequest{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeAnswerer{err: tt.err}
			tool := AnswerRequestTool(f)
			for i, args := range tt.args {
				res := tool.Run(context.Background(), tc, args)
				if got := protocol.PlainText(res.Content); res.IsError != tt.isError[i] || !strings.Contains(got, tt.want[i]) {
					t.Fatalf("call %d: %q (error %v), want %q (error %v)", i, got, res.IsError, tt.want[i], tt.isError[i])
				}
			}
			if tt.sent.RequestID == "" {
				if len(f.got) != 0 {
					t.Fatalf("answered %+v; want nothing asked", f.got)
				}
				return
			}
			sent := f.got[0]
			if sent.Authority.Parent == nil || *sent.Authority.Parent != (protocol.ParentRef{SessionID: "P", Credential: "cred"}) || sent.Authority.Grant != "" {
				t.Fatalf("authority %+v, want the agent's own credential", sent.Authority)
			}
			sent.Authority = protocol.Authority{}
			if sent != tt.sent {
				t.Fatalf("sent %+v, want %+v", sent, tt.sent)
			}
		})
	}
}
