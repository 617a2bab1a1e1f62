package rpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Replies receives the answers to requests sent to worker hosts on reply
// subjects that name the host's scope:
//
//	<inbox prefix>.host.<scope>.<replies id>.<token>
//
// (with the coordinator user's inbox prefix _INBOX.coordinator,
// _INBOX.coordinator.host.<scope>.…). A host answers through
// allow_responses; an answer it sends after a reconnect, which
// allow_responses does not cover (the server it reconnected to never
// delivered the request), needs a publish permission of its own, and the
// deployment gives worker-<p> only _INBOX.coordinator.host.<p>.>: its
// scope's answers, never the coordinator's other replies (JetStream API
// answers, KV watch deliveries, other hosts' answers; docs/security.md). The
// token is 128 random bits, so an answer to a request is sent by a host that
// received it (or one of the same scope that saw it). One subscription,
// <prefix>.host.*.<id>.*, serves every request of the process.
type Replies struct {
	nc      *nats.Conn
	prefix  string // <inbox prefix>.host
	id      string
	sub     *nats.Subscription
	mu      sync.Mutex
	waiting map[string]chan *nats.Msg
}

// HostRepliesToken is the token after the inbox prefix of a Replies subject.
const HostRepliesToken = "host"

// NewReplies subscribes nc to the answers of its requests to hosts. Close
// it when done.
func NewReplies(nc *nats.Conn) (*Replies, error) {
	inbox := nc.NewInbox()
	prefix := inbox[:strings.LastIndexByte(inbox, '.')] + "." + HostRepliesToken
	r := &Replies{nc: nc, prefix: prefix, id: nuid.Next(), waiting: map[string]chan *nats.Msg{}}
	sub, err := nc.Subscribe(prefix+".*."+r.id+".*", r.deliver)
	if err != nil {
		return nil, fmt.Errorf("subscribe to host replies: %w", err)
	}
	r.sub = sub
	return r, nil
}

// Close ends the subscription; a request still waiting gets no answer.
func (r *Replies) Close() error { return r.sub.Unsubscribe() }

func (r *Replies) deliver(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	r.mu.Lock()
	ch := r.waiting[token]
	r.mu.Unlock()
	if ch != nil {
		select {
		case ch <- m:
		default: // a second answer: the first one counts
		}
	}
}

// Call is client.Call to a host of scope (protocol.HostScope of its id),
// its answer received on a subject of that scope. A scope that is not a
// ValidID (a host id without one) is "_" in the reply subject, which no
// worker user may publish.
func (r *Replies) Call(ctx context.Context, scope, subject string, req, reply any) error {
	if !protocol.ValidID(scope) {
		scope = "_"
	}
	return client.CallVia(ctx, func(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
		return r.request(ctx, scope, msg)
	}, subject, req, reply)
}

func (r *Replies) request(ctx context.Context, scope string, msg *nats.Msg) (*nats.Msg, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	ch := make(chan *nats.Msg, 1)
	r.mu.Lock()
	r.waiting[token] = ch
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.waiting, token)
		r.mu.Unlock()
	}()
	msg.Reply = r.prefix + "." + scope + "." + r.id + "." + token
	if err := r.nc.PublishMsg(msg); err != nil {
		return nil, err
	}
	select {
	case m := <-ch:
		// The server's answer when nothing subscribes to the subject
		// (what nats.Conn.Request reports as nats.ErrNoResponders).
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, nats.ErrNoResponders
		}
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
