package sessionlog

import (
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestDescriptorFolds: what a child's log says about how to rebuild it
// (cold resume), what children.list shows, and its mode, each read from its
// own events after its seed.
func TestDescriptorFolds(t *testing.T) {
	cont := protocol.DescriptorData{Version: protocol.DescriptorVersion, Mode: protocol.ModeContinuable, Provider: "spawn", Label: "helper"}
	oneShot := protocol.DescriptorData{Version: protocol.DescriptorVersion, Mode: protocol.ModeOneShot, Provider: "spawn"}
	old := protocol.DescriptorData{Version: protocol.DescriptorVersion - 1, Mode: protocol.ModeContinuable, Provider: "spawn", Label: "x"}
	unlabelled := protocol.DescriptorData{Version: protocol.DescriptorVersion, Mode: protocol.ModeContinuable, Provider: "spawn", Label: " "}
	corrupt := protocol.SessionEvent{Type: protocol.EvSubagentDescriptor, Data: []byte{0xc1}}
	ts := protocol.TurnData{Turn: 1}
	withCorrupt := func(evs []protocol.SessionEvent, at int) []protocol.SessionEvent {
		out := append([]protocol.SessionEvent(nil), evs[:at]...)
		out = append(out, corrupt)
		return append(out, evs[at:]...)
	}
	tests := []struct {
		name       string
		events     []protocol.SessionEvent
		seed       int64
		resumeErr  string // "" when Descriptor rebuilds it
		listed     bool
		listedMode string
		mode       string
	}{
		{"continuable", seqd(t, protocol.EvSubagentDescriptor, cont, protocol.EvTurnStart, ts), 0, "", true, protocol.ModeContinuable, protocol.ModeContinuable},
		{"one-shot", seqd(t, protocol.EvSubagentDescriptor, oneShot), 0, "it is a one-shot child", true, protocol.ModeOneShot, protocol.ModeOneShot},
		{"no descriptor", seqd(t, protocol.EvTurnStart, ts), 0, "no continuable descriptor", false, "", ""},
		{"another version", seqd(t, protocol.EvSubagentDescriptor, old), 0, "unsupported version", false, "", protocol.ModeContinuable},
		{"no label", seqd(t, protocol.EvSubagentDescriptor, unlabelled), 0, "lacks its provider or label", true, protocol.ModeContinuable, protocol.ModeContinuable},
		{"corrupt first", withCorrupt(seqd(t, protocol.EvSubagentDescriptor, cont), 0), 0, "corrupt", true, protocol.ModeContinuable, protocol.ModeContinuable},
		{"corrupt last", withCorrupt(seqd(t, protocol.EvSubagentDescriptor, cont), 1), 0, "", false, "", protocol.ModeContinuable},
		// A fork's seed is its parent's history: the parent's descriptor
		// there is not the child's.
		{"seeded", seqd(t, protocol.EvSubagentDescriptor, cont, protocol.EvSessionEndSeed, struct{}{}, protocol.EvSubagentDescriptor, oneShot), 1, "it is a one-shot child", true, protocol.ModeOneShot, protocol.ModeOneShot},
		{"seed longer than the log", seqd(t, protocol.EvSubagentDescriptor, cont), 5, "", true, protocol.ModeContinuable, protocol.ModeContinuable},
		{"last listed wins", seqd(t, protocol.EvSubagentDescriptor, oneShot, protocol.EvSubagentDescriptor, cont), 0, "it is a one-shot child", true, protocol.ModeContinuable, protocol.ModeOneShot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Descriptor(tt.events, tt.seed)
			switch {
			case tt.resumeErr == "" && (err != nil || d != cont):
				t.Errorf("Descriptor = %+v, %v; want %+v", d, err, cont)
			case tt.resumeErr != "" && (err == nil || !strings.Contains(err.Error(), tt.resumeErr)):
				t.Errorf("Descriptor error %v, want one saying %q", err, tt.resumeErr)
			}
			ld, ok := ListedDescriptor(Own(tt.events, tt.seed))
			if ok != tt.listed || (ok && ld.Mode != tt.listedMode) {
				t.Errorf("ListedDescriptor = %+v, %v; want listed %v mode %q", ld, ok, tt.listed, tt.listedMode)
			}
			if got := Mode(tt.events, tt.seed); got != tt.mode {
				t.Errorf("Mode = %q, want %q", got, tt.mode)
			}
		})
	}
}

// TestOwnSkipsTheSeed: a child's own events start after its seed; a seed
// that does not fit leaves the events whole.
func TestOwnSkipsTheSeed(t *testing.T) {
	evs := seqd(t, protocol.EvTurnStart, protocol.TurnData{Turn: 1}, protocol.EvSessionEndSeed, struct{}{}, protocol.EvTurnStart, protocol.TurnData{Turn: 2})
	for _, tt := range []struct {
		seed int64
		want int
	}{{0, 3}, {1, 2}, {3, 0}, {4, 3}, {-1, 3}} {
		if got := len(Own(evs, tt.seed)); got != tt.want {
			t.Errorf("Own(3 events, seed %d) has %d events, want %d", tt.seed, got, tt.want)
		}
	}
}
