package chaos_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/chaos"
)

// TestYourProviderUnderFaults runs what docs/chaos.md ("Testing your own
// provider") tells a provider's author to write, with the exported API
// only: RunChaos with the provider's own workers, which the nemesis kills
// -9 and pauses past the host expiry in place of Brood's spawn workers.
// Two `brood spawn-worker` processes, given as ProcessSpecs, stand in for
// the author's worker binary. Every invariant holds, and every fault hit
// one of those workers.
func TestYourProviderUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster run")
	}
	brood := chaos.BroodForTests()
	worker := func(name string) chaos.ProcessSpec {
		return chaos.ProcessSpec{
			Name: name, Binary: brood, ReadyLine: "host serving",
			// Your worker's own flags: the streams are R3, and it
			// heartbeats often enough for RunConfig's host expiry (3 s).
			Args: []string{"spawn-worker", "--model", "scripted", "--replicas", "3", "--heartbeat", "500ms", "--host-expiry", "3s"},
		}
	}
	dir, err := os.MkdirTemp("", "brood-chaos-provider-")
	if err != nil {
		t.Fatal(err)
	}
	var history *chaos.History
	defer func() {
		if t.Failed() {
			if history != nil {
				path := filepath.Join(dir, "history.json.gz")
				if err := history.Save(path); err == nil {
					t.Logf("history saved; check it again with -chaos.check=%s", path)
				}
			}
			t.Logf("stores and logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	res, err := chaos.RunChaos(context.Background(), chaos.RunConfig{
		Dir: dir, Brood: brood, Seed: 11, Duration: 15 * time.Second,
		Classes:  []string{chaos.FaultKillWorker, chaos.FaultPauseWorker},
		Provider: "spawn",
		Workers:  []chaos.ProcessSpec{worker("mine-1"), worker("mine-2")},
		Logf:     t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	history = res.History
	for _, line := range res.Report.Lines() {
		t.Log(line)
	}
	if !res.Report.OK() {
		t.Error("invariants violated")
	}
	if len(res.Crashes) > 0 {
		t.Errorf("processes crashed:\n%s", strings.Join(res.Crashes, "\n"))
	}
	if len(res.History.Faults) == 0 {
		t.Fatal("no fault was injected")
	}
	for _, f := range res.History.Faults {
		if !strings.HasPrefix(f.Target, "mine-") {
			t.Errorf("fault %s hit %q, not one of your workers", f.Class, f.Target)
		}
	}
	if res.Report.Summary.Accepted == 0 {
		t.Error("no operation was accepted")
	}
}
