package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	chaosRun      = flag.Bool("chaos", false, "the long run of make chaos: TestChaos runs -chaos.seeds for -chaos.duration each (without it, make test's short seed)")
	chaosSeeds    = flag.String("chaos.seeds", "1", "comma-separated seeds of TestChaos, one run each")
	chaosDuration = flag.Duration("chaos.duration", 40*time.Second, "workload under faults per seed")
	chaosHistory  = flag.String("chaos.history", "", "directory to save each seed's history in (gzipped JSON)")
	chaosClasses  = flag.String("chaos.classes", "", "comma-separated fault classes (default: every class)")
	chaosKeep     = flag.Bool("chaos.keep", false, "keep each seed's directory (stores and logs) and print its path")
	chaosRace     = flag.Bool("chaos.race", false, "run Brood's services built with the race detector")
	chaosSite     = flag.Bool("chaos.site", false, "the topology with a site: one spawn worker behind a leaf node, its links cut and slowed as a fault class (make chaos-site)")
)

// TestChaos runs the seeded workload against a 3-node cluster with two
// coordinators and two spawn workers under the seeded fault schedule, then
// checks the history (I1–I8, I10, I11, L1). In make test it runs the short seed,
// seed 1 for 40 s (its schedule kills a stream leader, isolates a node,
// kills a worker, steps a leader down and cuts a client, in about a
// minute); with -chaos, `make chaos` runs -chaos.seeds for -chaos.duration
// each. A failing seed replays its schedule with -chaos.seeds=<seed>.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster run")
	}
	if !*chaosRun {
		*chaosSeeds, *chaosDuration = "1", 40*time.Second
	}
	var seeds []int64
	for _, s := range strings.Split(*chaosSeeds, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("-chaos.seeds: %v", err)
		}
		seeds = append(seeds, n)
	}
	var classes []string
	if *chaosClasses != "" {
		classes = strings.Split(*chaosClasses, ",")
	}
	var total Summary
	total.Faults = map[string]int{}
	table := NewTable()
	allHeld := true
	for _, seed := range seeds {
		// A seed's directory (stores, logs) is kept when it fails or with
		// -chaos.keep, with its history beside them, so a failure of make
		// test can be looked into (TestCheckSavedHistory, TestExplainSession).
		dir, err := os.MkdirTemp("", fmt.Sprintf("brood-chaos-seed-%d-", seed))
		if err != nil {
			t.Fatal(err)
		}
		if *chaosKeep {
			t.Logf("seed %d: stores and logs in %s", seed, dir)
		}
		cfg := RunConfig{
			Dir: dir, Brood: broodBin, ServiceBinary: broodRaceBin, Seed: seed, Duration: *chaosDuration, Classes: classes,
			Site: *chaosSite, ContinuableBudgets: *chaosRun, Logf: func(format string, args ...any) { t.Logf(format, args...) },
		}
		if *chaosHistory != "" {
			cfg.HistoryPath = filepath.Join(*chaosHistory, fmt.Sprintf("history-seed-%d.json.gz", seed))
		}
		began := time.Now()
		res, err := RunChaos(context.Background(), cfg)
		if err != nil {
			t.Fatalf("seed %d: %v (stores and logs in %s)", seed, err, dir)
		}
		t.Logf("seed %d: done in %s", seed, time.Since(began).Round(time.Second))
		for _, line := range res.Report.Lines() {
			t.Log(line)
		}
		failed := false
		if !res.Report.OK() {
			allHeld, failed = false, true
			t.Errorf("seed %d: invariants violated", seed)
		}
		if len(res.Crashes) > 0 {
			failed = true
			t.Errorf("seed %d: processes crashed:\n%s", seed, strings.Join(res.Crashes, "\n"))
		}
		switch {
		case failed:
			path := filepath.Join(dir, "history.json.gz")
			if err := res.History.Save(path); err != nil {
				t.Logf("seed %d: save the history: %v", seed, err)
			}
			t.Logf("seed %d: stores and logs kept in %s; check its history again with -chaos.check=%s", seed, dir, path)
		case !*chaosKeep:
			os.RemoveAll(dir)
		}
		table.Add(res.Report)
		s := res.Report.Summary
		total.Ops += s.Ops
		total.Accepted += s.Accepted
		total.Messages += s.Messages
		total.Unknown += s.Unknown
		total.Lost += s.Lost
		total.Duplicated += s.Duplicated
		total.Stuck += s.Stuck
		total.LimitBreaches += s.LimitBreaches
		total.Continued += s.Continued
		total.ContinuedHostLost += s.ContinuedHostLost
		total.Takeovers += s.Takeovers
		total.CallsInterrupted += s.CallsInterrupted
		if s.LongestRecovery > total.LongestRecovery {
			total.LongestRecovery, total.RecoveryAfter = s.LongestRecovery, fmt.Sprintf("seed %d, %s", seed, s.RecoveryAfter)
		}
		for c, n := range s.Faults {
			total.Faults[c] += n
		}
	}
	state := "every invariant held"
	if !allHeld {
		state = "INVARIANTS VIOLATED"
	}
	t.Logf("chaos total over seeds %s: %s; %d operations, %d accepted (%d messages), %d unknown; lost %d, duplicated %d, stuck %d, limit breaches %d; longest recovery %s (%s)",
		*chaosSeeds, state, total.Ops, total.Accepted, total.Messages, total.Unknown, total.Lost, total.Duplicated, total.Stuck,
		total.LimitBreaches, total.LongestRecovery.Round(time.Millisecond), total.RecoveryAfter)
	var classesSeen []string
	for c, n := range total.Faults {
		classesSeen = append(classesSeen, fmt.Sprintf("%s×%d", c, n))
	}
	sort.Strings(classesSeen)
	t.Logf("chaos total faults: %s", strings.Join(classesSeen, ", "))
	t.Logf("chaos total %s", total.continuationLine())
	t.Logf("chaos fault classes × invariants (checks in each class's windows, %s before a fault to %s after its heal):\n%s",
		faultLead, faultTail, table.Markdown())
}

var checkHistory = flag.String("chaos.check", "", "a saved history (-chaos.history) for TestCheckSavedHistory to check again")

// TestCheckSavedHistory runs the checker on a history saved by an earlier
// run: go test ./pkg/chaos -run TestCheckSavedHistory -chaos.check=FILE -v
func TestCheckSavedHistory(t *testing.T) {
	if *checkHistory == "" {
		t.Skip("no -chaos.check history given")
	}
	h, err := LoadHistory(*checkHistory)
	if err != nil {
		t.Fatal(err)
	}
	r := Check(h)
	for _, line := range r.Lines() {
		t.Log(line)
	}
	table := NewTable()
	table.Add(r)
	t.Logf("fault classes × invariants:\n%s", table.Markdown())
	if !r.OK() {
		t.Error("invariants violated")
	}
}
