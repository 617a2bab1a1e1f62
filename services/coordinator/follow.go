package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/pkg/protocol"
)

// events.follow: lifecycle events streamed to the requester's reply subject
// (a subject under its own inbox prefix, so a client needs no subscription
// anywhere else). The stream is read from BROOD_EVENTS with batch direct gets
// after the last sequence sent, and woken by a core subscription on the
// events subjects: no consumer on the server, nothing buffered here beyond
// one page. Flow control is credit: the follow sends at most the credit its
// client granted (initial credit in the request, more with credit requests
// on this replica's own subject), so a slow client holds back the stream in
// JetStream, never in the coordinator. A follow lives while its client sends
// a credit request at least every FollowLeaseMs; it ends with an "end"
// message when its authority dies (UNAUTHORIZED) or this replica stops
// (UNAVAILABLE: the client resumes after the last sequence elsewhere).
//
// Messages on the reply subject, in order: the EventsFollowReply (or an
// error reply), then FollowMessages: events, heartbeats when idle, and at
// most one end.

// followCreditToken starts the endpoint part of every replica's follow
// credit subject (protocol.Subjects.FollowCredit).
const followCreditToken = "follow."

// followRecheck are the pauses between re-reads after a wake-up that found
// nothing yet: the core message can arrive before JetStream stored the event.
var followRecheck = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond, 800 * time.Millisecond}

// followRegistry holds this replica's live follows (their number is
// bounded by Coordinator.followSlots).
type followRegistry struct {
	mu sync.Mutex
	m  map[string]*follow
	wg sync.WaitGroup
}

func (r *followRegistry) add(f *follow) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[f.id] = f
	r.wg.Add(1)
}

func (r *followRegistry) remove(id string) {
	r.mu.Lock()
	delete(r.m, id)
	r.mu.Unlock()
	r.wg.Done()
}

func (r *followRegistry) get(id string) (*follow, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.m[id]
	return f, ok
}

// follow is one live follow.
type follow struct {
	id        string
	user      string // the caller (callerOf): only it may send the credit
	req       rpc.Request
	deliver   string
	scope     *eventScope
	heartbeat time.Duration
	wake      chan struct{}

	mu      sync.Mutex
	credit  int
	renewed time.Time
	stopped bool
}

func (f *follow) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// state returns the credit left, whether the lease holds and whether the
// client stopped the follow.
func (f *follow) state(lease time.Duration) (credit int, live, stopped bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.credit, time.Since(f.renewed) < lease, f.stopped
}

func (f *follow) use(n int) {
	f.mu.Lock()
	f.credit -= n
	f.mu.Unlock()
}

func (c *Coordinator) eventsFollow(ctx context.Context, req rpc.Request, r protocol.EventsFollowRequest) (any, error) {
	if req.ReplySubject() == "" {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "events.follow streams to the request's reply subject: send it as a request")
	}
	scope, err := c.eventScope(ctx, r.Parent, r.Descendants, r.Authority)
	if err != nil {
		return nil, err
	}
	heartbeat := r.HeartbeatMs
	if heartbeat <= 0 {
		heartbeat = protocol.FollowHeartbeatMsDefault
	}
	heartbeat = max(min(heartbeat, protocol.FollowHeartbeatMsMax), protocol.FollowHeartbeatMsMin)
	var start protocol.Seq
	if r.AfterSeq != nil {
		start = *r.AfterSeq
	} else {
		last, err := c.st.LastEventSeq(ctx, scope.subject)
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "read the events stream: %w", err)
		}
		start = protocol.Seq(last)
	}
	f := &follow{
		id: nuid.Next(), user: c.callerOf(req), req: req, deliver: req.ReplySubject(), scope: scope,
		heartbeat: time.Duration(heartbeat) * time.Millisecond, wake: make(chan struct{}, 1),
		credit: clamp(r.CreditMsgs, protocol.FollowCreditMsgsDefault, protocol.FollowCreditMsgsMax), renewed: time.Now(),
	}
	// At most FollowsMax per replica and UserFollowsMax per user
	// (fairshare.go); the slot is given back when the follow ends.
	if err := c.followSlots.Take(f.user); err != nil {
		return nil, err
	}
	c.follows.add(f)
	// The reply must be the stream's first message: send it before the
	// follow starts publishing.
	credit := c.subj.FollowCredit(c.cfg.ID)
	if f.user != "" {
		credit = c.subj.UserFollowCredit(f.user, c.cfg.ID)
	}
	rpc.Reply(c.log, req, protocol.EventsFollowReply{
		FollowID: f.id, Seq: start, CreditSubject: credit, CreditMsgs: f.credit,
		HeartbeatMs: heartbeat, LeaseMs: protocol.FollowLeaseMs,
	}, nil)
	// ctx is the server's lifetime (rpc.Server), not this request's: the
	// follow outlives the handler and ends when the replica stops serving.
	go func() {
		defer c.follows.remove(f.id)
		defer c.followSlots.Give(f.user)
		c.runFollow(ctx, f, start)
	}()
	return rpc.Replied, nil
}

// runFollow streams one follow until it ends (see the top of this file).
func (c *Coordinator) runFollow(ctx context.Context, f *follow, cursor protocol.Seq) {
	log := c.log.With("follow", f.id)
	send := func(m protocol.FollowMessage) {
		if err := f.req.Publish(f.deliver, m); err != nil {
			log.Debug("follow message not sent", "err", err)
		}
	}
	end := func(err *protocol.Error) {
		send(protocol.FollowMessage{Kind: protocol.FollowEnd, Seq: cursor, Error: err})
	}
	sub, err := c.cfg.NC.Subscribe(f.scope.subject, func(*nats.Msg) { f.poke() })
	if err != nil {
		end(protocol.Errorf(protocol.CodeUnavailable, "subscribe to the events: %w", err))
		return
	}
	defer sub.Unsubscribe()
	lease := time.Duration(protocol.FollowLeaseMs) * time.Millisecond
	hb := time.NewTicker(f.heartbeat)
	defer hb.Stop()
	lastSent := time.Now()
	var recheck <-chan time.Time
	rechecks := len(followRecheck)
	for {
		credit, live, stopped := f.state(lease)
		switch {
		case stopped:
			// The client stopped it: the last message says so, without an
			// error (docs/protocol.md §5.19), so a reader waiting for the
			// end is not left waiting.
			send(protocol.FollowMessage{Kind: protocol.FollowEnd, Seq: cursor})
			return
		case ctx.Err() != nil:
			end(protocol.Errorf(protocol.CodeUnavailable, "coordinator %s is stopping; resume the follow after seq %s", c.cfg.ID, cursor))
			return
		case !live:
			end(protocol.Errorf(protocol.CodeUnavailable, "no credit request for %s; resume the follow after seq %s", lease, cursor))
			return
		}
		if credit > 0 {
			var sent, more bool
			cursor, sent, more = c.followPage(ctx, f, cursor, credit, send, log)
			if sent {
				lastSent, rechecks = time.Now(), len(followRecheck)
			}
			if more {
				continue // more is stored already
			}
		}
		select {
		case <-f.wake:
			rechecks = 0
		case <-recheck:
		case <-hb.C:
			// The authority is checked again every beat: a root that was
			// closed (or a grant that expired) stops its follows.
			if _, err := c.readerOf(ctx, f.scope.auth); protocol.CodeOf(err) == protocol.CodeUnauthorized {
				end(protocol.AsError(err))
				return
			}
			if time.Since(lastSent) >= f.heartbeat {
				send(protocol.FollowMessage{Kind: protocol.FollowHeartbeat, Seq: cursor})
				lastSent = time.Now()
			}
		case <-ctx.Done():
		}
		recheck = nil
		if rechecks < len(followRecheck) {
			recheck = time.After(followRecheck[rechecks])
			rechecks++
		}
	}
}

// followPage sends the follow f the events after cursor, at most credit
// (and a page), and returns the cursor after them, whether any was sent and
// whether more are stored already. A read that failed sends nothing: it is
// retried at the next heartbeat.
func (c *Coordinator) followPage(ctx context.Context, f *follow, cursor protocol.Seq, credit int, send func(protocol.FollowMessage), log *slog.Logger) (next protocol.Seq, sent, more bool) {
	page, err := f.scope.read(ctx, c.st, cursor, min(credit, protocol.EventsPageMax))
	if err != nil {
		log.Warn("follow read failed; retrying at the next heartbeat", "err", err)
		return cursor, false, false
	}
	for i := range page.Events {
		ev := page.Events[i]
		send(protocol.FollowMessage{Kind: protocol.FollowEvent, Seq: ev.Seq, Event: &ev})
	}
	f.use(len(page.Events))
	return page.Cursor, len(page.Events) > 0, !page.Complete
}

// followCredit takes a client's credit request for one of this replica's
// follows (on protocol.Subjects.FollowCredit): it adds credit, renews the
// lease, or stops the follow. An unknown follow is NOT_FOUND: the client
// resumes after the last sequence it saw.
func (c *Coordinator) followCredit(_ context.Context, req rpc.Request, r protocol.FollowCreditRequest) (protocol.FollowCreditReply, error) {
	f, ok := c.follows.get(r.FollowID)
	if !ok || f.user != c.callerOf(req) {
		// Another user's follow is as unknown as one that ended.
		return protocol.FollowCreditReply{}, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "follow " + r.FollowID})
	}
	if r.CreditMsgs < 0 {
		return protocol.FollowCreditReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "creditMsgs must not be negative")
	}
	f.mu.Lock()
	if r.Stop {
		f.stopped = true
	} else {
		f.credit = min(f.credit+r.CreditMsgs, protocol.FollowCreditMsgsMax)
		f.renewed = time.Now()
	}
	credit := f.credit
	f.mu.Unlock()
	f.poke()
	return protocol.FollowCreditReply{CreditMsgs: credit}, nil
}
