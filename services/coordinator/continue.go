package coordinator

// Continued, not lost (docs/protocol.md §8.4, "Continued after a host
// loss"; issue 31, item 2): a one-shot run whose host died in the middle
// of its turn is continued by another live instance of its provider. The
// takeover (takeover.go) takes the session's lease at the next epoch as
// before; then, instead of closing the turn, it fences the log with
// agent/takeover alone and asks a live instance to continue
// (protocol.OpProviderContinue). The instance takes the lease from this
// replica by compare-and-set at the revision the takeover wrote, and the
// run is its own from then on: it continues the turn from the log and
// settles the run, once, by the run record's compare-and-set, as the first
// host would have. While no instance takes it, the lease stays taken over
// and each sweep of this replica (liveness.go: a takeover of its own is
// resumed) asks again, until ContinueWaitMax from the agent/takeover
// record; then, or when the run was already taken over TakeoversMax
// times, the takeover goes on as before: the turn is closed interrupted
// and the run ends HOST_LOST.
//
// A continuable child's epoch whose host died with a turn open (claimed,
// not parked on a request) is continued the same way (takeOverActivation
// calls continueRun): the epoch's record stays running, and the instance
// that takes the lease continues the turn as the child's activation and
// settles the epoch once; TakeoversMax counts the epoch's takeovers. An
// epoch whose turn is parked is not continued here: the takeover ends the
// epoch and the child's next activation continues that turn (§5.21).
//
// Runs not continued (they end HOST_LOST at once, as before): a remote
// provider's (its agent holds the conversation), a run that started children of its own (they take an ancestor taken
// over for ended), a run under an ended one-shot ancestor (store.EndedAncestor
// of the lease's ancestry; the continuing host checks again, as its fence,
// internal/worker/runs.go), and a run whose log holds no open turn (the host died
// before its first turn, or after its last: the log has the result).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Defaults of Config.ContinueWaitMax and Config.TakeoversMax.
const (
	DefaultContinueWaitMax = 30 * time.Second
	DefaultTakeoversMax    = 3
)

// continuation is what continueRun decided about a run taken over.
type continuation struct {
	// handled: the run is continued on a live instance, or waits for one
	// (the lease stays taken over; the next sweep looks again); the
	// takeover stops here.
	handled bool
	// err: the log could not be fenced; the next sweep tries again.
	err error
	// lostHost is the host the takeover's agent/takeover names ("" when
	// none was read), why says why the run is not continued ("" when it
	// never could be: nothing to continue).
	lostHost, why string
}

// continueRun decides whether the one-shot run or continuable epoch, taken over at lease taken
// with fence, is continued (see the file's comment) and, when it is,
// fences the log without closing its turn and dispatches it to a live
// instance. Not handled, the caller closes the turn and settles HOST_LOST.
func (c *Coordinator) continueRun(ctx context.Context, fence protocol.TakeoverData, run store.Record[protocol.RunRecord], taken store.Record[protocol.AgentRecord]) continuation {
	id := taken.Value.SessionID
	if c.cfg.ContinueWaitMax < 0 || run.Value.Remote || c.isRemote(run.Value.Provider) {
		return continuation{}
	}
	// Nothing under an ended one-shot run starts work again (docs/design.md
	// §14): its dispose reached no one, the run's host being dead, so the
	// turn is closed here rather than continued. A failed read is taken as
	// "not ended": the continuing host asks again before it continues.
	if anc, err := c.st.EndedAncestor(ctx, taken.Value.Ancestry); err != nil {
		c.log.Warn("takeover: could not check whether an ancestor ended", "session", id, "err", err)
	} else if anc != "" {
		return continuation{why: fmt.Sprintf("an ancestor of the child (%s) had ended, so the run is not continued", anc)}
	}
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return continuation{err: fmt.Errorf("read the header of %s: %w", id, err)}
	}
	if idx, err := c.st.ChildIndex(ctx, id); err != nil {
		return continuation{err: fmt.Errorf("read the child index of %s: %w", id, err)}
	} else if len(idx) > 0 {
		return continuation{why: "the run had started children, so it is not continued"}
	}
	events, err := c.fenceLog(ctx, id, fence, run.Value.Descriptor, keepOpenTurn, c.holding(taken))
	if err != nil {
		return continuation{err: err}
	}
	if _, open, _, _, _ := sessionlog.OpenTurn(events); !open {
		return continuation{}
	}
	continuable := taken.Value.Kind == protocol.AgentContinuable
	if _, parked := sessionlog.Parked(events); parked && continuable {
		// The child's next activation continues it (docs/protocol.md §5.21).
		return continuation{}
	}
	at, lost, ok := takeoverOf(events, fence)
	if !ok {
		return continuation{err: fmt.Errorf("the log of %s holds no agent/takeover of epoch %d", id, fence.Epoch)}
	}
	counted := ownEvents(events, h.SeedLength)
	if continuable && taken.Value.EpochStart > 0 && taken.Value.EpochStart <= int64(len(events)) {
		counted = events[taken.Value.EpochStart:] // a continuable child's: this epoch's
	}
	if n := takeovers(counted); n > c.cfg.TakeoversMax {
		return continuation{lostHost: lost, why: fmt.Sprintf("the run was taken over %d times, more than the %d allowed (TakeoversMax, brood coordinator --takeovers-max)", n, c.cfg.TakeoversMax)}
	}
	if waited := time.Since(time.UnixMilli(at)); waited > c.cfg.ContinueWaitMax {
		return continuation{lostHost: lost, why: fmt.Sprintf("no instance of provider %s continued it within %s (ContinueWaitMax, brood coordinator --continue-wait-max)", run.Value.Provider, c.cfg.ContinueWaitMax)}
	}
	// A dead host's reservations are charged in full by whoever ends its
	// part of the run (budget.go); the continuing host reserves its own.
	c.sweepRunBudgets(ctx, id, run.Value.RunID)
	dctx, cancel := context.WithTimeout(ctx, 2*c.cfg.ProviderAttemptTimeout)
	defer cancel()
	var reply protocol.ProviderStartReply
	host, err := c.dispatch(dctx, run.Value.Provider, protocol.OpProviderContinue, run.Value.RunID, func(deadline int64) any {
		return protocol.ProviderContinueRequest{
			RunID: run.Value.RunID, ChildID: id, Provider: run.Value.Provider, LeaseRevision: protocol.Seq(taken.Revision), Deadline: deadline, Header: h,
		}
	}, &reply)
	switch {
	case err == nil:
		c.log.Warn("run continued on another host after its host died", "run", run.Value.RunID, "session", id, "lostHost", lost, "host", host, "epoch", taken.Value.Epoch)
		return continuation{handled: true}
	case errors.Is(err, protocol.ErrInvalidArgument):
		return continuation{lostHost: lost, why: fmt.Sprintf("provider %s did not continue it: %v", run.Value.Provider, err)}
	}
	// No live instance (yet), or none answered in time, or the lease or
	// the run moved meanwhile (NOT_PENDING): the next sweep looks again.
	c.log.Info("a run whose host died waits for an instance to continue it", "run", run.Value.RunID, "session", id, "err", err)
	return continuation{handled: true}
}

// continuing reports whether the takeover of session id stops at cont: the
// run is continued or waits for an instance, or its log could not be
// fenced (logged; the next sweep tries again).
func (c *Coordinator) continuing(id string, cont continuation) bool {
	if cont.err != nil {
		c.closeFailed(id, cont.err)
		return true
	}
	return cont.handled
}

// lostOr is the host the takeover's agent/takeover names, else host.
func (cont continuation) lostOr(host string) string {
	if cont.lostHost != "" {
		return cont.lostHost
	}
	return host
}

// explain adds to a HOST_LOST result why the run was not continued.
func (cont continuation) explain(res *protocol.SubagentResult) {
	if cont.why != "" && res.ErrorCode == protocol.CodeHostLost {
		res.Diagnostic = protocol.TruncateDiagnostic(res.Diagnostic + "; " + cont.why)
	}
}

// keepOpenTurn is the closing of a takeover that continues the run: none,
// so only agent/takeover is written and the turn stays open.
func keepOpenTurn([]protocol.SessionEvent) ([]protocol.SessionEvent, error) { return nil, nil }

// takeoverOf finds the agent/takeover of fence's coordinator and epoch in
// events: when it was written (ms) and the host it names as lost.
func takeoverOf(events []protocol.SessionEvent, fence protocol.TakeoverData) (at int64, lost string, ok bool) {
	for i := len(events) - 1; i >= 0; i-- {
		if isTakeover(events[i], fence) {
			var d protocol.TakeoverData
			_ = events[i].Decode(&d)
			return events[i].Time, d.HostID, true
		}
	}
	return 0, "", false
}

// takeovers counts the agent/takeover records of events (a session's own
// events: ownEvents).
func takeovers(events []protocol.SessionEvent) int {
	n := 0
	for _, ev := range events {
		if ev.Type == protocol.EvAgentTakeover {
			n++
		}
	}
	return n
}

// takeoversIn counts the agent/takeover records of session id's own events
// (after its seed), for RunRecord.Takeovers; 0 when its header cannot be
// read.
func (c *Coordinator) takeoversIn(ctx context.Context, id string, events []protocol.SessionEvent) int {
	h, err := c.headers.get(ctx, c.st, id)
	if err != nil {
		return 0
	}
	return takeovers(ownEvents(events, h.SeedLength))
}

// ownEvents returns a session's own events: those after its seed of
// seedLength events (a fork child's; all of them without a seed). A seed
// is its parent's completed turns, so it holds no turn a takeover
// continues, but it may hold the parent's own agent/takeover records.
func ownEvents(events []protocol.SessionEvent, seedLength int64) []protocol.SessionEvent {
	if seedLength > 0 && seedLength <= int64(len(events)) {
		return events[seedLength:]
	}
	return events
}
