package client

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Permission violations. NATS refuses a publish or subscription the
// connection's user may not make by telling the connection asynchronously
// (nats.go's error handler); a request whose publish was refused would
// otherwise wait for its whole deadline and end UNAVAILABLE. The client
// watches the connection's violations and ends, at once, every call whose
// subject was refused, and every call when a subscription under the
// connection's inbox prefix was (no reply could arrive): PERMISSION_DENIED,
// naming the subject (docs/security.md lists what each role may do).

// violationRe parses nats-server's permissions violation.
var violationRe = regexp.MustCompile(`Permissions Violation for (Publish|Subscription) to "([^"]*)"`)

// violationOf returns the operation ("publish" or "subscribe") and subject
// of a permissions violation, ok false for any other error.
func violationOf(err error) (op, subject string, ok bool) {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(err.Error(), "Permissions Violation") {
		return "", "", false
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return "", "", false
	}
	op = "publish to"
	if m[1] == "Subscription" {
		op = "subscribe to"
	}
	return op, m[2], true
}

// PermissionDenied is the error of a call NATS refused: op ("publish to" or
// "subscribe to") on subject for this connection's user.
func PermissionDenied(op, subject string) *protocol.Error {
	return protocol.NewError(protocol.CodePermissionDenied, map[string]any{
		"reason":  "NATS refused this connection's user to " + op + " " + subject,
		"subject": subject,
	})
}

// permWatch tracks the calls in flight by subject, to end them on a violation.
type permWatch struct {
	inbox string // the connection's inbox prefix and "."

	mu     sync.Mutex
	closed bool
	calls  map[*watchedCall]struct{}
}

type watchedCall struct {
	subject string
	cancel  context.CancelCauseFunc
}

func newPermWatch(nc *nats.Conn) *permWatch {
	prefix := nc.Opts.InboxPrefix
	if prefix == "" {
		prefix = nats.InboxPrefix[:len(nats.InboxPrefix)-1]
	}
	w := &permWatch{inbox: prefix + ".", calls: map[*watchedCall]struct{}{}}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(conn *nats.Conn, sub *nats.Subscription, err error) {
		w.violation(err)
		if prev != nil {
			prev(conn, sub, err)
		}
	})
	return w
}

// watch registers a call on subject; ctx ends with PERMISSION_DENIED as its
// cause when NATS refuses it. Call done when the call returns.
func (w *permWatch) watch(ctx context.Context, subject string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	wc := &watchedCall{subject: subject, cancel: cancel}
	w.mu.Lock()
	w.calls[wc] = struct{}{}
	w.mu.Unlock()
	return ctx, func() {
		w.mu.Lock()
		delete(w.calls, wc)
		w.mu.Unlock()
		cancel(nil)
	}
}

// violation ends the calls a permissions violation concerns.
func (w *permWatch) violation(err error) {
	op, subject, ok := violationOf(err)
	if !ok {
		return
	}
	denied := PermissionDenied(op, subject)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	replies := op == "subscribe to" && strings.HasPrefix(subject, w.inbox)
	for wc := range w.calls {
		if wc.subject == subject || replies {
			wc.cancel(denied)
		}
	}
}

func (w *permWatch) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// deniedCause returns the PERMISSION_DENIED that ended ctx, or nil.
func deniedCause(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, protocol.ErrPermissionDenied) {
		return cause
	}
	return nil
}

// checkSubscribed flushes nc and reports PERMISSION_DENIED when the server
// refused the subscription to subject (a violation arrives before the
// flush's answer and stays the connection's last error).
func checkSubscribed(nc *nats.Conn, subject string) error {
	if err := nc.Flush(); err != nil {
		return nil // nothing known; a refused subscription shows as a missed notice
	}
	if op, s, ok := violationOf(nc.LastError()); ok && s == subject && op == "subscribe to" {
		return PermissionDenied(op, subject)
	}
	return nil
}

// refusedBy returns PERMISSION_DENIED when nc's last error is NATS's
// refusal of a publish to subject, or of a subscription under nc's inbox
// prefix (no reply could arrive), else nil: what a call without a Client's
// watch (Call, the services' requests) learns once its request went
// unanswered.
func refusedBy(nc *nats.Conn, subject string) error {
	op, s, ok := violationOf(nc.LastError())
	if !ok {
		return nil
	}
	prefix := nc.Opts.InboxPrefix
	if prefix == "" {
		prefix = nats.InboxPrefix[:len(nats.InboxPrefix)-1]
	}
	if (op == "publish to" && s == subject) || (op == "subscribe to" && strings.HasPrefix(s, prefix+".")) {
		return PermissionDenied(op, s)
	}
	return nil
}
