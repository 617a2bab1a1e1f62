package sessionlog

import (
	"fmt"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Own returns a child's own events: those after its seed of seedLength
// events (a fork's copy of its parent's history), or all of them when the
// seed does not fit (an unseeded child, or a log read short).
func Own(events []protocol.SessionEvent, seedLength int64) []protocol.SessionEvent {
	if seedLength > 0 && seedLength <= int64(len(events)) {
		return events[seedLength:]
	}
	return events
}

// Descriptor reads how to rebuild a continuable child (cold resume): the
// first subagent/descriptor of the child's own events, which must decode, be
// version protocol.DescriptorVersion, continuable, and name its provider and
// label (docs/upstream-behaviour.md §3.5, §5.4). The error says why a child cannot be
// resumed; for a descriptor of another mode or version the decoded
// descriptor comes back with it.
func Descriptor(events []protocol.SessionEvent, seedLength int64) (protocol.DescriptorData, error) {
	for _, ev := range Own(events, seedLength) {
		if ev.Type != protocol.EvSubagentDescriptor {
			continue
		}
		var d protocol.DescriptorData
		if err := ev.Decode(&d); err != nil {
			return d, fmt.Errorf("the descriptor is corrupt: %w", err)
		}
		if d.Version != protocol.DescriptorVersion {
			return d, fmt.Errorf("the descriptor has unsupported version %d", d.Version)
		}
		if d.Mode != protocol.ModeContinuable {
			return d, fmt.Errorf("it is a %s child: its one run is over; start a new child instead of retrying", d.Mode)
		}
		if d.Provider == "" || strings.TrimSpace(d.Label) == "" {
			return d, fmt.Errorf("the descriptor lacks its provider or label")
		}
		return d, nil
	}
	return protocol.DescriptorData{}, fmt.Errorf("its log has no continuable descriptor")
}

// ListedDescriptor is the descriptor children.list shows for a child: the
// last subagent/descriptor of its own events wins, and ok is false when
// there is none or the last one does not decode at version
// protocol.DescriptorVersion (the row is then a diagnostic).
func ListedDescriptor(own []protocol.SessionEvent) (d protocol.DescriptorData, ok bool) {
	for _, ev := range own {
		if ev.Type != protocol.EvSubagentDescriptor {
			continue
		}
		var x protocol.DescriptorData
		if ev.Decode(&x) == nil && x.Version == protocol.DescriptorVersion {
			d, ok = x, true
		} else {
			d, ok = protocol.DescriptorData{}, false
		}
	}
	return d, ok
}

// Mode is the mode (one-shot or continuable) of the first descriptor of a
// child's own events that decodes, or "" when none does.
func Mode(events []protocol.SessionEvent, seedLength int64) string {
	for _, ev := range Own(events, seedLength) {
		var d protocol.DescriptorData
		if ev.Type == protocol.EvSubagentDescriptor && ev.Decode(&d) == nil {
			return d.Mode
		}
	}
	return ""
}
