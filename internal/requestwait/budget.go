package requestwait

import (
	"errors"
	"fmt"
	"math"

	"github.com/brood-dev/brood/pkg/protocol"
)

// A continuable child at its budget's cap pauses on a request of kind
// budget (docs/protocol.md §5.5, "Pause and raise"; §5.21): the built-in
// agents before a model request or a step's tool calls (internal/agent),
// an ACP child before its prompt (services/acp-bridge). Both decide, name,
// open and end the pause with the pieces below, so the request, its call
// id and the turn's end read the same whoever paused.

// PausesAtCap reports whether the refused reservation err pauses a
// continuable child's turn rather than ending it: BUDGET_EXHAUSTED on a
// limit a raise lifts (tokens, model requests, tool calls, children);
// never the budget's deadline (details.limit deadlineMs), which no raise
// moves back.
func PausesAtCap(err error) bool {
	if protocol.CodeOf(err) != protocol.CodeBudgetExhausted {
		return false
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		return false
	}
	limit, _ := pe.Details["limit"].(string)
	return limit != "" && limit != protocol.BudgetLimitDeadline
}

// BudgetRequest is the request a turn paused at its budget's cap opens
// before step step of turn turn (Self is the caller's to set): its call
// id is budget-t<turn>-s<step>-<n>, n counting the budget requests that
// step opened so far (opened) from 1; BudgetOf and Exhausted are the
// refusal's (its details.budget and its message, truncated to
// protocol.RequestReasonBytesMax bytes by TruncateDiagnostic), and
// BudgetRaises its details.raises: the ledger's raise count it saw.
func BudgetRequest(turn, step int64, opened int, refused error) protocol.RequestOpenRequest {
	req := protocol.RequestOpenRequest{Kind: protocol.RequestBudget, Turn: turn, Step: step,
		CallID: fmt.Sprintf("budget-t%d-s%d-%d", turn, step, opened+1)}
	var pe *protocol.Error
	if errors.As(refused, &pe) {
		req.BudgetOf, _ = pe.Details["budget"].(string)
		req.Exhausted = protocol.TruncateDiagnostic(pe.Message)
		if n, ok := detailCount(pe.Details["raises"]); ok && req.BudgetOf != "" {
			// A raise between the refusal and the request's opening
			// answers it at once (docs/protocol.md §5.5).
			req.BudgetRaises = &n
		}
	}
	return req
}

// detailCount reads an error detail that is a count, as the wire decoded
// it (a JSON number is a float64, a MessagePack one any integer type).
func detailCount(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, n >= 0
	case int:
		return int64(n), n >= 0
	case int8:
		return int64(n), n >= 0
	case int16:
		return int64(n), n >= 0
	case int32:
		return int64(n), n >= 0
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		return int64(n), n <= math.MaxInt64
	case float64:
		return int64(n), n >= 0 && n <= protocol.BudgetValueMax && n == math.Trunc(n)
	}
	return 0, false
}

// BudgetRequests counts the request/open events of kind budget for step
// step of turn turn in events' last turn (the next pause's call id
// follows them: BudgetRequest's opened).
func BudgetRequests(events []protocol.SessionEvent, turn, step int64) int {
	n := 0
	for i := len(events) - 1; i >= 0; i-- {
		ev := events[i]
		if ev.Type == protocol.EvTurnStart {
			break
		}
		var d protocol.RequestOpenData
		if ev.Type == protocol.EvRequestOpen && ev.Decode(&d) == nil && d.Kind == protocol.RequestBudget && d.Turn == turn && d.Step == step {
			n++
		}
	}
	return n
}

// BudgetPauseEnd says how a pause whose request id was answered d ends:
// raised (approved: the turn reserves again), else the BUDGET_EXHAUSTED
// turn end's diagnostic, after exhausted (the refusal's text): no raise
// came in time (timed-out), or the pause was denied or cancelled, by
// whom and why.
func BudgetPauseEnd(exhausted, id string, d protocol.RequestAnswerData) (raised bool, diag string) {
	switch d.State {
	case protocol.RequestApproved:
		return true, ""
	case protocol.RequestTimedOut:
		return false, fmt.Sprintf("%s; the turn paused for a raise (request %s) and none came in time", exhausted, id)
	default:
		reason := ""
		if d.Reason != "" {
			reason = ": " + d.Reason
		}
		return false, fmt.Sprintf("%s; the pause for a raise (request %s) ended %s by %s%s", exhausted, id, d.State, AnswererName(d.By), reason)
	}
}

// BudgetPauseFailed is the BUDGET_EXHAUSTED turn end's diagnostic of a
// turn that could not pause for a raise on request id (not opened, not
// logged, not read: err).
func BudgetPauseFailed(exhausted, id string, err error) string {
	return fmt.Sprintf("%s; the turn could not pause for a raise (request %s: %v)", exhausted, id, err)
}
