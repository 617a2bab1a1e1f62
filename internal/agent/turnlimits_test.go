package agent

import (
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestLimitsWithin: a session's header limits tighten the worker's, never
// raise them (docs/protocol.md §5.5, "Model and turn limits").
func TestLimitsWithin(t *testing.T) {
	worker := Limits{TurnTimeout: time.Minute, StepsPerTurnMax: 10, ToolCallsPerStepMax: 4}
	for _, tc := range []struct {
		name   string
		header *protocol.TurnLimits
		want   Limits
	}{
		{"no header limits", nil, worker},
		{"lower", &protocol.TurnLimits{TurnTimeoutMs: 500, StepsPerTurnMax: 2, ToolCallsPerStepMax: 1},
			Limits{TurnTimeout: 500 * time.Millisecond, StepsPerTurnMax: 2, ToolCallsPerStepMax: 1}},
		{"higher is not taken", &protocol.TurnLimits{TurnTimeoutMs: 3_600_000, StepsPerTurnMax: 64, ToolCallsPerStepMax: 32}, worker},
		{"one field", &protocol.TurnLimits{StepsPerTurnMax: 3}, Limits{TurnTimeout: time.Minute, StepsPerTurnMax: 3, ToolCallsPerStepMax: 4}},
	} {
		got := worker.Within(tc.header)
		// defaults, not turn limits
		got.ToolOutputBytesMax, got.AppendTimeout = 0, 0
		got.ModelRetryBackoff, got.ModelRetryBackoffMax, got.ModelRetryAfterMax = 0, 0, 0
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := (Limits{}).Turn(); got != protocol.DefaultTurnLimits() {
		t.Errorf("the default limits as a descriptor shows them: %+v, want %+v", got, protocol.DefaultTurnLimits())
	}
}
