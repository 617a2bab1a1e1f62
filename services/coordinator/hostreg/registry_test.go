package hostreg

import (
	"log/slog"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// entry is a KV entry as a watch delivers it.
type entry = testutil.KVEntry

func hostEntry(t *testing.T, id string, rev uint64, heartbeatMs int64) entry {
	t.Helper()
	rec := protocol.HostRecord{HostID: id, Kind: protocol.HostCoordinator, Heartbeat: heartbeatMs}
	if id != "self" {
		rec.Kind, rec.Providers = protocol.HostWorker, []protocol.ProviderDescriptor{{Name: "spawn"}}
	}
	data, err := protocol.Marshal(protocol.Msgpack, rec)
	if err != nil {
		t.Fatal(err)
	}
	return entry{Name: id, Data: data, Rev: rev}
}

// TestRegistryJudgesHostsOnEvidenceOnly drives the registry with the
// heartbeats its hosts watch delivers, in stream order: the observer's own
// ("self", every second) and a worker's ("spawn.w", of scope spawn). The expiry is 5 s.
func TestRegistryJudgesHostsOnEvidenceOnly(t *testing.T) {
	type beat struct {
		host string
		atMs int64 // when the heartbeat was written (the observer's own carry it)
	}
	own := func(from, to int64) []beat { // own heartbeats every second in [from, to]
		var out []beat
		for s := from; s <= to; s++ {
			out = append(out, beat{"self", s * 1000})
		}
		return out
	}
	cat := func(parts ...[]beat) []beat {
		var out []beat
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name  string
		beats []beat
		live  bool
	}{
		{"the worker stopped while the observer watched for longer than the expiry",
			cat([]beat{{"spawn.w", 0}}, own(0, 7)), false},
		{"the worker stopped, but the observer watched for less than the expiry",
			cat([]beat{{"spawn.w", 0}}, own(0, 4)), true},
		{"the observer was cut off: its own heartbeats stopped coming back",
			cat([]beat{{"spawn.w", 0}}, own(0, 2), own(30, 31)), true},
		{"after the observer's gap the worker gets the whole expiry again",
			cat([]beat{{"spawn.w", 0}}, own(0, 2), own(30, 34)), true},
		{"after the gap, the expiry of observed time without the worker",
			cat([]beat{{"spawn.w", 0}}, own(0, 2), own(30, 36)), false},
		{"a server restart: nobody wrote for 6 s, then the worker came back",
			cat([]beat{{"spawn.w", 0}}, own(0, 1), own(8, 9), []beat{{"spawn.w", 9500}}, own(10, 20)), false},
		{"a server restart: the worker came back and keeps beating",
			cat([]beat{{"spawn.w", 0}}, own(0, 1), own(8, 9), []beat{{"spawn.w", 9500}}, own(10, 14), []beat{{"spawn.w", 14500}}, own(15, 19)), true},
		{"before the observer's first own heartbeat nothing is judged",
			[]beat{{"spawn.w", 0}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New("self", time.Second, 5*time.Second, slog.Default())
			for i, b := range tc.beats {
				r.Put(b.host, hostEntry(t, b.host, uint64(i+1), b.atMs))
			}
			if got := r.HostLive("spawn.w"); got != tc.live {
				t.Fatalf("hostLive = %v, want %v (observed %s)", got, tc.live, r.Observed())
			}
			if _, counts := r.Providers(); (counts["spawn"] > 0) != tc.live {
				t.Fatalf("providers count %v; want listed = %v", counts, tc.live)
			}
		})
	}
}

func TestRegistryStalledWhenOwnHeartbeatDoesNotComeBack(t *testing.T) {
	r := New("self", time.Second, 5*time.Second, slog.Default())
	r.staleMax = 50 * time.Millisecond
	r.Put("self", hostEntry(t, "self", 1, 1000))
	r.Wrote(1) // already delivered: nothing to wait for
	if r.Stalled() {
		t.Fatal("stalled with nothing outstanding")
	}
	r.Wrote(2)
	if r.Stalled() {
		t.Fatal("stalled at once")
	}
	time.Sleep(60 * time.Millisecond)
	if !r.Stalled() {
		t.Fatal("not stalled after staleMax")
	}
	if r.Stalled() {
		t.Fatal("a stall is reported once, then waited for again")
	}
	r.Wrote(3)
	r.Put("self", hostEntry(t, "self", 3, 2000))
	time.Sleep(60 * time.Millisecond)
	if r.Stalled() {
		t.Fatal("stalled although the heartbeat came back")
	}
}

// TestRegistryTakesProvidersOnlyInTheirHostsScope: a worker may write only
// its own scope's host records (docs/security.md), so the registry takes
// from a host record only the provider its scope names (any from the shared
// scope), and no record written under another host's key.
func TestRegistryTakesProvidersOnlyInTheirHostsScope(t *testing.T) {
	record := func(key, hostID string, names ...string) entry {
		rec := protocol.HostRecord{HostID: hostID, Kind: protocol.HostWorker, Heartbeat: 1000}
		for _, n := range names {
			rec.Providers = append(rec.Providers, protocol.ProviderDescriptor{Name: n, Continuable: n == "fork"})
		}
		data, err := protocol.Marshal(protocol.Msgpack, rec)
		if err != nil {
			t.Fatal(err)
		}
		return entry{Name: key, Data: data, Rev: 1}
	}
	for _, tc := range []struct {
		name  string
		entry entry
		want  map[string]int
	}{
		{"its own provider", record("spawn.H1", "spawn.H1", "spawn"), map[string]int{"spawn": 1}},
		{"another provider from its scope", record("spawn.H1", "spawn.H1", "spawn", "fork"), map[string]int{"spawn": 1}},
		{"only another provider", record("spawn.H1", "spawn.H1", "fork"), map[string]int{}},
		{"the shared scope offers any", record("shared.H1", "shared.H1", "spawn", "fork"), map[string]int{"spawn": 1, "fork": 1}},
		{"a record naming another host", record("spawn.H1", "fork.H2", "fork"), map[string]int{}},
		{"a key without a scope", record("H1", "H1", "spawn"), map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New("self", time.Second, 5*time.Second, slog.Default())
			r.Put(tc.entry.Name, tc.entry)
			if _, got := r.Providers(); !maps.Equal(got, tc.want) {
				t.Fatalf("instances %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRegistryProviderIsTheListedOne: Provider(name) answers the
// descriptor providers() lists for name (the earliest-started live host's,
// ties by host id, draining hosts skipped), and nothing when none offers it.
func TestRegistryProviderIsTheListedOne(t *testing.T) {
	type host struct {
		id       string
		started  int64
		draining bool
		tools    []string // tells the descriptors apart
	}
	tests := []struct {
		name      string
		hosts     []host
		wantTools []string // nil: no provider
	}{
		{"none", nil, nil},
		{"one", []host{{"spawn.a", 100, false, []string{"a"}}}, []string{"a"}},
		{"the earliest started", []host{{"spawn.a", 200, false, []string{"a"}}, {"spawn.b", 100, false, []string{"b"}}}, []string{"b"}},
		{"a tie goes to the lower host id", []host{{"spawn.d", 100, false, []string{"d"}}, {"spawn.b", 100, false, []string{"b"}}}, []string{"b"}},
		{"a draining host is skipped", []host{{"spawn.a", 200, false, []string{"a"}}, {"spawn.b", 100, true, []string{"b"}}}, []string{"a"}},
		{"only draining hosts", []host{{"spawn.b", 100, true, []string{"b"}}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New("self", time.Second, 5*time.Second, slog.Default())
			r.Put("self", hostEntry(t, "self", 1, 1000))
			for i, h := range tc.hosts {
				rec := protocol.HostRecord{HostID: h.id, Kind: protocol.HostWorker, Heartbeat: 1000, StartedAt: h.started, Draining: h.draining,
					Providers: []protocol.ProviderDescriptor{{Name: "spawn", Tools: h.tools}}}
				data, err := protocol.Marshal(protocol.Msgpack, rec)
				if err != nil {
					t.Fatal(err)
				}
				r.Put(h.id, entry{Name: h.id, Data: data, Rev: uint64(i + 2)})
			}
			got, ok := r.Provider("spawn")
			if ok != (tc.wantTools != nil) || (ok && !reflect.DeepEqual(got.Tools, tc.wantTools)) {
				t.Fatalf("provider(spawn) = %+v, %v; want tools %v", got, ok, tc.wantTools)
			}
			listed, _ := r.Providers()
			var fromList *protocol.ProviderDescriptor
			for i := range listed {
				if listed[i].Name == "spawn" {
					fromList = &listed[i]
				}
			}
			if (fromList != nil) != ok || (ok && !fromList.Equal(got)) {
				t.Fatalf("provider(spawn) = %+v, %v; providers() lists %+v", got, ok, listed)
			}
		})
	}
}
