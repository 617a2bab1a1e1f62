package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// displayBytesMax bounds one event's text in the human log view; the cut is
// marked with the number of bytes not shown (`--json` shows everything).
const displayBytesMax = 300

func printHeader(w io.Writer, h protocol.SessionHeader) {
	fmt.Fprintf(w, "session %s  created %s\n", h.ID, time.UnixMilli(h.CreatedAt).UTC().Format(time.RFC3339Nano))
	if h.Cwd != "" {
		fmt.Fprintf(w, "  cwd %s\n", h.Cwd)
	}
	if h.ParentSession != "" {
		fmt.Fprintf(w, "  parentSession %s  delegationDepth %d  origin %s\n", h.ParentSession, h.DelegationDepth, h.Origin)
	} else {
		fmt.Fprintf(w, "  root (delegationDepth %d)\n", h.DelegationDepth)
	}
	if h.SeedLength > 0 {
		fmt.Fprintf(w, "  seedLength %d (events 0..%d were inherited from the parent)\n", h.SeedLength, h.SeedLength-1)
	}
	if h.DepthCap != nil {
		fmt.Fprintf(w, "  depthCap %d\n", *h.DepthCap)
	}
	if c := h.ToolCeiling; c != nil {
		fmt.Fprintf(w, "  toolCeiling allow=%s deny=%s\n", listOrAll(c.Allow), listOrNone(c.Deny))
	}
	fmt.Fprintln(w, "events:")
}

func listOrAll(l []string) string {
	if l == nil {
		return "(all)"
	}
	return "[" + strings.Join(l, ",") + "]"
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "[]"
	}
	return "[" + strings.Join(l, ",") + "]"
}

func clip(s string) string {
	s = strings.ReplaceAll(s, "\n", "⏎")
	if len(s) <= displayBytesMax {
		return s
	}
	cut := displayBytesMax
	for cut > 0 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return fmt.Sprintf("%s…(+%d bytes)", s[:cut], len(s)-cut)
}

// formatEvent renders one event on one line: its seq (marked s when it is
// part of an inherited seed), its type and what eventDetails says of it.
func formatEvent(ev protocol.SessionEvent, h protocol.SessionHeader) string {
	detail := ""
	if f := eventDetails[ev.Type]; f != nil {
		detail = f(ev)
	}
	marker := " "
	if h.SeedLength > 0 && ev.Seq < h.SeedLength {
		marker = "s"
	}
	return fmt.Sprintf("%s%5d  %-20s %s", marker, ev.Seq, ev.Type, detail)
}

// eventDetails renders the data of each event type the log view knows; an
// event of another type, or whose data does not decode, shows none.
var eventDetails = map[string]func(protocol.SessionEvent) string{
	protocol.EvTurnStart:          detail(func(d protocol.TurnData) string { return fmt.Sprintf("turn %d", d.Turn) }),
	protocol.EvTurnEnd:            detail(turnEndDetail),
	protocol.EvStepStart:          detail(stepDetail),
	protocol.EvStepEnd:            detail(stepDetail),
	protocol.EvUserMessage:        detail(userMessageDetail),
	protocol.EvAssistantMessage:   detail(assistantMessageDetail),
	protocol.EvToolCall:           detail(toolCallDetail),
	protocol.EvToolResult:         detail(toolResultDetail),
	protocol.EvInboxEnqueue:       detail(inboxEnqueueDetail),
	protocol.EvInboxDequeue:       detail(inboxDequeueDetail),
	protocol.EvInboxDiscard:       detail(inboxDiscardDetail),
	protocol.EvSubagentDescriptor: detail(descriptorDetail),
	protocol.EvACPSession:         detail(acpSessionDetail),
	protocol.EvACPPermission:      detail(acpPermissionDetail),
	protocol.EvACPLateUpdate:      detail(acpLateUpdateDetail),
	protocol.EvSessionEndSeed: func(protocol.SessionEvent) string {
		return "──── end of the inherited seed; the child's own events follow ────"
	},
	protocol.EvAgentTakeover: detail(func(d protocol.TakeoverData) string {
		return fmt.Sprintf("host %s lost; coordinator %s took the session over (epoch %d)", d.HostID, d.By, d.Epoch)
	}),
	protocol.EvModelRetry: detail(func(d protocol.ModelRetryData) string {
		return fmt.Sprintf("turn %d step %d: model attempt %d failed temporarily, retry in %s: %s",
			d.Turn, d.Step, d.Attempt, time.Duration(d.WaitMs)*time.Millisecond, d.Diagnostic)
	}),
	protocol.EvRequestOpen: detail(func(d protocol.RequestOpenData) string {
		switch d.Kind {
		case protocol.RequestQuestion:
			return fmt.Sprintf("%s ask waits for an answer: request %s", d.CallID, d.RequestID)
		case protocol.RequestBudget:
			return fmt.Sprintf("turn %d paused at its budget's cap before step %d, waits for a raise: request %s", d.Turn, d.Step, d.RequestID)
		}
		return fmt.Sprintf("%s %s waits for approval: request %s", d.CallID, d.Tool, d.RequestID)
	}),
	protocol.EvRequestAnswer: detail(func(d protocol.RequestAnswerData) string {
		var s string
		switch d.By.Kind {
		case protocol.AnswererTimeout:
			s = d.RequestID + " timed out: no answer came before its deadline"
		case protocol.AnswererEnded:
			s = d.RequestID + " cancelled: its asking turn ended first"
		default:
			s = fmt.Sprintf("%s %s by %s", d.RequestID, d.State, d.By.Kind)
			if d.By.SessionID != "" {
				s += " " + d.By.SessionID
			}
		}
		if d.Reason != "" {
			s += ": " + d.Reason
		}
		if a := d.Text + d.JSON; a != "" {
			s += ": " + clipLabel(a)
		}
		return s
	}),
}

// detail decodes an event's data as T and renders it with f ("" when it
// does not decode).
func detail[T any](f func(T) string) func(protocol.SessionEvent) string {
	return func(ev protocol.SessionEvent) string {
		var d T
		if ev.Decode(&d) != nil {
			return ""
		}
		return f(d)
	}
}

func turnEndDetail(d protocol.TurnEndData) string {
	s := fmt.Sprintf("turn %d %s", d.Turn, d.Reason.Kind)
	if d.Reason.Cause != "" {
		s += " (" + d.Reason.Cause + ")"
	}
	if d.Reason.Error != "" {
		s += ": " + clip(d.Reason.Error)
	}
	return s
}

func stepDetail(d protocol.StepData) string { return fmt.Sprintf("turn %d step %d", d.Turn, d.Step) }

func userMessageDetail(d protocol.UserMessageData) string {
	return fmt.Sprintf("[%s] %s", sourceLabel(d.Source), clip(protocol.AllText(d.Content)))
}

func assistantMessageDetail(d protocol.AssistantMessageData) string {
	s := clip(protocol.AllText(d.Message.Content))
	for _, c := range d.Message.ToolCalls {
		s += fmt.Sprintf(" →%s(%s)", c.Name, clip(c.Arguments))
	}
	if d.Interrupted {
		s += " [interrupted]"
	}
	return s
}

func toolCallDetail(d protocol.ToolCallData) string {
	s := fmt.Sprintf("%s %s %s", d.CallID, d.Name, clip(d.Arguments))
	if d.ModelCallID != "" {
		s += " [the model's id " + d.ModelCallID + "]"
	}
	return s
}

func toolResultDetail(d protocol.ToolResultData) string {
	status := "ok"
	if d.IsError {
		status = "error"
	}
	s := fmt.Sprintf("%s %s %s: %s", d.CallID, d.Name, status, clip(protocol.AllText(d.Content)))
	if id := d.Meta["childId"]; id != "" {
		s += " [child " + id + "]"
	}
	return s
}

func inboxEnqueueDetail(d protocol.InboxEnqueueData) string {
	return fmt.Sprintf("message %s inbox seq %s from %s", d.MessageID, d.InboxSeq, sourceLabel(d.Source))
}

func inboxDequeueDetail(d protocol.InboxDequeueData) string {
	return fmt.Sprintf("message %s inbox seq %s claimed by turn %d", d.MessageID, d.InboxSeq, d.Turn)
}

func inboxDiscardDetail(d protocol.InboxDiscardData) string {
	return fmt.Sprintf("message %s inbox seq %s discarded: %s", d.MessageID, d.InboxSeq, d.Reason)
}

func descriptorDetail(d protocol.DescriptorData) string {
	s := fmt.Sprintf("v%d %s provider %s", d.Version, d.Mode, d.Provider)
	if d.Label != "" {
		s += " label " + clip(d.Label)
	}
	return s
}

func acpSessionDetail(d protocol.ACPSessionData) string {
	s := fmt.Sprintf("ACP session %s of %q, loadSession %v", d.SessionID, d.Agent, d.LoadSession)
	if d.Loaded {
		s += " (loaded)"
	}
	return s
}

func acpPermissionDetail(d protocol.ACPPermissionData) string {
	answer := "denied"
	if d.Granted {
		answer = "granted"
	}
	s := fmt.Sprintf("%s %s: %s (%s", d.ToolCallID, clip(d.Title), answer, d.Outcome)
	if d.OptionID != "" {
		s += " " + d.OptionID + " " + d.OptionKind
	}
	s += "; " + d.Policy + ": " + d.Why + ")"
	if d.Late {
		s += fmt.Sprintf(" [late, turn %d]", d.Turn)
	}
	return s
}

func acpLateUpdateDetail(d protocol.ACPLateUpdateData) string {
	s := fmt.Sprintf("turn %d, after its end: %s", d.Turn, d.Kind)
	if d.Text != "" {
		s += " " + clip(d.Text)
	}
	if d.ToolCallID != "" {
		s += fmt.Sprintf(" %s %s %s", d.ToolCallID, clip(d.Title), d.Status)
	}
	return s
}

// sourceLabel names who a message came from: the user, or the session that
// sent it (a parent agent's prompt or followup, relayed by the coordinator;
// a child's report or settlement notice, a descendant's request).
func sourceLabel(src protocol.MessageSource) string {
	if src.SenderSessionID == "" {
		return src.Kind
	}
	switch src.Kind {
	case protocol.SourceCoordinator:
		return "parent " + src.SenderSessionID
	case protocol.SourceSubagentReport:
		return "report of " + src.SenderSessionID
	case protocol.SourceSubagentSettled:
		return "notice of " + src.SenderSessionID
	case protocol.SourceSubagentRequest:
		return "request of " + src.SenderSessionID
	}
	return src.Kind + " " + src.SenderSessionID
}
