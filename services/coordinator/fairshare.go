package coordinator

import (
	"fmt"
	"sync"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Fair shares (issue 29, item 4; docs/security.md, "Fair shares"). A long
// poll (sessions.log and inbox.read with waitMs) waits up to 60 s, and a
// follow (events.follow) streams for as long as its client sends credit:
// within its request rate, one user could hold every request slot of a
// replica (RequestsInFlightMax) with long polls, and every follow slot
// (FollowsMax) with follows, and the other users' renewals, runs and
// disposes then waited behind them until their roots lapsed. So:
//   - a long poll gives its request slot back while it waits (rpc.Park)
//     and waits in a slot of its own: at most LongPollsMax per replica and
//     UserLongPollsMax per user and replica; one beyond is LIMIT_EXCEEDED
//     (a read without waitMs, a short poll, is never refused here);
//   - follows are at most FollowsMax per replica and UserFollowsMax per
//     user and replica.
// Requests that do work (renewals, starts, disposes, hosts' requests)
// share RequestsInFlightMax with nothing that waits. Anonymous callers
// (<p>.v1.coord.<endpoint>) are bounded per replica only.

// Defaults of the fair shares.
const (
	DefaultLongPollsMax     = 1024
	DefaultUserLongPollsMax = 64
	DefaultUserFollowsMax   = 32
)

// waitSlots counts what waits in one replica (long polls, or follows),
// in all and per user.
type waitSlots struct {
	what         string // "long polls", "follows": the limit's name
	max, perUser int
	mu           sync.Mutex
	total        int
	byUser       map[string]int
}

func newWaitSlots(what string, max, perUser int) *waitSlots {
	return &waitSlots{what: what, max: max, perUser: perUser, byUser: map[string]int{}}
}

// take takes a slot for user ("" anonymous), or answers LIMIT_EXCEEDED
// naming the bound it would pass. Give it back with give.
func (w *waitSlots) take(user string) error {
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

// give gives back a slot take took for user.
func (w *waitSlots) give(user string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.total--
	if user != "" {
		if w.byUser[user]--; w.byUser[user] <= 0 {
			delete(w.byUser, user)
		}
	}
}
