// Package rpc holds the request/reply plumbing shared by Brood's services and
// clients: encoding negotiation (MessagePack or JSON), error replies in the
// micro format with the protocol error body, and bounded concurrent handling
// of micro endpoints.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Request is one decoded request handed to a Handler.
type Request struct {
	micro.Request
	Encoding protocol.Encoding
}

// Decode decodes the request body into v in the request's encoding. A body that
// does not decode is an INVALID_ARGUMENT error.
func (r Request) Decode(v any) error {
	if len(r.Data()) == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "empty request body")
	}
	if err := protocol.Unmarshal(r.Encoding, r.Data(), v); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "request body is not valid %s for this endpoint: %v", r.Encoding, err)
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
func Endpoint(ctx context.Context, log *slog.Logger, sem chan struct{}, h Handler) micro.Handler {
	return micro.HandlerFunc(func(mr micro.Request) {
		req := Request{Request: mr, Encoding: protocol.EncodingOf(mr.Headers())}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			Reply(log, req, nil, protocol.Errorf(protocol.CodeUnavailable, "service is stopping"))
			return
		}
		go func() {
			defer func() { <-sem }()
			reply, err := h(ctx, req)
			Reply(log, req, reply, err)
		}()
	})
}

// Reply sends reply or err in the request's encoding.
func Reply(log *slog.Logger, req Request, reply any, err error) {
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
	if rerr := req.Respond(data, micro.WithHeaders(contentHeaders(req.Encoding))); rerr != nil {
		log.Debug("reply failed", "subject", req.Subject(), "err", rerr)
	}
}

// ReplyError sends err as a micro error reply with the protocol error body.
func ReplyError(log *slog.Logger, req Request, err error) {
	pe := protocol.AsError(err)
	if pe.Code == protocol.CodeInternal {
		log.Error("request failed", "subject", req.Subject(), "err", err)
	}
	body, merr := protocol.Marshal(req.Encoding, pe)
	if merr != nil {
		body = nil
	}
	desc := pe.Error()
	if rerr := req.Error(strconv.Itoa(pe.Code.Number()), desc, body, micro.WithHeaders(contentHeaders(req.Encoding))); rerr != nil {
		log.Debug("error reply failed", "subject", req.Subject(), "err", rerr)
	}
}

func contentHeaders(enc protocol.Encoding) micro.Headers {
	ct := protocol.ContentTypeMsgpack
	if enc == protocol.JSON {
		ct = protocol.ContentTypeJSON
	}
	return micro.Headers{protocol.HeaderContentType: []string{ct}}
}

// Call sends req to subject and decodes the reply into reply (which may be
// nil). Error replies come back as *protocol.Error; no responders and timeouts
// as UNAVAILABLE. ctx must carry a deadline or Call applies DefaultTimeout.
func Call(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	data, err := protocol.Marshal(protocol.Msgpack, req)
	if err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "encode request: %v", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	resp, err := nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return protocol.Errorf(protocol.CodeUnavailable, "nobody serves %s", subject)
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			return protocol.Errorf(protocol.CodeUnavailable, "no reply from %s in time", subject)
		case errors.Is(err, context.Canceled):
			return protocol.Errorf(protocol.CodeCancelled, "request to %s cancelled", subject)
		default:
			return protocol.Errorf(protocol.CodeUnavailable, "request to %s: %v", subject, err)
		}
	}
	if perr := ErrorOf(resp); perr != nil {
		return perr
	}
	if reply == nil {
		return nil
	}
	if err := protocol.Unmarshal(protocol.EncodingOf(resp.Header), resp.Data, reply); err != nil {
		return protocol.Errorf(protocol.CodeInternal, "decode reply from %s: %v", subject, err)
	}
	return nil
}

// ErrorOf returns the *protocol.Error carried by a micro error reply, or nil.
func ErrorOf(msg *nats.Msg) *protocol.Error {
	if msg.Header == nil {
		return nil
	}
	codeNum := msg.Header.Get(protocol.HeaderServiceErrorCode)
	desc := msg.Header.Get(protocol.HeaderServiceError)
	if codeNum == "" && desc == "" {
		return nil
	}
	var pe protocol.Error
	if len(msg.Data) > 0 && protocol.Unmarshal(protocol.EncodingOf(msg.Header), msg.Data, &pe) == nil && pe.Code != "" {
		return &pe
	}
	code, message, ok := strings.Cut(desc, ": ")
	if !ok {
		return &protocol.Error{Code: protocol.CodeInternal, Message: fmt.Sprintf("error %s: %s", codeNum, desc)}
	}
	return &protocol.Error{Code: protocol.Code(code), Message: message}
}

// DefaultTimeout bounds a Call whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// MsgRequest adapts a core NATS request message to micro.Request, so plain
// subscriptions (host subjects) answer in the same format as micro endpoints.
type MsgRequest struct{ Msg *nats.Msg }

var _ micro.Request = MsgRequest{}

func (r MsgRequest) Respond(data []byte, opts ...micro.RespondOpt) error {
	m := &nats.Msg{Data: data}
	for _, o := range opts {
		o(m)
	}
	return r.Msg.RespondMsg(m)
}

func (r MsgRequest) RespondJSON(v any, opts ...micro.RespondOpt) error {
	data, err := protocol.Marshal(protocol.JSON, v)
	if err != nil {
		return err
	}
	return r.Respond(data, opts...)
}

func (r MsgRequest) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	m := &nats.Msg{Header: nats.Header{
		micro.ErrorHeader:     []string{description},
		micro.ErrorCodeHeader: []string{code},
	}, Data: data}
	for _, o := range opts {
		o(m)
	}
	return r.Msg.RespondMsg(m)
}

func (r MsgRequest) Data() []byte           { return r.Msg.Data }
func (r MsgRequest) Headers() micro.Headers { return micro.Headers(r.Msg.Header) }
func (r MsgRequest) Subject() string        { return r.Msg.Subject }
func (r MsgRequest) Reply() string          { return r.Msg.Reply }

// MsgHandler adapts h to a nats.MsgHandler with the same bounded concurrency
// and reply format as Endpoint.
func MsgHandler(ctx context.Context, log *slog.Logger, sem chan struct{}, h Handler) nats.MsgHandler {
	ep := Endpoint(ctx, log, sem, h)
	return func(m *nats.Msg) { ep.Handle(MsgRequest{Msg: m}) }
}
