package fairshare

import (
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestSlotsBoundInAllAndPerUser: a replica's slots refuse past max in all
// and past perUser for one user (LIMIT_EXCEEDED naming the bound), never
// bound anonymous callers per user, and a slot given back can be taken
// again.
func TestSlotsBoundInAllAndPerUser(t *testing.T) {
	type step struct {
		user  string
		give  bool
		limit string // the refusal's limit; "" taken (or given)
	}
	tests := []struct {
		name  string
		max   int
		per   int
		steps []step
	}{
		{"per user", 10, 2, []step{{user: "u"}, {user: "u"}, {user: "u", limit: "follows per user"}, {user: "v"}}},
		{"in all", 2, 5, []step{{user: "u"}, {user: "v"}, {user: "w", limit: "follows per replica"}}},
		{"anonymous only in all", 3, 1, []step{{}, {}, {}, {limit: "follows per replica"}}},
		{"given back", 10, 1, []step{{user: "u"}, {user: "u", limit: "follows per user"}, {user: "u", give: true}, {user: "u"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New("follows", tt.max, tt.per)
			for i, st := range tt.steps {
				if st.give {
					s.Give(st.user)
					continue
				}
				err := s.Take(st.user)
				got := ""
				if err != nil {
					pe := protocol.AsError(err)
					if pe.Code != protocol.CodeLimitExceeded {
						t.Fatalf("step %d: %v, want LIMIT_EXCEEDED", i, err)
					}
					got, _ = pe.Details["limit"].(string)
				}
				if got != st.limit {
					t.Fatalf("step %d (user %q): refused %q, want %q", i, st.user, got, st.limit)
				}
			}
		})
	}
}

// TestSlotsForgetUsersWithNoneHeld: a user whose slots are all given back
// leaves no entry behind, so the map does not grow with every user seen.
func TestSlotsForgetUsersWithNoneHeld(t *testing.T) {
	s := New("long polls", 10, 2)
	for _, u := range []string{"a", "b", "a"} {
		if err := s.Take(u); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []string{"a", "b", "a"} {
		s.Give(u)
	}
	if len(s.byUser) != 0 || s.total != 0 {
		t.Fatalf("after every slot given back: %d users, %d in all", len(s.byUser), s.total)
	}
}
