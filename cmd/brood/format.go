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

// formatEvent renders one event on one line.
func formatEvent(ev protocol.SessionEvent, h protocol.SessionHeader) string {
	detail := ""
	switch ev.Type {
	case protocol.EvTurnStart:
		var d protocol.TurnData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("turn %d", d.Turn)
		}
	case protocol.EvTurnEnd:
		var d protocol.TurnEndData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("turn %d %s", d.Turn, d.Reason.Kind)
			if d.Reason.Cause != "" {
				detail += " (" + d.Reason.Cause + ")"
			}
			if d.Reason.Error != "" {
				detail += ": " + clip(d.Reason.Error)
			}
		}
	case protocol.EvStepStart, protocol.EvStepEnd:
		var d protocol.StepData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("turn %d step %d", d.Turn, d.Step)
		}
	case protocol.EvUserMessage:
		var d protocol.UserMessageData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("[%s] %s", sourceLabel(d.Source), clip(protocol.AllText(d.Content)))
		}
	case protocol.EvAssistantMessage:
		var d protocol.AssistantMessageData
		if ev.Decode(&d) == nil {
			detail = clip(protocol.AllText(d.Message.Content))
			for _, c := range d.Message.ToolCalls {
				detail += fmt.Sprintf(" →%s(%s)", c.Name, clip(c.Arguments))
			}
			if d.Interrupted {
				detail += " [interrupted]"
			}
		}
	case protocol.EvToolCall:
		var d protocol.ToolCallData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("%s %s %s", d.CallID, d.Name, clip(d.Arguments))
			if d.ModelCallID != "" {
				detail += " [the model's id " + d.ModelCallID + "]"
			}
		}
	case protocol.EvToolResult:
		var d protocol.ToolResultData
		if ev.Decode(&d) == nil {
			status := "ok"
			if d.IsError {
				status = "error"
			}
			detail = fmt.Sprintf("%s %s %s: %s", d.CallID, d.Name, status, clip(protocol.AllText(d.Content)))
			if id := d.Meta["childId"]; id != "" {
				detail += " [child " + id + "]"
			}
		}
	case protocol.EvInboxEnqueue:
		var d protocol.InboxEnqueueData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("message %s inbox seq %s from %s", d.MessageID, d.InboxSeq, sourceLabel(d.Source))
		}
	case protocol.EvInboxDequeue:
		var d protocol.InboxDequeueData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("message %s inbox seq %s claimed by turn %d", d.MessageID, d.InboxSeq, d.Turn)
		}
	case protocol.EvInboxDiscard:
		var d protocol.InboxDiscardData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("message %s inbox seq %s discarded: %s", d.MessageID, d.InboxSeq, d.Reason)
		}
	case protocol.EvSubagentDescriptor:
		var d protocol.DescriptorData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("v%d %s provider %s", d.Version, d.Mode, d.Provider)
			if d.Label != "" {
				detail += " label " + clip(d.Label)
			}
		}
	case protocol.EvACPSession:
		var d protocol.ACPSessionData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("ACP session %s of %q, loadSession %v", d.SessionID, d.Agent, d.LoadSession)
			if d.Loaded {
				detail += " (loaded)"
			}
		}
	case protocol.EvACPPermission:
		var d protocol.ACPPermissionData
		if ev.Decode(&d) == nil {
			answer := "denied"
			if d.Granted {
				answer = "granted"
			}
			detail = fmt.Sprintf("%s %s: %s (%s", d.ToolCallID, clip(d.Title), answer, d.Outcome)
			if d.OptionID != "" {
				detail += " " + d.OptionID + " " + d.OptionKind
			}
			detail += "; " + d.Policy + ": " + d.Why + ")"
			if d.Late {
				detail += fmt.Sprintf(" [late, turn %d]", d.Turn)
			}
		}
	case protocol.EvACPLateUpdate:
		var d protocol.ACPLateUpdateData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("turn %d, after its end: %s", d.Turn, d.Kind)
			if d.Text != "" {
				detail += " " + clip(d.Text)
			}
			if d.ToolCallID != "" {
				detail += fmt.Sprintf(" %s %s %s", d.ToolCallID, clip(d.Title), d.Status)
			}
		}
	case protocol.EvSessionEndSeed:
		detail = "──── end of the inherited seed; the child's own events follow ────"
	case protocol.EvAgentTakeover:
		var d protocol.TakeoverData
		if ev.Decode(&d) == nil {
			detail = fmt.Sprintf("host %s lost; coordinator %s took the session over (epoch %d)", d.HostID, d.By, d.Epoch)
		}
	}
	marker := " "
	if h.SeedLength > 0 && ev.Seq < h.SeedLength {
		marker = "s"
	}
	return fmt.Sprintf("%s%5d  %-20s %s", marker, ev.Seq, ev.Type, detail)
}

// sourceLabel names who a message came from: the user, or the session that
// sent it (a parent agent's prompt or followup, relayed by the coordinator;
// a child's report or settlement notice).
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
	}
	return src.Kind + " " + src.SenderSessionID
}
