package client

import (
	"context"
	"errors"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultOutageMax is Options.OutageMax's default (1 minute): long enough
// for a broker or a coordinator to restart (or a client to fail over to
// another replica), short enough that a waiting client does not hang on a
// deployment that is gone.
const DefaultOutageMax = time.Minute

// outageRetryWait is the pause between attempts while the deployment
// cannot be reached.
const outageRetryWait = 500 * time.Millisecond

// outage tracks how long a wait that outlives single requests (Run.Result,
// Follow, Retrying) has been unable to reach the deployment: since the
// first of its consecutive UNAVAILABLE answers. A connection closed for good
// (nats.go gave up reconnecting) ends it at once.
type outage struct {
	c     *Client
	since time.Time
}

// failed records err (a failed attempt) and reports the error to give up
// with: nil while the outage may still pass (err is UNAVAILABLE, the
// connection can still reconnect, and OutageMax has not passed since the
// first failure), else the UNAVAILABLE naming what was waited for.
func (o *outage) failed(err error, what string) error {
	if !errors.Is(err, protocol.ErrUnavailable) {
		return err
	}
	if o.since.IsZero() {
		o.since = time.Now()
	}
	if o.c.nc.IsClosed() {
		return protocol.Errorf(protocol.CodeUnavailable, "%s: the NATS connection is closed: %w", what, err)
	}
	if d := time.Since(o.since); d >= o.c.opts.OutageMax {
		return protocol.Errorf(protocol.CodeUnavailable, "%s: the deployment could not be reached for %s: %w", what, d.Round(time.Second), err)
	}
	return nil
}

// ok records a successful attempt: the outage, if any, is over.
func (o *outage) ok() { o.since = time.Time{} }

// Retrying calls f until it succeeds or fails with an answer: an
// UNAVAILABLE (the broker restarting, the coordinator that served the
// request killed, no coordinator subscribed yet) is tried again, every half
// second, on whichever coordinator answers next, for up to
// Options.OutageMax since the first failure (then UNAVAILABLE); a closed
// connection ends it at once. Use it only for requests that are safe to
// retry (docs/protocol.md §2.3: reads, long polls, runs.await), as the
// CLI's log --follow and followup --wait do (issue 37, item 1).
func (c *Client) Retrying(ctx context.Context, what string, f func(ctx context.Context) error) error {
	o := outage{c: c}
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		if gaveUp := o.failed(err, what); gaveUp != nil {
			return gaveUp
		}
		t := time.NewTimer(outageRetryWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return protocol.Errorf(protocol.CodeCancelled, "%s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}
