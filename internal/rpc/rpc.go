// Package rpc holds the request/reply plumbing shared by Brood's services and
// clients: encoding negotiation (MessagePack or JSON), error replies in the
// micro format with the protocol error body, and bounded concurrent handling
// of micro endpoints.
package rpc

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// Request is one request handed to a Handler. Replies go straight to the
// request's reply subject on the service's connection: a micro.Request must
// not be answered after its handler returned (micro updates its stats from
// it), and handlers here answer from their own goroutine.
type Request struct {
	nc       *nats.Conn
	subject  string
	reply    string
	data     []byte
	header   nats.Header
	Encoding protocol.Encoding
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

// Decode decodes the request body into v in the request's encoding. A body that
// does not decode is an INVALID_ARGUMENT error.
func (r Request) Decode(v any) error {
	if len(r.data) == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "empty request body")
	}
	if err := protocol.UnmarshalRequest(r.Encoding, r.data, v); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "request body is not valid %s for this endpoint: %v (send a MessagePack map, or a JSON object; JSON may carry the header %s: %s)",
			r.Encoding, err, protocol.HeaderContentType, protocol.ContentTypeJSON)
	}
	return nil
}

// Handler answers one request: a reply value or an error. A *protocol.Error is
// sent as is; any other error becomes INTERNAL.
type Handler func(ctx context.Context, req Request) (any, error)

// Endpoint adapts h to a micro handler that runs each request in its own
// goroutine, at most sem's capacity at once (a micro endpoint otherwise
// handles its requests one after another on one subscription). ctx bounds
// every request; when it is done, requests are answered UNAVAILABLE.
func Endpoint(ctx context.Context, nc *nats.Conn, log *slog.Logger, sem chan struct{}, h Handler) micro.Handler {
	return micro.HandlerFunc(func(mr micro.Request) {
		dispatch(ctx, log, sem, h, Request{
			nc: nc, subject: mr.Subject(), reply: mr.Reply(), data: mr.Data(), header: nats.Header(mr.Headers()),
			Encoding: protocol.RequestEncoding(mr.Headers(), mr.Data()),
		})
	})
}

// MsgHandler is Endpoint for a plain subscription (host subjects).
func MsgHandler(ctx context.Context, nc *nats.Conn, log *slog.Logger, sem chan struct{}, h Handler) nats.MsgHandler {
	return func(m *nats.Msg) {
		dispatch(ctx, log, sem, h, Request{
			nc: nc, subject: m.Subject, reply: m.Reply, data: m.Data, header: m.Header, Encoding: protocol.RequestEncoding(m.Header, m.Data),
		})
	}
}

func dispatch(ctx context.Context, log *slog.Logger, sem chan struct{}, h Handler, req Request) {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		Reply(log, req, nil, protocol.Errorf(protocol.CodeUnavailable, "service is stopping"))
		return
	}
	go func() {
		defer func() { <-sem }()
		ctx, span := tracecontext.StartServer(ctx, req.subject, req.header)
		reply, err := h(ctx, req)
		Reply(log, req, reply, err)
		tracecontext.End(span, err)
	}()
}

// Replied is what a Handler returns when it already answered the request
// itself with Reply (a stream whose first message must be the reply).
var Replied any = replied{}

type replied struct{}

// Reply sends reply or err in the request's encoding. A request without a
// reply subject (a plain publish) gets nothing.
func Reply(log *slog.Logger, req Request, reply any, err error) {
	if req.reply == "" || (err == nil && reply == Replied) {
		return
	}
	if err != nil {
		ReplyError(log, req, err)
		return
	}
	if reply == nil {
		reply = protocol.Empty{}
	}
	data, merr := protocol.Marshal(req.Encoding, reply)
	if merr != nil {
		ReplyError(log, req, protocol.Errorf(protocol.CodeInternal, "encode reply: %v", merr))
		return
	}
	respond(log, req, contentHeader(req.Encoding), data)
}

// ReplyError sends err as a micro error reply (headers Nats-Service-Error-Code
// and Nats-Service-Error) with the protocol error body.
func ReplyError(log *slog.Logger, req Request, err error) {
	pe := protocol.AsError(err)
	if pe.Code == protocol.CodeInternal {
		log.Error("request failed", "subject", req.subject, "err", err)
	}
	body, merr := protocol.Marshal(req.Encoding, pe)
	if merr != nil {
		body = nil
	}
	h := contentHeader(req.Encoding)
	h.Set(micro.ErrorCodeHeader, strconv.Itoa(pe.Code.Number()))
	h.Set(micro.ErrorHeader, pe.Error())
	respond(log, req, h, body)
}

func respond(log *slog.Logger, req Request, h nats.Header, data []byte) {
	if req.reply == "" {
		return
	}
	if err := req.nc.PublishMsg(&nats.Msg{Subject: req.reply, Header: h, Data: data}); err != nil {
		log.Debug("reply failed", "subject", req.subject, "err", err)
	}
}

func contentHeader(enc protocol.Encoding) nats.Header {
	return nats.Header{protocol.HeaderContentType: []string{enc.ContentType()}}
}

// Call is client.Call: the one request path of clients and services.
func Call(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	return client.Call(ctx, nc, subject, req, reply)
}

// ErrorOf is client.ErrorOf.
func ErrorOf(msg *nats.Msg) *protocol.Error { return client.ErrorOf(msg) }

// DefaultTimeout bounds a Call whose context has no deadline.
const DefaultTimeout = client.DefaultTimeout
