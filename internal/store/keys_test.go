package store_test

import (
	"testing"

	"github.com/brood-dev/brood/internal/store"
)

// Every key the layout builds is told apart by KindOf, which gives back the
// id it was built from; bare ids are leases and nothing else is.
func TestKeyLayoutRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		key  string
		kind store.AgentsKind
		id   string
	}{
		{store.LeaseKey("S1"), store.KindLease, "S1"},
		{store.LeaseKey("01J9-abc_d"), store.KindLease, "01J9-abc_d"},
		{store.RootLeaseKey("R1"), store.KindRootLease, "R1"},
		{store.LeaseKeyFor("R1", true), store.KindRootLease, "R1"},
		{store.LeaseKeyFor("S1", false), store.KindLease, "S1"},
		{store.OwnsKey("P"), store.KindOwnership, "P"},
		{store.SlotsKey("P"), store.KindSlots, "P"},
		{store.GrantKey("ab12"), store.KindGrant, "ab12"},
		{store.DrainKey("S1"), store.KindDrain, "S1"},
		{store.DrainKey(store.DrainAll), store.KindDrain, store.DrainAll},
		{"other.key", store.KindOther, "other.key"},
		{"", store.KindOther, ""},
	} {
		kind, id := store.KindOf(tc.key)
		if kind != tc.kind || id != tc.id {
			t.Errorf("KindOf(%q) = %v, %q; want %v, %q", tc.key, kind, id, tc.kind, tc.id)
		}
	}
	if store.DrainKey(store.DrainAll) == store.DrainKey(store.LeaseKey("all")) {
		t.Error("the global drain's key must differ from every session's drain key")
	}
}
