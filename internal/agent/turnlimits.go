package agent

import (
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Turn returns l's turn limits, defaults applied, as a provider descriptor
// shows a worker's settings (protocol.ProviderDescriptor.Limits;
// docs/protocol.md §9.1).
func (l Limits) Turn() protocol.TurnLimits {
	l = l.withDefaults()
	return protocol.TurnLimits{
		TurnTimeoutMs:       l.TurnTimeout.Milliseconds(),
		StepsPerTurnMax:     int64(l.StepsPerTurnMax),
		ToolCallsPerStepMax: int64(l.ToolCallsPerStepMax),
	}
}

// Within returns l, defaults applied, tightened by a session's turn limits
// (its header's, which the coordinator narrowed from its parent's, its
// worker's and its start's: docs/protocol.md §5.5): each limit t sets below
// l's replaces it; none is ever raised. nil t leaves l as it is.
func (l Limits) Within(t *protocol.TurnLimits) Limits {
	l = l.withDefaults()
	if t == nil {
		return l
	}
	if d := t.TurnTimeout(); d > 0 && d < l.TurnTimeout {
		l.TurnTimeout = d
	}
	if n := t.StepsPerTurnMax; n > 0 && n < int64(l.StepsPerTurnMax) {
		l.StepsPerTurnMax = int(n)
	}
	if n := t.ToolCallsPerStepMax; n > 0 && n < int64(l.ToolCallsPerStepMax) {
		l.ToolCallsPerStepMax = int(n)
	}
	return l
}

// defaultTurnTimeout is protocol.DefaultTurnTimeoutMs as a duration.
const defaultTurnTimeout = time.Duration(protocol.DefaultTurnTimeoutMs) * time.Millisecond
