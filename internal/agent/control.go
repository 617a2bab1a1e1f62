package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The model-facing control tools of continuable children (docs/design.md §8;
// docs/upstream-behaviour.md §5.13, §5.14). Each acts with the calling agent's own
// credential; failures are isError results, never a crash of the turn.

func self(tc ToolContext) protocol.ParentRef {
	return protocol.ParentRef{SessionID: tc.Header.ID, Credential: tc.Credential}
}

// BackgroundStarter returns the subagent tool's run_in_background handler:
// it starts a continuable child of the calling agent on provider and returns
// at once ("started subagent <id>"); a settlement notice arrives later.
func BackgroundStarter(cl *client.Client, provider string) func(ctx context.Context, tc ToolContext, description, prompt string, opts protocol.ContinuableOptions) ToolResult {
	return func(ctx context.Context, tc ToolContext, description, prompt string, opts protocol.ContinuableOptions) ToolResult {
		r, err := startContinuable(ctx, cl, protocol.ContinuableStartRequest{
			Provider: provider, Parent: self(tc), Label: description, Prompt: protocol.Text(prompt), Options: opts,
		})
		if err != nil {
			return ErrorResult("The background subagent could not be started: %v", err)
		}
		res := TextResult(backgroundStarted(r))
		res.Meta = map[string]string{"childId": r.ChildID, "messageId": r.MessageID}
		if r.State != "" {
			res.Meta["state"] = r.State
		}
		return res
	}
}

// backgroundStarted is the model's result of a background start: started,
// or (state queued) waiting in the caller's start queue because it is at
// its live-children limit, where send_message is refused until the child
// starts (docs/protocol.md §5.5, "The start queue").
func backgroundStarted(r protocol.ContinuableStartReply) string {
	if r.State == protocol.StateQueued {
		return fmt.Sprintf("queued subagent %s: you are at your limit of live subagents, so it starts in the background when one of them ends; "+
			"you will get a notice when it settles; send_message to it is refused until it started", r.ChildID)
	}
	return fmt.Sprintf("started subagent %s in the background; you will get a notice when it settles, and can message it with send_message", r.ChildID)
}

// SendMessageTool sends a message to one of the calling agent's continuable
// children: it becomes the child's next turn (it cannot redirect current
// work) and returns no answer.
func SendMessageTool(cl *client.Client) *Tool {
	return &Tool{
		Name: "send_message",
		Description: "Send a message to one of your background subagents. It becomes that subagent's next turn; " +
			"it cannot change work already in progress and returns no answer (you get a notice when the subagent settles).",
		Parameters: json.RawMessage(`{"type":"object","properties":{"subagent_id":{"type":"string","description":"the id of your subagent"},` +
			`"message":{"type":"string","description":"what to tell it"}},"required":["subagent_id","message"],"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				ID      string `json:"subagent_id"`
				Message string `json:"message"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("send_message: %v", err)
			}
			if strings.TrimSpace(in.ID) == "" || strings.TrimSpace(in.Message) == "" {
				return ErrorResult("send_message: subagent_id and message are both required")
			}
			parent := self(tc)
			r, err := followup(ctx, cl, protocol.FollowupRequest{
				ChildID: in.ID, Authority: protocol.Authority{Parent: &parent}, Message: protocol.Text(in.Message),
			})
			if err != nil {
				return ErrorResult("The message was not delivered: %v", err)
			}
			text := fmt.Sprintf("message queued as the next turn for subagent %s", in.ID)
			if r.Held != "" {
				text += "; it waits: " + r.Held
			}
			res := TextResult(text)
			res.Meta = map[string]string{"childId": in.ID, "messageId": r.MessageID}
			return res
		},
	}
}

// InterruptAgentTool stops the current turn of one of the calling agent's
// descendants; its queued messages stay parked until the next send.
func InterruptAgentTool(cl *client.Client) *Tool {
	return &Tool{
		Name:        "interrupt_agent",
		Description: "Stop the current turn of one of your background subagents (or their descendants). Its queued messages wait until you send it another.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"agent_id":{"type":"string"}},"required":["agent_id"],"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				ID string `json:"agent_id"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("interrupt_agent: %v", err)
			}
			if strings.TrimSpace(in.ID) == "" {
				return ErrorResult("interrupt_agent: agent_id is required")
			}
			caller := self(tc)
			if _, err := cl.Interrupt(ctx, protocol.InterruptRequest{ChildID: in.ID, Authority: protocol.Authority{Parent: &caller}}); err != nil {
				return ErrorResult("The interrupt was not accepted: %v", err)
			}
			return TextResult(`{"accepted":true}`)
		},
	}
}

// ListAgentsTool lists the calling agent's continuable children (or
// descendants) with their residency and label.
func ListAgentsTool(cl *client.Client) *Tool {
	return &Tool{
		Name:        "list_agents",
		Description: "List your background subagents: id, status (running: working or resident; ready: stored, resumable with send_message) and label.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"scope":{"type":"string","enum":["children","descendants"],` +
			`"description":"children (default) or every descendant"}},"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Scope string `json:"scope"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("list_agents: %v", err)
			}
			if in.Scope != "" && in.Scope != "children" && in.Scope != "descendants" {
				return ErrorResult("list_agents: scope must be children or descendants")
			}
			caller := self(tc)
			list, err := cl.Children(ctx, protocol.ChildrenListRequest{
				Parent: tc.Header.ID, Authority: protocol.Authority{Parent: &caller}, Descendants: in.Scope == "descendants",
			})
			if err != nil {
				return ErrorResult("list_agents failed: %v", err)
			}
			return TextResult(RenderAgentRows(list.Rows, in.Scope == "descendants"))
		},
	}
}

// RenderAgentRows renders listing rows as upstream's list_agents does: only
// continuable children and diagnostics.
func RenderAgentRows(rows []protocol.ChildRow, descendants bool) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Kind == protocol.RowChild && r.Mode != protocol.ModeContinuable {
			continue
		}
		if r.Kind == protocol.RowDiagnostic {
			fmt.Fprintf(&b, "%s [diagnostic: %s]", r.ID, r.Reason)
		} else {
			status := "ready"
			if r.Activity == protocol.ActivityRunning {
				status = "running"
			}
			fmt.Fprintf(&b, "%s [%s] — %s", r.ID, status, r.Label)
		}
		if descendants {
			fmt.Fprintf(&b, " parent=%s depth=%d", r.ParentID, r.Depth)
		}
		b.WriteString("\n")
	}
	if b.Len() == 0 {
		return "(no subagents)"
	}
	return strings.TrimRight(b.String(), "\n")
}

// ReportTool is the child-only report tool of continuable children: it sends
// findings to the live parent without ending the child's turn.
func ReportTool(cl *client.Client) *Tool {
	return &Tool{
		Name:        "report",
		Description: "Send a report to the agent that started you, without ending your turn. Send one self-contained final report when you are done, and earlier reports only for findings that change your parent's plan.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"output":{"type":"string","description":"the report"}},"required":["output"],"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Output string `json:"output"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("report: %v", err)
			}
			if strings.TrimSpace(in.Output) == "" {
				return ErrorResult("report: output is required")
			}
			if _, err := cl.Report(ctx, protocol.ReportRequest{Child: self(tc), Content: protocol.Text(in.Output)}); err != nil {
				return ErrorResult("The report was not delivered: %v", err)
			}
			return TextResult("report delivered to your parent")
		},
	}
}
