// Package rpc holds the request/reply plumbing shared by Brood's services and
// clients: encoding negotiation (MessagePack or JSON), error replies in the
// micro format with the protocol error body, and the serving of requests
// (Server): concurrent, bounded, tracked handlers whose answers the NATS micro
// protocol reports truthfully.
//
// Why Brood serves the micro protocol itself rather than through nats.go's
// micro package (v1.55, read in its source): a micro endpoint is one
// subscription whose callback runs its requests one after another, and
// micro's statistics are updated in its own wrapper around Handler.Handle
// (processing time is the time Handle took; an error counts when the request
// was answered with Request.Error before Handle returned). A handler that
// returns at once and answers from a goroutine of its own keeps concurrency
// but makes `nats micro stats` show about zero processing time and no errors;
// a handler that answers before returning is truthful but serves one request
// at a time per endpoint, so one long wait (runs.await, a dispose) would hold
// up every caller of that endpoint. micro offers no concurrent endpoint and
// no way to report statistics from elsewhere (its per-endpoint counters are
// unexported; StatsHandler only adds a free-form data field). So a Service
// here answers PING, INFO and STATS on micro's control subjects
// ($SRV.<verb>[.<name>[.<id>]], micro.ControlSubject) with micro's own types
// (micro.Ping, micro.Info, micro.Stats), while its endpoints are queue
// subscriptions whose requests run concurrently and are counted when their
// reply is sent: the request, the time from receipt to reply, and an error
// reply as an error. `nats micro ls|info|stats` see no difference.
//
// Lifecycle (STYLE.md): a Server tracks every handler goroutine it starts,
// so a service's Run can return only after its in-flight handlers finished
// (Server.Stop), the way net/http's Shutdown waits for active connections.
package rpc

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Request is one request handed to a Handler. Replies go straight to the
// request's reply subject on the server's connection.
type Request struct {
	nc       *nats.Conn
	subject  string
	reply    string
	data     []byte
	header   nats.Header
	Encoding protocol.Encoding
}

func requestOf(nc *nats.Conn, m *nats.Msg) Request {
	return Request{nc: nc, subject: m.Subject, reply: m.Reply, data: m.Data, header: m.Header, Encoding: protocol.RequestEncoding(m.Header, m.Data)}
}

// Data is the request body.
func (r Request) Data() []byte { return r.data }

// Subject is the subject the request was sent to.
func (r Request) Subject() string { return r.subject }

// ReplySubject is the request's reply subject ("" for a plain publish).
func (r Request) ReplySubject() string { return r.reply }

// Publish encodes v in the request's encoding and publishes it to subject
// on the request's connection, with the matching Content-Type header (the
// later messages of a stream answering this request).
func (r Request) Publish(subject string, v any) error {
	data, err := protocol.Marshal(r.Encoding, v)
	if err != nil {
		return err
	}
	return r.nc.PublishMsg(&nats.Msg{Subject: subject, Header: contentHeader(r.Encoding), Data: data})
}

// Headers are the request's headers.
func (r Request) Headers() nats.Header { return r.header }

// Timeout is how long the caller waits for the reply, from the request's
// Brood-Timeout header (0 when absent or malformed).
func (r Request) Timeout() time.Duration {
	ms, err := strconv.ParseInt(r.header.Get(protocol.HeaderTimeout), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// Decode decodes the request body into v in the request's encoding. A body that
// does not decode is an INVALID_ARGUMENT error.
func (r Request) Decode(v any) error {
	if len(r.data) == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "empty request body")
	}
	if err := protocol.UnmarshalRequest(r.Encoding, r.data, v); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "request body is not valid %s for this endpoint: %w (send a MessagePack map, or a JSON object; JSON may carry the header %s: %s)",
			r.Encoding, err, protocol.HeaderContentType, protocol.ContentTypeJSON)
	}
	return nil
}

// Handler answers one request: a reply value (nil: {}) or an error. A
// *protocol.Error is sent as is; any other error becomes INTERNAL. ctx is
// the serving Server's (with the request's trace span): it is cancelled when
// the server stops, and a handler must then return promptly. Handlers run
// concurrently.
type Handler func(ctx context.Context, req Request) (any, error)

// Typed is the one adapter from a request shape to a reply shape: it
// decodes the request body as In in the request's encoding (Request.Decode:
// an empty or undecodable body is INVALID_ARGUMENT; an In of protocol.Empty
// takes any body, or none, undecoded), calls h with it, and answers h's Out
// or its error. A table of Typed handlers (the coordinator's endpoints)
// shows every endpoint's request and reply shapes in its handlers'
// signatures, and no handler repeats the decoding prelude.
func Typed[In, Out any](h func(ctx context.Context, req Request, in In) (Out, error)) Handler {
	return func(ctx context.Context, req Request) (any, error) {
		var in In
		if _, empty := any(in).(protocol.Empty); !empty {
			if err := req.Decode(&in); err != nil {
				return nil, err
			}
		}
		out, err := h(ctx, req, in)
		if err != nil {
			return nil, err
		}
		return out, nil
	}
}

// Replied is what a Handler returns when it already answered the request
// itself with Reply (a stream whose first message must be the reply).
var Replied any = replied{}

type replied struct{}

// Reply sends reply or err in the request's encoding. A request without a
// reply subject (a plain publish) gets nothing.
func Reply(log *slog.Logger, req Request, reply any, err error) {
	_ = send(log, req, reply, err)
}

func contentHeader(enc protocol.Encoding) nats.Header {
	return nats.Header{protocol.HeaderContentType: []string{enc.ContentType()}}
}

// Subscribed flushes nc and returns PERMISSION_DENIED when the server
// refused one of its subscriptions (or publishes) so far: a service whose
// NATS user lacks the rights of its role would otherwise serve nothing,
// silently (docs/security.md). Call it once a service subscribed.
func Subscribed(nc *nats.Conn, timeout time.Duration) error {
	if err := nc.FlushTimeout(timeout); err != nil {
		return err
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return protocol.Errorf(protocol.CodePermissionDenied, "%w: the NATS user of this service lacks a right of its role (docs/security.md, deploy/nats/cluster/accounts.conf)", err)
	}
	return nil
}

// Call is client.Call: the one request path of clients and services.
func Call(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	return client.Call(ctx, nc, subject, req, reply)
}

// ErrorOf is client.ErrorOf.
func ErrorOf(msg *nats.Msg) *protocol.Error { return client.ErrorOf(msg) }

// DefaultTimeout bounds a Call whose context has no deadline.
const DefaultTimeout = client.DefaultTimeout
