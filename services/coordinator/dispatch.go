package coordinator

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Dispatch to provider instances (docs/design.md §14: a start that one instance
// does not answer goes to another live instance).
//
// A provider's instances share no queue group for the coordinator's
// requests: a queue group keeps delivering to a member whose process is
// paused (SIGSTOP, a long GC, a frozen VM) until the server drops its
// connection, minutes later, so every request it picks waits for the whole
// timeout. Instead each instance serves its own subject
// `<prefix>.v1.provider.<name>.<hostId>.<op>`, and the coordinator picks
// among the live instances it knows from brood_hosts. An instance that lets
// an attempt time out is suspected for a host expiry: other requests try it
// last, so a paused instance costs at most one attempt per request, and after
// the host expiry it is no longer live at all.
//
// Measured (integration TestPausedWorkerCostsOneAttempt): with a paused
// second spawn worker, six `brood run`s through the queue group took 10 s
// each for the ones it picked and ended UNAVAILABLE; addressed per instance,
// each takes one attempt at most and all six complete.

// suspects remembers instances that let an attempt time out, until when.
type suspects struct {
	// m holds each suspect's host id until the host expiry passed (removed
	// when it is looked up or another host is suspected after it): bound,
	// the hosts suspected within one HostExpiry.
	m map[string]time.Time
}

func (c *Coordinator) suspect(hostID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.suspected.m == nil {
		c.suspected.m = map[string]time.Time{}
	}
	now := time.Now()
	for id, until := range c.suspected.m {
		if now.After(until) { // a host no request asked for again (one that stopped)
			delete(c.suspected.m, id)
		}
	}
	c.suspected.m[hostID] = now.Add(c.cfg.HostExpiry)
}

func (c *Coordinator) isSuspect(hostID string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.suspected.m[hostID]
	if ok && now.After(until) {
		delete(c.suspected.m, hostID)
		return false
	}
	return ok
}

// instances returns the live, non-draining hosts serving provider name with
// its canonical descriptor: unsuspected ones first, each group shuffled so
// requests spread over them.
func (c *Coordinator) instances(name string) []string {
	desc, ok := c.reg.Provider(name)
	if !ok {
		return nil
	}
	ids := c.reg.Offering(name, desc)
	now := time.Now()
	var good, bad []string
	for _, id := range ids {
		switch {
		case !c.reg.HostLive(id):
		case c.isSuspect(id, now):
			bad = append(bad, id)
		default:
			good = append(good, id)
		}
	}
	rand.Shuffle(len(good), func(i, j int) { good[i], good[j] = good[j], good[i] })
	rand.Shuffle(len(bad), func(i, j int) { bad[i], bad[j] = bad[j], bad[i] })
	return append(good, bad...)
}

// registered counts the host records, live or not, that offer provider name:
// NO_PROVIDER is only for a provider nobody registered; one whose instances
// are all silent now (paused, cut off, or heartbeats held up by a leader
// election) is UNAVAILABLE, which a client retries.
func (c *Coordinator) registered(name string) int {
	return c.reg.Registered(name)
}

// dispatchRetryWait is the pause before the instances are tried again once
// every one failed with an error another attempt may not have.
const dispatchRetryWait = 200 * time.Millisecond

// dispatch sends the request built by build to op of a live instance of
// provider, one instance at a time, until one answers or ctx is done; id
// (the run or child) names the request in logs. Each attempt gets at most
// ProviderAttemptTimeout; build receives the attempt's deadline (epoch ms)
// for the request's deadline field, so an instance that receives it later
// drops it. An instance that does not answer in time is suspected and the
// next one tried; this request tries it again only when every other
// instance timed out too, so a paused instance costs a request one attempt
// at most while another instance answers. No responders, DRAINING and
// UNAVAILABLE (the instance's own JetStream writes ran out of budget) move
// on too, and once every instance was tried the round starts again while
// time remains. Any other error is the instance's answer and final, as is
// NOT_PENDING (another instance claimed the run first). It returns the host
// that answered.
func (c *Coordinator) dispatch(ctx context.Context, provider, op, id string, build func(deadlineMs int64) any, reply any) (string, error) {
	var last error
	timedOut := map[string]bool{}
	for round := 0; ; round++ {
		all := c.instances(provider)
		if len(all) == 0 {
			if last == nil {
				last = c.noInstance(provider)
			}
			return "", last
		}
		var hosts []string
		for _, h := range all {
			if !timedOut[h] {
				hosts = append(hosts, h)
			}
		}
		if len(hosts) == 0 {
			hosts = all // every instance timed out once: a slow one may answer now
		}
		for _, host := range hosts {
			if ctx.Err() != nil {
				return "", budgetSpent(provider, last)
			}
			actx, cancel := context.WithTimeout(ctx, c.cfg.ProviderAttemptTimeout)
			deadline, _ := actx.Deadline()
			err := c.callHost(actx, host, c.subj.ProviderInstance(provider, host, op), build(deadline.UnixMilli()), reply)
			cancel()
			if err == nil {
				return host, nil
			}
			last = err
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				c.suspect(host)
				timedOut[host] = true
				c.log.Warn("provider instance did not answer in time; trying another", "provider", provider, "host", host, "op", op, "id", id)
			case errors.Is(err, nats.ErrNoResponders), errors.Is(err, protocol.ErrDraining), errors.Is(err, protocol.ErrUnavailable):
				c.log.Info("provider instance could not take the request; trying another", "provider", provider, "host", host, "op", op, "id", id, "err", err)
			default:
				return host, err
			}
		}
		t := time.NewTimer(dispatchRetryWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", budgetSpent(provider, last)
		case <-t.C:
		}
	}
}

// noInstance is the error of a provider without a live instance.
func (c *Coordinator) noInstance(provider string) error {
	if n := c.registered(provider); n > 0 {
		return protocol.Errorf(protocol.CodeUnavailable,
			"provider %s has %d registered instances but none is live now (none heartbeated within %s); nothing was started", provider, n, c.cfg.HostExpiry)
	}
	return protocol.NewError(protocol.CodeNoProvider, map[string]any{"provider": provider})
}

// budgetSpent is the error of a dispatch whose budget ran out.
func budgetSpent(provider string, last error) error {
	if last == nil {
		return protocol.Errorf(protocol.CodeUnavailable, "no instance of provider %s answered within the request's budget; nothing was started", provider)
	}
	return protocol.Errorf(protocol.CodeUnavailable,
		"no instance of provider %s answered within the request's budget; nothing was started (last: %v)", provider, last).WithCause(context.DeadlineExceeded)
}

// Deadlines (docs/design.md §14; docs/protocol.md §2.4). Each hop's budget is
// smaller than its caller's, so every caller hears its callee's own answer:
//
//	client (Go client, CLI: 30 s by default)
//	  └ coordinator: the caller's Brood-Timeout less replyMargin, else RequestBudget (20 s)
//	      └ one attempt at one provider instance: ProviderAttemptTimeout (4 s),
//	        the request's deadline field; the host drops it when it arrives later
//	          └ each JetStream request: store.AttemptTimeout (2 s), retried
//	            within the operation's budget
const (
	DefaultProviderAttemptTimeout = 4 * time.Second
	DefaultRequestBudget          = 20 * time.Second
	// settleReserve is kept back from a start's budget to settle its run
	// record never started when no instance took it.
	settleReserve = 2 * time.Second
)

// replyMargin is how much sooner than its caller's timeout the coordinator
// answers (protocol.ReplyMargin: a tenth of it, between 100 ms and 1 s).
func replyMargin(t time.Duration) time.Duration { return protocol.ReplyMargin(t) }

// ownBound lists the endpoints whose waits have bounds of their own that a
// caller without Brood-Timeout accepted by calling them (runs.await, and the
// long polls sessions.log and inbox.read: waitMs; runs.dispose: the host's
// dispose and the settlement wait; continuable.drain and
// descendants.dispose: one dispose per activation).
var ownBound = map[string]bool{
	protocol.EpRunsAwait: true, protocol.EpRunsDispose: true, protocol.EpContinuableDrain: true,
	protocol.EpSessionsLog: true, protocol.EpInboxRead: true, protocol.EpDescendantsDispose: true,
}

// budgeted bounds a handler by the request's budget: the caller's
// Brood-Timeout less replyMargin, else RequestBudget (except ownBound).
// events.follow is not bounded: its reply opens a stream that outlives the
// request, ended by its own lease and credit.
func (c *Coordinator) budgeted(endpoint string, h rpc.Handler) rpc.Handler {
	if endpoint == protocol.EpEventsFollow {
		return h
	}
	return func(ctx context.Context, req rpc.Request) (any, error) {
		budget := c.cfg.RequestBudget
		if t := req.Timeout(); t > 0 {
			budget = t - replyMargin(t)
		} else if ownBound[endpoint] {
			return h(ctx, req)
		}
		ctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		began := time.Now()
		reply, err := h(ctx, req)
		if over := time.Since(began) - budget; over > replyMargin(budget) {
			c.log.Warn("answered after the request's budget; its caller may have stopped waiting", "endpoint", endpoint, "budget", budget.String(), "over", over.String())
		}
		return reply, err
	}
}

// reserve returns ctx less settleReserve (at least half of what is left),
// for work that must leave time to record its failure.
func reserve(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	left := time.Until(d)
	return context.WithTimeout(ctx, max(left-settleReserve, left/2))
}
