package coordinator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// toolResult returns the result the child's log holds for its call to
// tool, and the types of that call's events in log order (call, request,
// answer, result).
func toolResult(evs []protocol.SessionEvent, tool string) ([]string, protocol.ToolResultData) {
	var trail []string
	var res protocol.ToolResultData
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if ev.Decode(&d) == nil && d.Name == tool {
				trail = append(trail, ev.Type)
			}
		case protocol.EvRequestOpen, protocol.EvRequestAnswer:
			trail = append(trail, ev.Type)
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) == nil && d.Name == tool {
				trail, res = append(trail, ev.Type), d
			}
		}
	}
	return trail, res
}

// TestQuestionsAreAnsweredOnce (issue 33, item 2(b)): a child's ask call
// parks on a question; an answer the question refuses (text outside its
// choices, JSON its answerSchema refuses, text where JSON is asked, JSON
// where a choice is), the wrong verb (approve, deny) and a stranger's
// answer are refused with a typed error and leave it pending; the first
// good answer (the user's or the parent's) becomes the ask call's result;
// a second one is ALREADY_ANSWERED; an approval refuses the verb answer.
func TestQuestionsAreAnsweredOnce(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	type attempt struct {
		stranger bool
		verb     string
		text     string
		json     string
		code     protocol.Code // "" : it must succeed
		says     string        // the refusal names this
	}
	answer := func(verb, text, json string) attempt { return attempt{verb: verb, text: text, json: json} }
	refused := func(a attempt, code protocol.Code, says string) attempt { a.code, a.says = code, says; return a }
	const schema = `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}`
	tests := []struct {
		name     string
		call     string // the child's tool call
		tool     string
		byParent bool
		refusals []attempt
		good     attempt
		by       string
		result   string // the call's result
	}{
		{"free text by the user", `call ask {"question":"What should the file be called?"}`, "ask", false,
			[]attempt{
				refused(answer(protocol.AnswerApprove, "", ""), protocol.CodeInvalidArgument, "is a question"),
				refused(answer(protocol.AnswerDeny, "", ""), protocol.CodeInvalidArgument, "is a question"),
				refused(answer(protocol.AnswerAnswer, "", ""), protocol.CodeInvalidArgument, "needs text or json"),
				refused(answer(protocol.AnswerAnswer, "a", `"b"`), protocol.CodeInvalidArgument, "not both"),
				refused(attempt{stranger: true, verb: protocol.AnswerAnswer, text: "x"}, protocol.CodeUnauthorized, ""),
			},
			answer(protocol.AnswerAnswer, "notes.md", ""), protocol.AnswererUser, "notes.md"},
		{"a choice by the parent", `call ask {"question":"Which database?","choices":["postgres","sqlite"]}`, "ask", true,
			[]attempt{
				refused(answer(protocol.AnswerAnswer, "mysql", ""), protocol.CodeInvalidArgument, `"mysql" is not one of the choices`),
				refused(answer(protocol.AnswerAnswer, "", `"sqlite"`), protocol.CodeInvalidArgument, "answer with text, not json"),
				refused(answer(protocol.AnswerApprove, "", ""), protocol.CodeInvalidArgument, "is a question"),
			},
			answer(protocol.AnswerAnswer, "sqlite", ""), protocol.AnswererAgent, "sqlite"},
		{"JSON valid and invalid", `call ask {"question":"How many?","answerSchema":` + schema + `}`, "ask", false,
			[]attempt{
				refused(answer(protocol.AnswerAnswer, "", `{"n":"three"}`), protocol.CodeInvalidArgument, "/n: got string, want integer"),
				refused(answer(protocol.AnswerAnswer, "", `{"n":3`), protocol.CodeInvalidArgument, "not one JSON value"),
				refused(answer(protocol.AnswerAnswer, "three", ""), protocol.CodeInvalidArgument, "answer with json, not text"),
			},
			answer(protocol.AnswerAnswer, "", ` { "n" : 3 } `), protocol.AnswererUser, `{"n":3}`},
		{"JSON without a schema", `call ask {"question":"Anything?"}`, "ask", false, nil,
			answer(protocol.AnswerAnswer, "", `[1, "two"]`), protocol.AnswererUser, `[1,"two"]`},
		{"an approval refuses answer", `call write_file {"path":"x.txt","content":"hi"}`, "write_file", false,
			[]attempt{
				refused(answer(protocol.AnswerApprove, "yes", ""), protocol.CodeInvalidArgument, "text and json go with"),
				refused(answer(protocol.AnswerAnswer, "", ""), protocol.CodeInvalidArgument, "asks for approval"),
			},
			answer(protocol.AnswerApprove, "", ""), protocol.AnswererUser, "wrote 2 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			root, stranger := s.Root(t.TempDir()), s.Root()
			run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(tt.call + "\nsay done")})
			if err != nil {
				t.Fatal(err)
			}
			req := pendingRequest(t, s)
			if req.SessionID != run.ChildID {
				t.Fatalf("request %+v, want one of %s", req, run.ChildID)
			}
			auth := s.Grant()
			if tt.byParent {
				auth = root.Authority()
			}
			send := func(a attempt) (protocol.RequestRecord, error) {
				who := auth
				if a.stranger {
					who = stranger.Authority()
				}
				if a.verb == protocol.AnswerAnswer {
					return s.Client.AnswerQuestion(ctx, req.ID, who, a.text, a.json)
				}
				return s.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: req.ID, Authority: who, Answer: a.verb, Text: a.text, JSON: a.json})
			}
			for _, a := range tt.refusals {
				_, err := send(a)
				if protocol.CodeOf(err) != a.code || !strings.Contains(errText(err), a.says) {
					t.Fatalf("%s %q %q = %v, want %s naming %q", a.verb, a.text, a.json, err, a.code, a.says)
				}
				if got, err := s.Client.GetRequest(ctx, protocol.RequestGetRequest{RequestID: req.ID, Authority: s.Grant()}); err != nil || got.State != protocol.RequestPending {
					t.Fatalf("after a refused answer the request is %+v, %v; want pending", got, err)
				}
			}
			got, err := send(tt.good)
			if err != nil || got.Answer == nil || got.Answer.By.Kind != tt.by {
				t.Fatalf("answer = %+v, %v; want answered by %s", got, err, tt.by)
			}
			if _, err := send(tt.good); protocol.CodeOf(err) != protocol.CodeAlreadyAnswered {
				t.Fatalf("a second answer = %v, want ALREADY_ANSWERED", err)
			}
			res, err := run.Result(ctx)
			if err != nil || res.StopReason != protocol.StopCompleted {
				t.Fatalf("run: %+v, %v", res, err)
			}
			_, evs := s.Log(run.ChildID)
			trail, result := toolResult(evs, tt.tool)
			want := []string{protocol.EvToolCall, protocol.EvRequestOpen, protocol.EvRequestAnswer, protocol.EvToolResult}
			if strings.Join(trail, " ") != strings.Join(want, " ") {
				t.Fatalf("log trail %v, want %v", trail, want)
			}
			if text := protocol.PlainText(result.Content); result.IsError || !strings.Contains(text, tt.result) {
				t.Fatalf("%s result (error %v) %q, want %q", tt.tool, result.IsError, text, tt.result)
			}
			if tt.tool == "ask" && protocol.PlainText(result.Content) != tt.result {
				t.Fatalf("ask result %q, want exactly %q", protocol.PlainText(result.Content), tt.result)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestQuestionTimesOut (issue 33, item 2(b)): a question no one answers
// ends timed-out at its deadline, logged as a timeout (by: timeout); the
// ask call's result is an error saying no answer came, the turn goes on,
// and a late answer is ALREADY_ANSWERED.
func TestQuestionTimesOut(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.RequestTimeout = time.Second })
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, res, err := s.Run(s.Root().Ref(), "spawn", `call ask {"question":"Anyone there?","choices":["yes","no"]}`+"\nsay done", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %+v, %v", res, err)
	}
	_, evs := s.Log(run.ChildID)
	var ans protocol.RequestAnswerData
	for _, ev := range evs {
		if ev.Type == protocol.EvRequestAnswer {
			if err := ev.Decode(&ans); err != nil {
				t.Fatal(err)
			}
		}
	}
	trail, result := toolResult(evs, "ask")
	if strings.Join(trail, " ") != "tool/call request/open request/answer tool/result" {
		t.Fatalf("log trail %v", trail)
	}
	if ans.State != protocol.RequestTimedOut || ans.By.Kind != protocol.AnswererTimeout || ans.Text != "" {
		t.Fatalf("request/answer %+v, want timed-out by the timeout", ans)
	}
	if !result.IsError || !strings.Contains(protocol.PlainText(result.Content), "no answer came") {
		t.Fatalf("ask result (error %v) %q, want an error saying no answer came", result.IsError, protocol.PlainText(result.Content))
	}
	_, err = s.Client.AnswerQuestion(ctx, ans.RequestID, s.Grant(), "yes", "")
	if protocol.CodeOf(err) != protocol.CodeAlreadyAnswered || !strings.Contains(err.Error(), protocol.RequestTimedOut) {
		t.Fatalf("a late answer = %v, want ALREADY_ANSWERED naming timed-out", err)
	}
}
