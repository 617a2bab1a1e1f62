// Package fairshare counts what waits in one coordinator replica, in all
// and per user: its long polls and its follows (docs/security.md, "Fair
// shares"; services/coordinator/fairshare.go composes two).
package fairshare

import (
	"fmt"
	"sync"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Slots counts what waits in one replica (long polls, or follows), in all
// and per user: at most max in all and perUser per user.
type Slots struct {
	what         string // "long polls", "follows": the limit's name
	max, perUser int
	mu           sync.Mutex
	total        int
	byUser       map[string]int
}

// New returns the slots of what ("long polls", "follows": the limit's
// name in a refusal), at most max in all and perUser per user.
func New(what string, max, perUser int) *Slots {
	return &Slots{what: what, max: max, perUser: perUser, byUser: map[string]int{}}
}

// Take takes a slot for user ("" anonymous), or answers LIMIT_EXCEEDED
// naming the bound it would pass. Give it back with Give.
func (w *Slots) Take(user string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.total >= w.max {
		return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit":  w.what + " per replica",
			"reason": fmt.Sprintf("this coordinator holds its maximum of %d %s at once; retry later, or read without waiting", w.max, w.what)})
	}
	if user != "" && w.byUser[user] >= w.perUser {
		return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit":  w.what + " per user",
			"reason": fmt.Sprintf("user %s holds its maximum of %d %s on this coordinator at once; end one first, or read without waiting", user, w.perUser, w.what)})
	}
	w.total++
	if user != "" {
		w.byUser[user]++
	}
	return nil
}

// Give gives back a slot Take took for user.
func (w *Slots) Give(user string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if user != "" {
		if w.byUser[user]--; w.byUser[user] <= 0 {
			delete(w.byUser, user)
		}
	}
}
