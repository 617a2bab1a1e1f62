package chaos

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// The wait for quiet ends on two quiet snapshots in a row that hold the same
// state: a quiet snapshot read while an epoch claimed an item and settled
// between its reads (its turn open in the log, its item in no inbox, its
// record settled) does not end it, since the next one shows the log grown.
func TestQuiesceEndsOnTwoEqualQuietSnapshots(t *testing.T) {
	roots := map[string]bool{"ROOT": true}
	snap := func(logLen int, state string, inbox int) *Snapshot {
		s := &Snapshot{
			Logs:      map[string][]Event{"C": make([]Event, logLen)},
			Lifecycle: make([]protocol.LifecycleEvent, 2),
			Runs:      map[string]protocol.RunRecord{"R": {RunID: "R", ChildID: "C", Mode: protocol.ModeContinuable, State: state}},
			Inbox:     map[string][]InboxEntry{},
		}
		if inbox > 0 {
			s.Inbox["C"] = make([]InboxEntry, inbox)
		}
		return s
	}
	midFlight := snap(5, protocol.RunSettled, 0) // the turn open, its item claimed, the record settled
	after := snap(9, protocol.RunSettled, 0)     // the same epoch, its turn ended
	for _, tc := range []struct {
		name      string
		prev, cur *Snapshot
		want      bool
	}{
		{"the first quiet snapshot", nil, midFlight, false},
		{"a quiet snapshot read mid-flight, then the log grown", midFlight, after, false},
		{"two equal quiet snapshots", after, snap(9, protocol.RunSettled, 0), true},
		{"a record running", snap(9, protocol.RunRunning, 0), snap(9, protocol.RunRunning, 0), false},
		{"an item pending", snap(9, protocol.RunSettled, 1), snap(9, protocol.RunSettled, 1), false},
		{"a record settled since", snap(9, protocol.RunRunning, 0), after, false},
	} {
		if got := settled(tc.prev, tc.cur, roots); got != tc.want {
			t.Errorf("%s: settled = %v, want %v", tc.name, got, tc.want)
		}
	}
}
