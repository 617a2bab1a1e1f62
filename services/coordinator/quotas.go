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
//   - the bytes of the prompts it stores through each replica
//     (Config.UserPromptBytesPerSecond and UserPromptBytesBurst, a token
//     bucket of bytes per user and replica, charged with the request body
//     of runs.start, continuable.start, continuable.followup and
//     continuable.report before anything is stored): what one user stores
//     through one replica in a window w is at most the burst plus w times
//     the rate (issue 29, item 4: accepted prompts had no per-user bound,
//     and one user could fill a node's disk in minutes).
// Anonymous requests (<p>.v1.coord.<endpoint>: `brood dev`, or a
// deployment without users) are not limited.

// Defaults of the per-user quotas.
const (
	DefaultUserOpenRootsMax      = 256
	DefaultUserRequestsPerSecond = 200.0
	DefaultUserRequestsBurst     = 400
	// DefaultUserPromptBytesPerSecond is 1 GiB a day (12,428 bytes a
	// second), DefaultUserPromptBytesBurst 64 MiB (256 prompts of the
	// largest size, PromptBytesMax, at once).
	DefaultUserPromptBytesPerSecond = float64(1<<30) / (24 * 60 * 60)
	DefaultUserPromptBytesBurst     = 64 << 20
)

// storesPrompt are the endpoints whose request stores a prompt (a child's
// first prompt, a followup, a report): their request bodies are charged to
// the caller's prompt bytes.
var storesPrompt = map[string]bool{
	protocol.EpRunsStart: true, protocol.EpContinuableStart: true,
	protocol.EpContinuableFollowup: true, protocol.EpContinuableReport: true,
}

// userQuotas holds each user's token bucket (the opens of one user wait
// for each other on its open-root slot record: Coordinator.rootSlots,
// openroots.go).
type userQuotas struct {
	mu sync.Mutex
	// limiters holds a token bucket per user that sent a request, bytes
	// one of prompt bytes per user that stored a prompt: at most
	// userLimitersMax each (see there).
	limiters, bytes map[string]*rate.Limiter
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
	return limiterIn(&q.limiters, user, perSecond, burst)
}

// byteLimiter is the user's bucket of prompt bytes.
func (q *userQuotas) byteLimiter(user string, perSecond float64, burst int) *rate.Limiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return limiterIn(&q.bytes, user, perSecond, burst)
}

// limiterIn returns user's bucket in *m, made when missing (see
// userLimitersMax for what is dropped when *m is full). Hold q.mu.
func limiterIn(m *map[string]*rate.Limiter, user string, perSecond float64, burst int) *rate.Limiter {
	if *m == nil {
		*m = map[string]*rate.Limiter{}
	}
	l, ok := (*m)[user]
	if !ok {
		if len(*m) >= userLimitersMax {
			now := time.Now()
			for u, l := range *m {
				if l.TokensAt(now) >= float64(l.Burst()) {
					delete(*m, u)
				}
			}
			if len(*m) >= userLimitersMax {
				clear(*m)
			}
		}
		l = rate.NewLimiter(rate.Limit(perSecond), burst)
		(*m)[user] = l
	}
	return l
}

// rateLimited answers LIMIT_EXCEEDED to a user's request over its rate,
// and to a request of endpoint that stores a prompt over the user's prompt
// bytes (storesPrompt).
func (c *Coordinator) rateLimited(endpoint string, h rpc.Handler) rpc.Handler {
	return func(ctx context.Context, req rpc.Request) (any, error) {
		user := c.callerOf(req)
		if user == "" {
			return h(ctx, req)
		}
		if !c.quotas.limiter(user, c.cfg.UserRequestsPerSecond, c.cfg.UserRequestsBurst).Allow() {
			return nil, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "requests per user",
				"reason": fmt.Sprintf("user %s sends more than %g requests per second (bursts of %d) to this coordinator; slow down and retry",
					user, c.cfg.UserRequestsPerSecond, c.cfg.UserRequestsBurst)})
		}
		if storesPrompt[endpoint] && !c.quotas.byteLimiter(user, c.cfg.UserPromptBytesPerSecond, c.cfg.UserPromptBytesBurst).AllowN(time.Now(), len(req.Data())) {
			return nil, protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
				"limit": "prompt bytes per user",
				"reason": fmt.Sprintf("user %s stores more than %.0f bytes of prompts a second (bursts of %d bytes) through this coordinator; nothing was stored: retry later",
					user, c.cfg.UserPromptBytesPerSecond, c.cfg.UserPromptBytesBurst)})
		}
		return h(ctx, req)
	}
}
