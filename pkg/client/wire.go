package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// DefaultTimeout bounds a request whose context has no deadline, and is
// Options.Timeout's default (30 s): longer than a coordinator's whole budget
// for a request without Brood-Timeout (20 s), so a caller hears the
// coordinator's own answer (docs/protocol.md §2.4).
const DefaultTimeout = 30 * time.Second

// Call sends req (MessagePack) to subject as a NATS request and decodes the
// reply into reply (which may be nil). It is the one request path of the
// client and of Brood's services (docs/protocol.md §1.1, §2):
//
//   - an error reply (micro headers Nats-Service-Error-Code and
//     Nats-Service-Error, body {code, message, details?}) is a *protocol.Error
//     with the catalogue code;
//   - no responders is UNAVAILABLE (nothing was done), with cause
//     nats.ErrNoResponders;
//   - a deadline that passed is UNAVAILABLE (the request may have been
//     executed), with cause context.DeadlineExceeded or nats.ErrTimeout;
//   - a cancelled ctx is CANCELLED, with cause context.Canceled;
//   - a request larger than the server's max_payload is LIMIT_EXCEEDED
//     (limit "request bytes"), with cause nats.ErrMaxPayload;
//   - any other transport failure is UNAVAILABLE with that cause.
//
// ctx without a deadline gets DefaultTimeout. The request carries the time
// left until ctx's deadline in the Brood-Timeout header, so the callee can
// answer within it (docs/protocol.md §2.4).
func Call(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	err := CallVia(ctx, nc.RequestMsgWithContext, subject, req, reply)
	if protocol.CodeOf(err) == protocol.CodeUnavailable {
		// No answer, because NATS refused the request (the connection's
		// user may not publish it): PERMISSION_DENIED, which no retry
		// mends, not UNAVAILABLE (issue 37, item 7).
		if denied := refusedBy(nc, subject); denied != nil {
			return denied
		}
	}
	return err
}

// RequestFunc sends msg as a request and returns its reply: what Call does
// with nc.RequestMsgWithContext. It returns nats.ErrNoResponders when the
// server says nobody serves the subject, and ctx's error when no reply came
// in time.
type RequestFunc func(ctx context.Context, msg *nats.Msg) (*nats.Msg, error)

// CallVia is Call whose request travels through send (a reply subject of the
// caller's choosing: a coordinator answers its hosts' requests under a
// subject their NATS user may publish, internal/rpc.Replies).
func CallVia(ctx context.Context, send RequestFunc, subject string, req, reply any) error {
	data, err := protocol.Marshal(protocol.Msgpack, req)
	if err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "encode request: %v", err).WithCause(err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	if d, ok := ctx.Deadline(); ok {
		msg.Header.Set(protocol.HeaderTimeout, strconv.FormatInt(time.Until(d).Milliseconds(), 10))
	}
	// The request carries the W3C trace context of ctx (pkg/tracecontext).
	ctx, span := tracecontext.StartClient(ctx, subject, msg.Header)
	err = request(ctx, send, msg, reply)
	tracecontext.End(span, err)
	return err
}

func request(ctx context.Context, send RequestFunc, msg *nats.Msg, reply any) error {
	resp, err := send(ctx, msg)
	if err != nil {
		return transportError(msg.Subject, err)
	}
	return decodeReply(msg.Subject, resp, reply)
}

// transportError maps a failed request to the catalogue, keeping the cause.
func transportError(subject string, err error) *protocol.Error {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return protocol.Errorf(protocol.CodeUnavailable, "nobody serves %s", subject).WithCause(err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return protocol.Errorf(protocol.CodeUnavailable, "no reply from %s in time", subject).WithCause(err)
	case errors.Is(err, context.Canceled):
		return protocol.Errorf(protocol.CodeCancelled, "request to %s cancelled", subject).WithCause(err)
	case errors.Is(err, nats.ErrMaxPayload):
		// Sending it again cannot help: not UNAVAILABLE (issue 37, item 2).
		return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit": "request bytes", "reason": fmt.Sprintf("the request to %s is larger than the NATS server's max_payload", subject),
		}).WithCause(err)
	default:
		return protocol.Errorf(protocol.CodeUnavailable, "request to %s: %v", subject, err).WithCause(err)
	}
}

// decodeReply turns one reply message into reply or its *protocol.Error.
func decodeReply(subject string, resp *nats.Msg, reply any) error {
	if perr := ErrorOf(resp); perr != nil {
		return perr
	}
	if reply == nil {
		return nil
	}
	if err := protocol.Unmarshal(protocol.EncodingOf(resp.Header), resp.Data, reply); err != nil {
		return protocol.Errorf(protocol.CodeInternal, "decode reply from %s: %v", subject, err).WithCause(err)
	}
	return nil
}

// ErrorOf returns the *protocol.Error carried by a micro error reply, or nil
// when msg is not one. The body is decoded when possible; otherwise the
// Nats-Service-Error header is split at its first ": " into code and message
// (docs/protocol.md §2.1).
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
