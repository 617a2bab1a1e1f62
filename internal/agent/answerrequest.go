package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// RequestAnswerer answers a descendant's request (requests.answer,
// docs/protocol.md §5.21); *client.Client is the production one.
type RequestAnswerer interface {
	AnswerRequest(ctx context.Context, r protocol.RequestAnswerRequest) (protocol.RequestRecord, error)
}

// AnswerRequestTool is the answer_request tool of spawn and fork agents
// (issue 33, item 4): the agent answers a request of one of its
// descendants, which it learnt of from a subagent-request notice, with its
// own credential. The coordinator decides whether it may (an ancestor of
// the asking session may; anyone else is UNAUTHORIZED) and whether the
// answer fits (a second answer is ALREADY_ANSWERED, a wrong verb or answer
// INVALID_ARGUMENT); its errors are the call's error results. The decision
// pass_up answers nothing: the coordinator tells the next ancestor above
// the agent that takes requests, or leaves it to the user. Not answering
// leaves the request to the user and the other ancestors until its
// deadline.
func AnswerRequestTool(cl RequestAnswerer) *Tool {
	return &Tool{
		Name: protocol.ToolAnswerRequest,
		Description: "Answer a request of one of your subagents (or their descendants), named in a notice: " +
			`"approve" or "deny" (with a "reason" it sees) a tool call it asks approval for, or "answer" its question with "text" ` +
			`(one of its choices, when it has some) or "json" (when it asks for JSON). Only the first answer counts. ` +
			`Or "pass_up" a request you should not decide: the agent above you that takes requests is told of it, or the user when none does. ` +
			"Leave a request unanswered to let the user decide it.",
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"requestId":{"type":"string","description":"the request's id, from its notice"},` +
			`"decision":{"type":"string","enum":["approve","deny","answer","pass_up"],"description":"approve or deny an approval; answer a question; pass_up to leave it to the agent above you (or the user)"},` +
			`"reason":{"type":"string","description":"why, with deny: the subagent sees it"},` +
			`"text":{"type":"string","description":"the answer to a question, as text"},` +
			`"json":{"description":"the answer to a question that asks for JSON"}},` +
			`"required":["requestId","decision"],"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				RequestID string          `json:"requestId"`
				Decision  string          `json:"decision"`
				Reason    string          `json:"reason"`
				Text      string          `json:"text"`
				JSON      json.RawMessage `json:"json"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("%s: %v", protocol.ToolAnswerRequest, err)
			}
			if strings.TrimSpace(in.RequestID) == "" || in.Decision == "" {
				return ErrorResult("%s: requestId and decision are both required", protocol.ToolAnswerRequest)
			}
			jsonText := ""
			if len(in.JSON) > 0 {
				var c bytes.Buffer
				if err := json.Compact(&c, in.JSON); err != nil {
					return ErrorResult("%s: json: %v", protocol.ToolAnswerRequest, err)
				}
				jsonText = c.String()
			}
			caller := self(tc)
			rec, err := cl.AnswerRequest(ctx, protocol.RequestAnswerRequest{
				RequestID: in.RequestID, Authority: protocol.Authority{Parent: &caller},
				Answer: in.Decision, Reason: in.Reason, Text: in.Text, JSON: jsonText,
			})
			if err != nil {
				return ErrorResult("%s: the answer was not taken: %v", protocol.ToolAnswerRequest, err)
			}
			res := TextResult(answeredText(rec))
			res.Meta = map[string]string{"requestId": rec.ID, "sessionId": rec.SessionID, "state": rec.State}
			return res
		},
	}
}

// answeredText says, for the model, what its answer decided.
func answeredText(rec protocol.RequestRecord) string {
	switch rec.State {
	case protocol.RequestPending: // passed up
		on := "the user"
		if rec.Handler != "" {
			on = "agent " + rec.Handler
		}
		return fmt.Sprintf("request %s passed up: subagent %s's request now waits on %s", rec.ID, rec.SessionID, on)
	case protocol.RequestApproved:
		return fmt.Sprintf("request %s approved: subagent %s's %s call runs now", rec.ID, rec.SessionID, rec.Tool)
	case protocol.RequestDenied:
		return fmt.Sprintf("request %s denied: subagent %s's %s call does not run, and it is told why", rec.ID, rec.SessionID, rec.Tool)
	default:
		return fmt.Sprintf("request %s answered: subagent %s gets your answer to its question", rec.ID, rec.SessionID)
	}
}
