package sessionlog

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

func seqd(t *testing.T, specs ...any) []protocol.SessionEvent {
	t.Helper()
	var out []protocol.SessionEvent
	for i := 0; i < len(specs); i += 2 {
		ev, err := protocol.NewEvent(specs[i].(string), 0, specs[i+1])
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = int64(len(out))
		out = append(out, ev)
	}
	return out
}

func TestCompletedPrefixAndReplayInvariants(t *testing.T) {
	ts := func(n int64) any { return protocol.TurnData{Turn: n} }
	te := func(n int64) any {
		return protocol.TurnEndData{Turn: n, Reason: protocol.TurnEndReason{Kind: "completed"}}
	}
	st := protocol.StepData{Turn: 1, Step: 1}
	call := protocol.ToolCallData{CallID: "c"}
	res := protocol.ToolResultData{CallID: "c"}
	tests := []struct {
		name    string
		evs     []protocol.SessionEvent
		prefix  int
		wantErr bool
		open    bool
	}{
		{"empty", nil, 0, false, false},
		{"one turn", seqd(t, "turn/start", ts(1), "turn/end", te(1)), 2, false, false},
		{"in flight after a completed turn", seqd(t, "turn/start", ts(1), "turn/end", te(1), "turn/start", ts(2), "step/start", st, "tool/call", call), 2, false, true},
		{"open turn not allowed", seqd(t, "turn/start", ts(1)), 0, true, false},
		{"unanswered call", seqd(t, "turn/start", ts(1), "step/start", st, "tool/call", call, "step/end", st, "turn/end", te(1)), 5, true, false},
		{"answered call", seqd(t, "turn/start", ts(1), "step/start", st, "tool/call", call, "tool/result", res, "step/end", st, "turn/end", te(1)), 6, false, false},
		{"result without call", seqd(t, "turn/start", ts(1), "step/start", st, "tool/result", res, "step/end", st, "turn/end", te(1)), 5, true, false},
		{"nested turns", seqd(t, "turn/start", ts(1), "turn/start", ts(2)), 0, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CompletedPrefix(tt.evs); got != tt.prefix {
				t.Errorf("prefix = %d, want %d", got, tt.prefix)
			}
			if err := ValidateReplay(tt.evs, tt.open); (err != nil) != tt.wantErr {
				t.Errorf("ValidateReplay = %v, wantErr %v", err, tt.wantErr)
			}
			if err := ValidateReplay(tt.evs[:CompletedPrefix(tt.evs)], false); err != nil && !tt.wantErr {
				t.Errorf("the completed prefix does not replay: %v", err)
			}
		})
	}
	gap := seqd(t, "turn/start", ts(1))
	gap[0].Seq = 3
	if ValidateReplay(gap, true) == nil {
		t.Error("a seq gap must be refused")
	}
}
