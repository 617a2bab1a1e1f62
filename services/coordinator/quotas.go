package coordinator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Per-user quotas (issue 17; docs/security.md, "Quotas"). A request on a
// user's own subject <p>.v1.user.<user>.<endpoint> comes from that user
// (the deployment lets only it publish there), so the coordinator can
// bound what one user takes:
//   - its request rate to each replica (Config.UserRequestsPerSecond and
//     UserRequestsBurst, a token bucket per user and replica), so one
//     user cannot take every handler slot (RequestsInFlightMax) of a
//     replica from the others;
//   - the roots it holds open (Config.UserOpenRootsMax): every open takes
//     a slot in the user's record by compare-and-set first, so opens of
//     one user served by any number of replicas never pass the bound
//     (openroots.go).
// Anonymous requests (<p>.v1.coord.<endpoint>: `brood dev`, or a
// deployment without users) are not limited.

// Defaults of the per-user quotas.
const (
	DefaultUserOpenRootsMax      = 256
	DefaultUserRequestsPerSecond = 200.0
	DefaultUserRequestsBurst     = 400
)

// userQuotas holds each user's token bucket (the opens of one user wait
// for each other on its open-root slot record: Coordinator.rootSlots,
// openroots.go).
type userQuotas struct {
	mu sync.Mutex
	// limiters holds a token bucket per user that sent a request: at most
	// userLimitersMax (see there).
	limiters map[string]*rate.Limiter
}

// userLimitersMax bounds the users whose token bucket a replica keeps
// (userQuotas.limiters). Adding one past it first drops the buckets that
// are full, the users idle for a burst's worth of their rate: a full
// bucket is a new one, so nobody gains a request. Should none be full
// (more than this many users busy at once), the buckets start over.
const userLimitersMax = 10_000

func (q *userQuotas) limiter(user string, perSecond float64, burst int) *rate.Limiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.limiters == nil {
		q.limiters = map[string]*rate.Limiter{}
	}
	l, ok := q.limiters[user]
	if !ok {
		if len(q.limiters) >= userLimitersMax {
			now := time.Now()
			for u, l := range q.limiters {
				if l.TokensAt(now) >= float64(l.Burst()) {
					delete(q.limiters, u)
				}
			}
			if len(q.limiters) >= userLimitersMax {
				clear(q.limiters)
			}
		}
		l = rate.NewLimiter(rate.Limit(perSecond), burst)
		q.limiters[user] = l
	}
	return l
}

// rateLimited answers LIMIT_EXCEEDED to a user's request over its rate.
func (c *Coordinator) rateLimited(h rpc.Handler) rpc.Handler {
	return func(ctx context.Context, req rpc.Request) (any, error) {
		if user := c.callerOf(req); user != "" && !c.quotas.limiter(user, c.cfg.UserRequestsPerSecond, c.cfg.UserRequestsBurst).Allow() {
			return nil, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "requests per user",
				"reason": fmt.Sprintf("user %s sends more than %g requests per second (bursts of %d) to this coordinator; slow down and retry",
					user, c.cfg.UserRequestsPerSecond, c.cfg.UserRequestsBurst)})
		}
		return h(ctx, req)
	}
}
