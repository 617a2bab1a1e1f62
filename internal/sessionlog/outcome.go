// Package sessionlog is the reading of a session log: pure folds over its
// events, with no I/O, that every party which must agree on what a log says
// uses the same way. A run's result (the output selection rule and the stop
// reasons, docs/upstream-behaviour.md §3.8–§3.9: OneShotOutcome, EpochOutcome,
// TurnResult), the open turn and how to close it (OpenTurn, CloseOpenTurn),
// the descriptor that rebuilds a continuable child (Descriptor), the inbox
// items a log has seen and claimed (InboxCursor), the balanced
// completed-turn prefix a fork seeds from (CompletedPrefix) and the
// invariants of a replayable log (ValidateReplay).
//
// Hosts settle from these folds and coordinators settle from the same folds
// on HOST_LOST, so a result never depends on who settled it; the chaos
// checker (pkg/chaos) and the CLI read logs with them too. A fold of a
// child's result is always taken over its own events: after its seed
// (Own), or after its epoch's first event.
package sessionlog

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// SelectOutput returns the content of the last assistant message with
// non-empty content; empty (usage-only or tool-call-only) messages are
// skipped. Text blocks are the content; tool calls are not output. The
// result is never nil.
func SelectOutput(events []protocol.SessionEvent) []protocol.ContentBlock {
	out, _ := SelectOutputFrom(events)
	return out
}

// SelectOutputFrom is SelectOutput plus the message the output came from
// (nil when there is no output): its seq, turn and step, and whether it is
// the last assistant message in events (false when a later one was empty).
func SelectOutputFrom(events []protocol.SessionEvent) ([]protocol.ContentBlock, *protocol.OutputSource) {
	last := true
	for i := len(events) - 1; i >= 0; i-- {
		ev := events[i]
		if ev.Type != protocol.EvAssistantMessage {
			continue
		}
		var d protocol.AssistantMessageData
		if ev.Decode(&d) != nil {
			last = false
			continue
		}
		if hasText(d.Message.Content) {
			return d.Message.Content, &protocol.OutputSource{Seq: ev.Seq, Turn: d.Turn, Step: d.Step, Last: last}
		}
		last = false
	}
	return []protocol.ContentBlock{}, nil
}

// CountPermissions counts the acp/permission events in events (nil when
// there are none).
func CountPermissions(events []protocol.SessionEvent) *protocol.PermissionCounts {
	var c protocol.PermissionCounts
	for _, ev := range events {
		var d protocol.ACPPermissionData
		if ev.Type != protocol.EvACPPermission || ev.Decode(&d) != nil {
			continue
		}
		c.Requested++
		if d.Granted {
			c.Granted++
		} else {
			c.Denied++
		}
	}
	if c.Requested == 0 {
		return nil
	}
	return &c
}

func hasText(blocks []protocol.ContentBlock) bool {
	for _, b := range blocks {
		if b.Text != "" {
			return true
		}
	}
	return false
}

// LastTurnEnd returns the data of the last turn/end in events.
func LastTurnEnd(events []protocol.SessionEvent) (protocol.TurnEndData, bool) {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type == protocol.EvTurnEnd {
			var d protocol.TurnEndData
			if events[i].Decode(&d) == nil {
				return d, true
			}
		}
	}
	return protocol.TurnEndData{}, false
}

// StopReasonOf maps a turn-end kind to a run stop reason (docs/upstream-behaviour.md
// §3.9, one-shot): blocked is refusal; error, interrupted, none and unknown
// are error.
func StopReasonOf(kind string) protocol.StopReason {
	switch kind {
	case protocol.TurnCompleted:
		return protocol.StopCompleted
	case protocol.TurnMaxTokens:
		return protocol.StopMaxTokens
	case protocol.TurnAborted:
		return protocol.StopAborted
	case protocol.TurnBlocked:
		return protocol.StopRefusal
	default:
		return protocol.StopError
	}
}

// OneShotOutcome derives a one-shot run's result from the child's own events
// (docs/upstream-behaviour.md §3.8–§3.9): the stop reason of the last turn; aborted
// whenever the owner cancelled and the turn did not complete; a requested
// structured output that was not captured turns completed into error. The
// diagnostic is the turn's error text.
func OneShotOutcome(events []protocol.SessionEvent, ownerCancelled, structuredRequested bool) protocol.SubagentResult {
	usage := Usage(events)
	res := protocol.SubagentResult{StopReason: protocol.StopError, Permissions: CountPermissions(events), Usage: &usage}
	res.Output, res.OutputFrom = SelectOutputFrom(events)
	end, ok := LastTurnEnd(events)
	if ok {
		res.StopReason = StopReasonOf(end.Reason.Kind)
		if end.Reason.Error != "" {
			res.Diagnostic = protocol.TruncateDiagnostic(end.Reason.Error)
		}
		if res.StopReason == protocol.StopError {
			res.ErrorCode = end.Reason.Code
		}
	} else {
		res.Diagnostic = "the child never finished a turn"
	}
	if ownerCancelled && res.StopReason != protocol.StopCompleted {
		res.StopReason, res.ErrorCode = protocol.StopAborted, ""
	}
	if structuredRequested {
		s, captured := CapturedStructured(events)
		switch {
		case captured:
			res.Structured = s
		case res.StopReason == protocol.StopCompleted:
			res.StopReason, res.ErrorCode = protocol.StopError, protocol.CodeTaskFailed
			res.Diagnostic = protocol.TruncateDiagnostic("the child finished without a valid structured_output capture: " + structuredRefusal(events))
		}
	}
	return res
}

// structuredRefusal says why no structured output was captured: the
// validator's messages on the last refused structured_output call (each
// "<field path>: <reason>"), or that the child never made one.
func structuredRefusal(events []protocol.SessionEvent) string {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type != protocol.EvToolResult {
			continue
		}
		var d protocol.ToolResultData
		if events[i].Decode(&d) != nil || d.Name != protocol.ToolStructuredOutput || !d.IsError {
			continue
		}
		text := strings.TrimPrefix(protocol.AllText(d.Content), "INVALID_ARGS: ")
		text, _, _ = strings.Cut(text, "; fix the value and call structured_output again")
		return "its last structured_output value was refused: " + text
	}
	return "it never called structured_output with a value"
}

// CapturedStructured returns the last successful structured_output capture in
// events, decoded from its raw JSON arguments.
func CapturedStructured(events []protocol.SessionEvent) (any, bool) {
	calls := map[string]string{}
	var out any
	found := false
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if ev.Decode(&d) == nil && d.Name == protocol.ToolStructuredOutput {
				calls[d.CallID] = d.Arguments
			}
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) != nil || d.Name != protocol.ToolStructuredOutput || d.IsError {
				continue
			}
			args, ok := calls[d.CallID]
			if !ok {
				continue
			}
			v, err := DecodeJSONValue(args)
			if err == nil {
				out, found = v, true
			}
		}
	}
	return out, found
}

// OpenTurn reports the turn left open at the end of events (a turn/start with
// no turn/end) and the tool calls of that turn that have no result yet.
func OpenTurn(events []protocol.SessionEvent) (turn int64, open bool, step int64, stepOpen bool, pending []protocol.ToolCallData) {
	results := map[string]bool{}
	var calls []protocol.ToolCallData
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvTurnStart:
			var d protocol.TurnData
			_ = ev.Decode(&d)
			turn, open, stepOpen, calls, results = d.Turn, true, false, nil, map[string]bool{}
		case protocol.EvTurnEnd:
			open, stepOpen = false, false
		case protocol.EvStepStart:
			var d protocol.StepData
			_ = ev.Decode(&d)
			step, stepOpen = d.Step, true
		case protocol.EvStepEnd:
			stepOpen = false
		case protocol.EvToolCall:
			var d protocol.ToolCallData
			if ev.Decode(&d) == nil {
				calls = append(calls, d)
			}
		case protocol.EvToolResult:
			var d protocol.ToolResultData
			if ev.Decode(&d) == nil {
				results[d.CallID] = true
			}
		}
	}
	if open {
		for _, c := range calls {
			if !results[c.CallID] {
				pending = append(pending, c)
			}
		}
	}
	return turn, open, step, stepOpen, pending
}

// LastTurn returns the number of the last turn started in events (0 if none).
func LastTurn(events []protocol.SessionEvent) int64 {
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type == protocol.EvTurnStart {
			var d protocol.TurnData
			if events[i].Decode(&d) == nil {
				return d.Turn
			}
		}
	}
	return 0
}

// CloseOpenTurn returns the events that close a turn left open (a host died
// mid-turn): an error result for every pending tool call, step/end for an
// open step, and turn/end with reason (docs/design.md §7, HOST_LOST), so the log
// stays balanced for replay and fork.
func CloseOpenTurn(events []protocol.SessionEvent, reason protocol.TurnEndReason, nowMs int64) ([]protocol.SessionEvent, error) {
	turn, open, step, stepOpen, pending := OpenTurn(events)
	if !open {
		return nil, nil
	}
	return CloseTurn(turn, step, stepOpen, pending, reason, nowMs)
}

// CloseTurn returns the events that close open turn turn, given what
// OpenTurn reports of it: an error result for each of pending, step/end of
// step when stepOpen, and turn/end with reason (CloseOpenTurn; agent.Index
// keeps OpenTurn's answer as events are added).
func CloseTurn(turn, step int64, stepOpen bool, pending []protocol.ToolCallData, reason protocol.TurnEndReason, nowMs int64) ([]protocol.SessionEvent, error) {
	var out []protocol.SessionEvent
	add := func(typ string, data any) error {
		ev, err := protocol.NewEvent(typ, nowMs, data)
		if err != nil {
			return err
		}
		out = append(out, ev)
		return nil
	}
	for _, c := range pending {
		if err := add(protocol.EvToolResult, protocol.ToolResultData{
			Turn: c.Turn, Step: c.Step, CallID: c.CallID, Name: c.Name,
			Content: protocol.Text("the tool call was interrupted: " + reason.Kind), IsError: true,
		}); err != nil {
			return nil, err
		}
	}
	if stepOpen {
		if err := add(protocol.EvStepEnd, protocol.StepData{Turn: turn, Step: step}); err != nil {
			return nil, err
		}
	}
	if err := add(protocol.EvTurnEnd, protocol.TurnEndData{Turn: turn, Reason: reason}); err != nil {
		return nil, err
	}
	return out, nil
}

// EpochOutcome derives a continuable epoch's result from the epoch's own
// events (docs/upstream-behaviour.md §3.9, the consumed-work fold): a turn accounts
// for work if it entered a step, or claimed inbox input and then ended
// blocked, aborted, interrupted or error; the latest such turn decides, and
// accepted work discarded unrun after it makes a clean end `aborted`. A
// recorded failure beats a later cancellation. Output is the epoch's own
// (never a previous epoch's or a fork parent's).
func EpochOutcome(events []protocol.SessionEvent) protocol.SubagentResult {
	usage := Usage(events)
	res := protocol.SubagentResult{StopReason: protocol.StopCompleted, Permissions: CountPermissions(events), Usage: &usage}
	res.Output, res.OutputFrom = SelectOutputFrom(events)
	var (
		inTurn, stepped, claimed bool
		last                     = ""
		lastErr                  = ""
		lastCode                 protocol.Code
		dropped                  bool
	)
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvTurnStart:
			inTurn, stepped, claimed = true, false, false
		case protocol.EvStepStart:
			stepped = true
		case protocol.EvInboxDequeue:
			if inTurn {
				claimed = true
			}
		case protocol.EvInboxDiscard:
			dropped = true
		case protocol.EvTurnEnd:
			var d protocol.TurnEndData
			if ev.Decode(&d) != nil {
				continue
			}
			failed := d.Reason.Kind == protocol.TurnBlocked || d.Reason.Kind == protocol.TurnAborted ||
				d.Reason.Kind == protocol.TurnInterrupted || d.Reason.Kind == protocol.TurnError
			if stepped || (claimed && failed) {
				last, lastErr, lastCode, dropped = d.Reason.Kind, d.Reason.Error, d.Reason.Code, false
			}
			inTurn = false
		}
	}
	switch last {
	case protocol.TurnMaxTokens:
		res.StopReason = protocol.StopMaxTokens
	case protocol.TurnAborted, protocol.TurnInterrupted:
		res.StopReason = protocol.StopAborted
	case protocol.TurnError:
		res.StopReason, res.ErrorCode = protocol.StopError, lastCode
		res.Diagnostic = protocol.TruncateDiagnostic(lastErr)
	case protocol.TurnBlocked:
		res.StopReason = protocol.StopRefusal
	case "", protocol.TurnCompleted:
		if dropped {
			res.StopReason = protocol.StopAborted
		}
	default:
		res.StopReason = protocol.StopError
	}
	return res
}

// TurnResult is what one finished turn answered (sessions.result, `brood
// followup --wait`): turn holds its events from turn/start to turn/end. The
// stop reason and output follow the one-shot rules (StopReasonOf,
// SelectOutput); a cause stands in for a missing diagnostic.
func TurnResult(sessionID string, turn []protocol.SessionEvent) (protocol.SessionResultReply, error) {
	reply := protocol.SessionResultReply{SessionID: sessionID, Output: []protocol.ContentBlock{}}
	if len(turn) == 0 || turn[len(turn)-1].Type != protocol.EvTurnEnd {
		return reply, nil
	}
	last := turn[len(turn)-1]
	var d protocol.TurnEndData
	if err := last.Decode(&d); err != nil {
		return reply, protocol.Errorf(protocol.CodeInternal, "turn/end of %s does not decode: %w", sessionID, err)
	}
	usage := Usage(turn)
	reply.Finished, reply.Turn, reply.EndedAt, reply.Usage = true, d.Turn, last.Time, &usage
	reply.StopReason = StopReasonOf(d.Reason.Kind)
	if reply.StopReason == protocol.StopError {
		reply.ErrorCode = d.Reason.Code
	}
	reply.Output = SelectOutput(turn)
	reply.Diagnostic = d.Reason.Error
	if reply.Diagnostic == "" && d.Reason.Cause != "" {
		reply.Diagnostic = "cause " + d.Reason.Cause
	}
	if v, ok := CapturedStructured(turn); ok {
		reply.Structured = v
	}
	return reply, nil
}

// DecodeJSONValue decodes JSON text into a plain value whose integers keep
// their exact values (int64/uint64) instead of becoming float64.
func DecodeJSONValue(text string) (any, error) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return protocol.NormalizeNumbers(v), nil
}

// EarlierOutputNote says, for a parent, that an output is not the child's
// last message (its last one was empty), or "" when it is (issue 14).
func EarlierOutputNote(from *protocol.OutputSource) string {
	if from == nil || from.Last {
		return ""
	}
	return fmt.Sprintf("(Note: this is the subagent's message from turn %d, step %d; its last message was empty, so this may not be its final answer.)", from.Turn, from.Step)
}

// SettledNotice is the one-line account and the content of the notice a
// parent gets when a continuable child's epoch settled with res
// (docs/upstream-behaviour.md §5.10): the account by stop reason and error code,
// then the child's closing message, if any, with EarlierOutputNote.
func SettledNotice(childID string, res protocol.SubagentResult) (string, []protocol.ContentBlock) {
	var line string
	switch res.StopReason {
	case protocol.StopCompleted:
		line = fmt.Sprintf("Subagent %s is done and idle until you send it more.", childID)
	case protocol.StopAborted:
		line = fmt.Sprintf("Subagent %s stopped before finishing.", childID)
	case protocol.StopMaxTokens:
		line = fmt.Sprintf("Subagent %s ran out of room before finishing.", childID)
	case protocol.StopRefusal:
		line = fmt.Sprintf("Subagent %s declined its task.", childID)
	case protocol.StopError:
		line = fmt.Sprintf("Subagent %s failed.", childID)
	default:
		line = fmt.Sprintf("Subagent %s ended abnormally (%s).", childID, res.StopReason)
	}
	if res.ErrorCode != "" {
		line += " (" + string(res.ErrorCode) + ")"
	}
	text := protocol.PlainText(res.Output)
	body := line + "\nNo closing message."
	if text != "" {
		body = line + "\nClosing message:\n" + text
		if note := EarlierOutputNote(res.OutputFrom); note != "" {
			body += "\n" + note
		}
	}
	return line, protocol.Text(body)
}
