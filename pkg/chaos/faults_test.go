package chaos

import (
	"reflect"
	"testing"
	"time"
)

// TestScheduleReplaysFromItsSeed: a seed gives the same schedule every
// time, another seed another one; the first round visits every class once,
// starting with a leader's kill and an isolated node (what the short run of
// make test must exercise); a pause outlasts the host expiry.
func TestScheduleReplaysFromItsSeed(t *testing.T) {
	cfg := ScheduleConfig{Seed: 42, Duration: 5 * time.Minute, HostExpiry: 3 * time.Second}
	a, b := NewSchedule(cfg), NewSchedule(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	cfg.Seed = 43
	if reflect.DeepEqual(a, NewSchedule(cfg)) {
		t.Fatal("two seeds gave the same schedule")
	}
	if len(a) < len(FaultClasses) {
		t.Fatalf("%d steps in 5 minutes", len(a))
	}
	seen := map[string]bool{}
	for i, s := range a[:len(FaultClasses)] {
		if i < 2 && s.Class != []string{FaultKillLeader, FaultIsolate}[i] {
			t.Errorf("step %d is %s", i, s.Class)
		}
		seen[s.Class] = true
	}
	if len(seen) != len(FaultClasses) {
		t.Errorf("the first round visits %v", seen)
	}
	var total time.Duration
	for _, s := range a {
		total += s.Gap + s.Hold
		if s.Class == FaultPauseWorker && s.Hold <= cfg.HostExpiry {
			t.Errorf("a pause of %s does not outlast the host expiry", s.Hold)
		}
	}
	if total < cfg.Duration || total > cfg.Duration+time.Minute {
		t.Errorf("the schedule lasts %s for a duration of %s", total, cfg.Duration)
	}
}

// TestScheduleTakesTargetsInTurn: successive kills of a leader and
// stepdowns name the streams of leaderStreams in turn, and successive kills
// of a node the three nodes in turn, so a long schedule reaches the leader
// of every stream and the node with sync always as well as the others.
func TestScheduleTakesTargetsInTurn(t *testing.T) {
	for _, seed := range []int64{1, 2, 3, 4} {
		steps := NewSchedule(ScheduleConfig{Seed: seed, Duration: 10 * time.Minute, HostExpiry: 3 * time.Second})
		targets := map[string][]int{}
		for _, s := range steps {
			switch s.Class {
			case FaultKillLeader, FaultStepDown:
				targets[s.Class] = append(targets[s.Class], s.Pick%len(leaderStreams))
			case FaultKillServer:
				targets[s.Class] = append(targets[s.Class], s.Pick%3)
			}
		}
		for class, n := range map[string]int{FaultKillLeader: len(leaderStreams), FaultStepDown: len(leaderStreams), FaultKillServer: 3} {
			got := targets[class]
			if len(got) < n {
				t.Fatalf("seed %d: %d faults of %s in 10 minutes", seed, len(got), class)
			}
			for i := 1; i < len(got); i++ {
				if got[i] != (got[i-1]+1)%n {
					t.Errorf("seed %d: %s targets %v, not in turn", seed, class, got)
					break
				}
			}
		}
	}
}
