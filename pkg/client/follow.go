package client

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/protocol"
)

// FollowSilenceBeats is how many heartbeat intervals a Follow waits without
// any message before it resumes the follow on a new subscription (the
// coordinator, or the way to it, is gone).
const FollowSilenceBeats = 3

// FollowRetryWait is the pause between attempts to resume a follow.
const FollowRetryWait = 500 * time.Millisecond

// Follow is a live stream of lifecycle events (events.follow). The
// coordinator publishes them to a subject under this client's inbox prefix,
// at most the credit the client granted ahead of what it consumed, so a slow
// reader never makes the coordinator buffer. Next returns them in stream
// order; a follow that falls silent, ends UNAVAILABLE or loses its
// coordinator is resumed after the last stream sequence seen, so no event is
// skipped or repeated. Not safe for concurrent use.
type Follow struct {
	c      *Client
	req    protocol.EventsFollowRequest
	sub    *nats.Subscription
	msgs   chan *nats.Msg
	info   protocol.EventsFollowReply
	cursor protocol.Seq
	// unacked counts events received since credit was last granted.
	unacked   int
	lastGrant time.Time
	lastMsg   time.Time
}

// Follow starts following lifecycle events (events.follow): req.AfterSeq
// resumes after a stream sequence (past events first), nil follows only new
// events. It returns once the coordinator accepted the follow.
func (c *Client) Follow(ctx context.Context, req protocol.EventsFollowRequest) (*Follow, error) {
	f := &Follow{c: c, req: req}
	if err := f.open(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// Cursor is the last stream sequence the follow has seen (delivered events
// and heartbeats): a new follow with AfterSeq = Cursor continues exactly here.
func (f *Follow) Cursor() protocol.Seq { return f.cursor }

func (f *Follow) open(ctx context.Context) error {
	deliver := f.c.ownInbox("follow")
	ch := make(chan *nats.Msg, protocol.FollowCreditMsgsMax+16)
	sub, err := f.c.nc.ChanSubscribe(deliver, ch)
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "subscribe for the follow: %w", err)
	}
	fail := func(err error) error {
		_ = sub.Unsubscribe()
		return err
	}
	data, err := protocol.Marshal(protocol.Msgpack, f.req)
	if err != nil {
		return fail(protocol.Errorf(protocol.CodeInvalidArgument, "encode request: %w", err))
	}
	if err := checkSubscribed(f.c.nc, deliver); err != nil {
		return fail(err)
	}
	subject := f.c.subj.Call(f.c.opts.User, protocol.EpEventsFollow)
	wait, cancel := context.WithTimeout(ctx, f.c.opts.Timeout)
	defer cancel()
	wait, done := f.c.perms.watch(wait, subject)
	defer done()
	if err := f.c.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: deliver, Data: data}); err != nil {
		return fail(transportError(subject, err))
	}
	var first *nats.Msg
	select {
	case first = <-ch:
	case <-wait.Done():
		if denied := deniedCause(wait); denied != nil {
			return fail(denied)
		}
		return fail(transportError(subject, wait.Err()))
	}
	if isNoResponders(first) {
		return fail(transportError(subject, nats.ErrNoResponders))
	}
	if err := decodeReply(subject, first, &f.info); err != nil {
		return fail(err)
	}
	f.sub, f.msgs, f.cursor = sub, ch, f.info.Seq
	f.unacked, f.lastGrant, f.lastMsg = 0, time.Now(), time.Now()
	return nil
}

func isNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// Next returns the next event, waiting as long as ctx allows. It grants
// credit as events are consumed, keeps the follow alive while idle, and
// resumes it when needed. Errors: CANCELLED (ctx), UNAUTHORIZED (the
// authority the follow was opened with died), or what a resume could not
// get past before ctx ended.
func (f *Follow) Next(ctx context.Context) (protocol.LifecycleEvent, error) {
	for {
		if f.sub == nil {
			if err := f.resume(ctx); err != nil {
				return protocol.LifecycleEvent{}, err
			}
		}
		heartbeat := time.Duration(f.info.HeartbeatMs) * time.Millisecond
		grantDue := time.Until(f.lastGrant.Add(time.Duration(f.info.LeaseMs) * time.Millisecond / 3))
		silent := time.Until(f.lastMsg.Add(FollowSilenceBeats * heartbeat))
		t := time.NewTimer(max(min(grantDue, silent), 0))
		select {
		case m := <-f.msgs:
			t.Stop()
			f.lastMsg = time.Now()
			ev, ok, err := f.handle(ctx, m)
			if err != nil {
				return protocol.LifecycleEvent{}, err
			}
			if ok {
				return ev, nil
			}
		case <-t.C:
			if time.Since(f.lastMsg) >= FollowSilenceBeats*heartbeat {
				f.drop()
				continue
			}
			f.grant(ctx, false)
		case <-ctx.Done():
			t.Stop()
			return protocol.LifecycleEvent{}, protocol.Errorf(protocol.CodeCancelled, "following events: %w", ctx.Err())
		}
	}
}

// handle processes one stream message: an event to return, or bookkeeping.
func (f *Follow) handle(ctx context.Context, m *nats.Msg) (protocol.LifecycleEvent, bool, error) {
	var fm protocol.FollowMessage
	if err := protocol.Unmarshal(protocol.EncodingOf(m.Header), m.Data, &fm); err != nil {
		return protocol.LifecycleEvent{}, false, nil // not ours: ignore
	}
	switch fm.Kind {
	case protocol.FollowEvent:
		if fm.Event == nil || fm.Seq <= f.cursor {
			return protocol.LifecycleEvent{}, false, nil
		}
		f.cursor = fm.Seq
		f.unacked++
		if f.unacked >= max(f.info.CreditMsgs/2, 1) {
			f.grant(ctx, false)
		}
		ev := *fm.Event
		ev.Seq = fm.Seq
		return ev, true, nil
	case protocol.FollowHeartbeat:
		f.cursor = max(f.cursor, fm.Seq)
	case protocol.FollowEnd:
		f.cursor = max(f.cursor, fm.Seq)
		f.drop()
		if fm.Error != nil && fm.Error.Code != protocol.CodeUnavailable {
			return protocol.LifecycleEvent{}, false, fm.Error
		}
	}
	return protocol.LifecycleEvent{}, false, nil
}

// grant sends the credit consumed so far (and keeps the follow alive); a
// follow the coordinator no longer knows is resumed.
func (f *Follow) grant(ctx context.Context, stop bool) {
	if f.sub == nil {
		return
	}
	req := protocol.FollowCreditRequest{FollowID: f.info.FollowID, CreditMsgs: f.unacked, Stop: stop}
	var reply protocol.FollowCreditReply
	if err := f.c.callSubject(ctx, f.info.CreditSubject, req, &reply); err != nil {
		if !stop && (errors.Is(err, protocol.ErrNotFound) || errors.Is(err, protocol.ErrUnavailable)) {
			f.drop()
		}
		return
	}
	f.unacked, f.lastGrant = 0, time.Now()
}

func (f *Follow) drop() {
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
		f.sub = nil
	}
}

// resume opens a new follow after the cursor, retrying while the
// coordinator is UNAVAILABLE for up to Options.OutageMax: then (or at once
// when the connection is closed) the follow is stale and Next says so with
// UNAVAILABLE, rather than showing nothing new (issue 37, item 1).
func (f *Follow) resume(ctx context.Context) error {
	cursor := f.cursor
	f.req.AfterSeq = &cursor
	down := outage{c: f.c}
	for {
		err := f.open(ctx)
		if err == nil {
			return nil
		}
		if gaveUp := down.failed(err, "resuming the follow after event "+strconv.FormatUint(uint64(cursor), 10)); gaveUp != nil {
			return gaveUp
		}
		select {
		case <-ctx.Done():
			return protocol.Errorf(protocol.CodeCancelled, "resuming the follow: %v", ctx.Err()).WithCause(err)
		case <-time.After(FollowRetryWait):
		}
	}
}

// Close ends the follow (telling the coordinator, when it can be reached
// within a second) and removes its subscription.
func (f *Follow) Close() {
	if f.sub == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	f.grant(ctx, true)
	f.drop()
}
