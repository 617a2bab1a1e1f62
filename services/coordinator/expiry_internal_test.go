package coordinator

import (
	"fmt"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
)

// TestOneReplicaGivesAKeyItsLifetimeFirst: for any key, the live
// coordinators' delays are 0, 1, ... times expiryStagger, each once, so one
// replica writes at once and the others only if it did not; a replica not
// among the live ones comes last.
func TestOneReplicaGivesAKeyItsLifetimeFirst(t *testing.T) {
	live := []string{"coord-a", "coord-b", "coord-c"}
	firsts := map[string]int{}
	for i := 0; i < 300; i++ {
		key := store.RunSpecKey("spawn", fmt.Sprintf("R%d", i))
		seen := map[time.Duration]string{}
		for _, id := range live {
			d := expiryDelay(id, live, key)
			if other, ok := seen[d]; ok || d%expiryStagger != 0 || d >= time.Duration(len(live))*expiryStagger {
				t.Fatalf("%s: %s's delay %s (also %q's)", key, id, d, other)
			}
			seen[d] = id
		}
		firsts[seen[0]]++
		if d := expiryDelay("coord-new", live, key); d != 3*expiryStagger {
			t.Fatalf("a replica not live yet: %s", d)
		}
	}
	for _, id := range live {
		if firsts[id] < 50 {
			t.Fatalf("the first writer by replica over 300 keys: %v, want it spread", firsts)
		}
	}
}
