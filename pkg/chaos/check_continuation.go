package chaos

import (
	"fmt"
	"sort"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// interruptedPrefix is how the result a continued turn gives a call its
// dead host left without a result begins, after the tool's name
// (agent.InterruptedByHostLoss; docs/protocol.md §8.4).
const interruptedPrefix = " was interrupted: its host stopped (" + protocol.CauseHostLost + ")"

// stepKey names one step of one turn of a log.
type stepKey struct{ turn, step int64 }

// checkContinuation: I12, a turn continued after a host loss
// (docs/protocol.md §8.4, "Continued after a host loss") redoes nothing
// its log holds. In each log (a fork child's own events, after its seed):
// every step of a turn is recorded once, one step/start and one model
// result (assistant/message) per turn and step; every tool/result answers
// a tool/call logged before it, and answers it once. A run continued by
// two instances at once (a takeover that asks two, or a continue that
// takes the lease without its compare-and-set) logs the step that was in
// flight twice. That every accepted run settles once, continued or not,
// is I2's (one result, one subagent/end) and I6's (no record stays
// running). The summary counts the runs continued, their takeovers and
// the calls a continued turn reported interrupted.
func (c *checker) checkContinuation() {
	ids := make([]string, 0, len(c.sessions))
	for id := range c.sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := c.sessions[id]
		starts, results := map[stepKey]int{}, map[stepKey]int{}
		calls := map[string]bool{} // callId -> answered
		for _, ev := range s.events {
			switch ev.Type {
			case protocol.EvSessionEndSeed:
				// The seed is the fork parent's history, judged in its own log.
				starts, results, calls = map[stepKey]int{}, map[stepKey]int{}, map[string]bool{}
			case protocol.EvStepStart:
				var d protocol.StepData
				if ev.Decode(&d) != nil {
					continue
				}
				k := stepKey{d.Turn, d.Step}
				c.checked("I12", ev.Time)
				if starts[k]++; starts[k] == 2 {
					c.fail("I12", ev.Time, "%s: turn %d step %d has two step/start records (the second at seq %d, %s): a step recorded twice",
						id, d.Turn, d.Step, ev.Seq, c.at(ev.Time))
				}
			case protocol.EvAssistantMessage:
				var d protocol.AssistantMessageData
				if ev.Decode(&d) != nil {
					continue
				}
				k := stepKey{d.Turn, d.Step}
				if results[k]++; results[k] == 2 {
					c.fail("I12", ev.Time, "%s: turn %d step %d has two model results (the second at seq %d, %s): a model request answered twice",
						id, d.Turn, d.Step, ev.Seq, c.at(ev.Time))
				}
			case protocol.EvToolCall:
				var d protocol.ToolCallData
				if ev.Decode(&d) == nil {
					calls[d.CallID] = false
				}
			case protocol.EvToolResult:
				var d protocol.ToolResultData
				if ev.Decode(&d) != nil {
					continue
				}
				c.checked("I12", ev.Time)
				answered, called := calls[d.CallID]
				switch {
				case !called:
					c.fail("I12", ev.Time, "%s: tool/result of %s %s at seq %d (%s) without its call", id, d.Name, d.CallID, ev.Seq, c.at(ev.Time))
				case answered:
					c.fail("I12", ev.Time, "%s: %s %s answered twice (the second at seq %d, %s)", id, d.Name, d.CallID, ev.Seq, c.at(ev.Time))
				}
				calls[d.CallID] = true
				if d.IsError && strings.HasPrefix(protocol.PlainText(d.Content), d.Name+interruptedPrefix) {
					c.sum.CallsInterrupted++
				}
			}
		}
	}
	for _, r := range c.snap.Runs {
		if r.Mode != protocol.ModeOneShot || r.Takeovers == 0 {
			continue
		}
		c.sum.Takeovers += int(r.Takeovers)
		switch {
		case r.State != protocol.RunSettled || r.Result == nil:
		case r.Result.ErrorCode == protocol.CodeHostLost:
			c.sum.ContinuedHostLost++
		default:
			c.sum.Continued++
		}
	}
}

// continuationLine is the report's line on continuations (I12).
func (s Summary) continuationLine() string {
	return fmt.Sprintf("continuations: %d one-shot runs continued on another worker after a host loss and settled there, %d ended HOST_LOST after a takeover; %d takeovers; %d tool calls reported interrupted by a host loss",
		s.Continued, s.ContinuedHostLost, s.Takeovers, s.CallsInterrupted)
}
