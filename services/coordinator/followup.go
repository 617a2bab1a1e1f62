package coordinator

// Messages to a continuable child (docs/design.md §7; docs/protocol.md §5):
// followups and reports into its inbox, routed by residency (a live
// activation claims them; a cold child is resumed), its state, and the
// interruption of its turn.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// childHeaderOf reads a child's header. An unknown id is NOT_RESUMABLE for
// a request that would deliver something (the seed's code), and NOT_FOUND
// for a read-only query (query true).
func (c *Coordinator) childHeaderOf(ctx context.Context, childID string, query bool) (protocol.SessionHeader, error) {
	if !protocol.ValidID(childID) {
		return protocol.SessionHeader{}, protocol.Errorf(protocol.CodeInvalidArgument, "childId must match ^[A-Za-z0-9_-]{1,64}$")
	}
	h, err := c.headers.get(ctx, c.st, childID)
	if errors.Is(err, store.ErrNotFound) {
		if query {
			return h, protocol.NewError(protocol.CodeNotFound, map[string]any{"what": "session " + childID})
		}
		return h, protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": childID, "reason": "no such session"})
	}
	if err != nil {
		return h, protocol.Errorf(protocol.CodeUnavailable, "read the header of %s: %w", childID, err)
	}
	return h, nil
}

// continuableFollowup routes a message by residency only: resident (running
// or waiting) → into the inbox, where the activation claims it as its next
// turn; none → into the inbox, then a cold resume that claims it. FIFO per
// child; an idempotency key makes a retry count once. The reply waits for
// no read of the lease bucket unless the followup is refused: a child the
// replica's cache does not show live is checked for a resume (descriptor,
// provider) and accepted, and the bucket decides after the reply whether it
// is resumed (resumeOffPath; issue 12, point 3).
func (c *Coordinator) continuableFollowup(ctx context.Context, req rpc.Request, r protocol.FollowupRequest) (protocol.FollowupReply, error) {
	began := time.Now()
	h, parent, err := c.childFor(ctx, r.ChildID, r.Authority, false)
	if err != nil {
		if notAChild(err) {
			if e, ok := c.queuedChild(ctx, r.ChildID, r.Authority); ok {
				return protocol.FollowupReply{}, queuedFollowup(e)
			}
		}
		return protocol.FollowupReply{}, err
	}
	if r.IdempotencyKey != "" && !protocol.ValidID(r.IdempotencyKey) {
		return protocol.FollowupReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "idempotencyKey must match ^[A-Za-z0-9_-]{1,64}$")
	}
	if err := c.checkPrompt(r.Message); err != nil {
		return protocol.FollowupReply{}, err
	}
	up, err := c.lineage(ctx, h)
	if err != nil {
		return protocol.FollowupReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the lineage: %w", err)
	}
	// Nothing under an ended one-shot run starts work again (a parent's end,
	// internal/worker/ending.go). A live parent has no ended ancestor, so
	// only a user grant's followup needs the check.
	if parent == nil {
		if err := c.endedAncestor(ctx, h.ID, up); err != nil {
			return protocol.FollowupReply{}, err
		}
	}
	// A drain holds admission closed: the message is accepted and waits
	// (never dropped), and runs once the drain is lifted (the liveness sweep
	// resumes the child then). Upstream refused it with DRAINING; its inbox
	// was not durable, so there was nothing to hold it in.
	held := c.drainingFor(append(up, h.ID))
	lease, desc, err := c.routeFollowup(ctx, h, held)
	if err != nil {
		return protocol.FollowupReply{}, err
	}
	// A live continuable parent owns the child before it runs the work,
	// whoever sends it (wakes.go).
	owner, err := c.wakeOwner(ctx, h, parent)
	if err != nil {
		return protocol.FollowupReply{}, err
	}
	src := followupSource(h, parent != nil, r.Source)
	mid, _, err := c.st.Enqueue(ctx, h.Scope(), h.ID, store.InboxItem{Content: r.Message, Source: src, Delivery: store.DeliveryNextTurn}, r.IdempotencyKey)
	if err != nil {
		return protocol.FollowupReply{}, inboxError(err)
	}
	if held != "" {
		c.cfg.Metrics.FollowupAccepted(telemetry.RouteHeld, time.Since(began))
		return protocol.FollowupReply{MessageID: mid, Held: held}, nil
	}
	if lease == nil {
		c.resumeOffPath(ctx, h, desc, owner, time.Since(began))
		return protocol.FollowupReply{MessageID: mid}, nil
	}
	c.cfg.Metrics.FollowupAccepted(telemetry.RouteResident, time.Since(began))
	return protocol.FollowupReply{MessageID: mid}, nil
}

// routeFollowup decides where a followup to the child h goes, by the
// replica's lease cache (issue 12, point 3): a live activation it shows
// (lease) claims the message from the inbox. Else the child is taken to be
// cold and checked for a resume (its descriptor desc, its provider; a held
// drain, held, excuses a provider with no live host); whether it really is
// cold is read from the bucket after the reply (resumeOffPath), the
// decision to resume resting on that read. A refusal rests on the child
// being cold, so it is given only once the bucket shows no live activation
// (issue 16's rule); a live lease that is a one-shot run's is refused.
func (c *Coordinator) routeFollowup(ctx context.Context, h protocol.SessionHeader, held string) (*store.Record[protocol.AgentRecord], protocol.DescriptorData, error) {
	lease := c.residentCached(ctx, h.ID)
	var desc protocol.DescriptorData
	var err error
	if lease == nil {
		if desc, err = c.resumable(ctx, h); err == nil {
			if _, ok := c.reg.Provider(desc.Provider); !ok && held == "" {
				err = protocol.Errorf(protocol.CodeUnavailable, "no live host of provider %s can resume %s", desc.Provider, h.ID)
			}
		}
		if err != nil {
			refusal := err
			if lease, err = c.resident(ctx, h.ID); err != nil {
				return nil, desc, err
			}
			if lease == nil {
				return nil, desc, refusal
			}
		}
	}
	if lease != nil && lease.Value.Kind != protocol.AgentContinuable {
		return nil, desc, notContinuable(h.ID)
	}
	return lease, desc, nil
}

// followupSource is the provenance of a followup's message to h: the
// user's, or a relay of h's parent when a live parent sent it (byParent);
// the caller's own source, when it names one, is provenance only, never
// authority.
func followupSource(h protocol.SessionHeader, byParent bool, own *protocol.MessageSource) protocol.MessageSource {
	src := protocol.MessageSource{Kind: protocol.SourceUser}
	if byParent {
		src = protocol.MessageSource{Kind: protocol.SourceCoordinator, Form: "relay", SenderSessionID: h.ParentSession}
	}
	if own != nil && own.Kind != "" {
		src = *own
	}
	return src
}

// notAChild reports whether childFor's err says the id names no child the
// caller may see (UNAUTHORIZED, NOT_FOUND, NOT_RESUMABLE): a child whose
// start waits in its parent's queue answers so, having no session yet.
func notAChild(err error) bool {
	switch protocol.CodeOf(err) {
	case protocol.CodeUnauthorized, protocol.CodeNotFound, protocol.CodeNotResumable:
		return true
	}
	return false
}

// queuedFollowup refuses a followup to continuable child e while its start
// waits in its parent's queue (docs/protocol.md §5.5, "The start queue"):
// the child has no inbox yet. UNAVAILABLE: the same followup (its
// idempotencyKey) is accepted once the child started.
func queuedFollowup(e protocol.QueuedStart) error {
	return protocol.NewError(protocol.CodeUnavailable, map[string]any{"childId": e.ChildID, "state": protocol.StateQueued,
		"reason": "its start waits in its parent's start queue (the parent is at its live-children limit); it has no inbox until it starts: send the followup again once continuable.state no longer says queued"})
}

// queuedNeverStarted is continuable.state's answer for child rec.ChildID whose
// start was settled never started in its parent's queue: the error of its
// settlement (CANCELLED for a start disposed while it waited), naming its
// run (docs/protocol.md §8.3).
func queuedNeverStarted(rec protocol.RunRecord) error {
	res := rec.Result
	return &protocol.Error{Code: res.ErrorCode, Message: fmt.Sprintf("child %s never started: its start was settled in its parent's queue (run %s): %s", rec.ChildID, rec.RunID, res.Diagnostic),
		Details: map[string]any{"childId": rec.ChildID, "runId": rec.RunID}}
}

// notContinuable is a followup's refusal of a child whose live lease is a
// one-shot run's.
func notContinuable(id string) error {
	return protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": id, "reason": "it is a one-shot child"})
}

func (c *Coordinator) continuableState(ctx context.Context, req rpc.Request, r protocol.ChildRef) (protocol.StateReply, error) {
	h, _, err := c.childFor(ctx, r.ChildID, r.Authority, true)
	if err != nil {
		if !notAChild(err) {
			return protocol.StateReply{}, err
		}
		// A child whose start waits in its parent's queue has no session
		// yet (startqueue.go).
		if _, ok := c.queuedChild(ctx, r.ChildID, r.Authority); ok {
			return protocol.StateReply{ChildID: r.ChildID, State: protocol.StateQueued}, nil
		}
		// Nor does one whose start left the queue settled never started
		// (disposed there): its settlement's code answers, as runs.await
		// of the child id tells it.
		if rec, lerr := c.loadRun(ctx, protocol.RunRef{RunID: r.ChildID, Parent: r.Authority.Parent, Grant: r.Authority.Grant}); lerr == nil && rec.Value.NotStarted && rec.Value.Result != nil {
			return protocol.StateReply{}, queuedNeverStarted(rec.Value)
		}
		return protocol.StateReply{}, err
	}
	queued, err := c.st.InboxOf(h.Scope(), h.ID).Count(ctx)
	if err != nil {
		return protocol.StateReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the inbox of %s: %w", h.ID, err)
	}
	l, err := c.st.Lease(ctx, h.ID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (l.Value.Kind != protocol.AgentContinuable || !c.leaseLive(l.Value))) {
		if err == nil && l.Value.Kind == protocol.AgentOneShot {
			return protocol.StateReply{}, oneShotHasNoState(h.ID) // running, before its index entry is written
		}
		if err := c.refuseOneShot(ctx, h); err != nil {
			return protocol.StateReply{}, err
		}
		return protocol.StateReply{ChildID: h.ID, State: protocol.StateNone, Queued: queued}, nil
	}
	if err != nil {
		return protocol.StateReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the lease: %w", err)
	}
	var st protocol.StateReply
	hctx, cancel := context.WithTimeout(ctx, HostCallTimeout)
	defer cancel()
	if err := c.callHost(hctx, l.Value.HostID, c.subj.Host(l.Value.HostID, protocol.OpHostState), protocol.HostChildRequest{ChildID: h.ID}, &st); err != nil {
		return protocol.StateReply{}, c.hostSilent(err, l.Value.HostID, h.ID)
	}
	st.Queued = queued
	return st, nil
}

// hostSilent says what a host's silence means to a caller asking about
// child (UNAVAILABLE, its cause kept): its lease is live until its host's
// heartbeat is HostExpiry old, so a host killed a moment ago is asked and
// does not answer until a coordinator takes child over. It said "nobody
// serves brood.v1.host.<id>.state" after a kill -9 of brood dev.
func (c *Coordinator) hostSilent(err error, hostID, child string) error {
	if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return protocol.Errorf(protocol.CodeUnavailable,
		"the host %s of %s does not answer: if it stopped, a coordinator takes %s over once its last heartbeat is %s old; ask again then (%v)",
		hostID, child, child, c.cfg.HostExpiry, err).WithCause(err)
}

// refuseOneShot answers INVALID_ARGUMENT for a one-shot child: it has no
// residency to report, and `none` would read as "idle, resumable".
func (c *Coordinator) refuseOneShot(ctx context.Context, h protocol.SessionHeader) error {
	e, err := c.st.ChildIndexEntry(ctx, h.ParentSession, h.ID)
	if err != nil || e.Mode != protocol.ModeOneShot {
		return nil // unindexed yet or unreadable: report what the lease says
	}
	return oneShotHasNoState(h.ID)
}

func oneShotHasNoState(id string) error {
	return protocol.Errorf(protocol.CodeInvalidArgument,
		"session %s is a one-shot child, not a continuable one: it has no activation state (`brood result %s` or runs.await tell how it ended)", id, id)
}

// continuableInterrupt stops the target's current turn only and parks its
// queue (docs/upstream-behaviour.md §5.11): a user grant, or a live ancestor of the
// target. An absent target is an accepted no-op.
func (c *Coordinator) continuableInterrupt(ctx context.Context, req rpc.Request, r protocol.InterruptRequest) (protocol.InterruptReply, error) {
	if !protocol.ValidID(r.ChildID) {
		return protocol.InterruptReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "childId must match ^[A-Za-z0-9_-]{1,64}$")
	}
	cause := protocol.CauseUser
	var caller string
	switch {
	case r.Authority.Grant != "":
		g, err := c.grantOf(ctx, r.Authority.Grant)
		if err != nil {
			return protocol.InterruptReply{}, err
		}
		if !g.all {
			// A grant of one user interrupts only in that user's trees; an
			// unknown child answers alike.
			if ok, err := c.covers(ctx, reader{grant: g}, r.ChildID); err != nil || !ok {
				if err != nil {
					return protocol.InterruptReply{}, err
				}
				return protocol.InterruptReply{}, notCovered(g, r.ChildID)
			}
		} else if _, err := c.childHeaderOf(ctx, r.ChildID, true); err != nil {
			// A grant over every session learns that an id names no
			// session (NOT_FOUND, as continuable.state answers it;
			// docs/protocol.md §5.11), rather than "nothing to stop".
			return protocol.InterruptReply{}, err
		}
	case r.Authority.Parent != nil:
		if _, err := c.authorize(ctx, *r.Authority.Parent); err != nil {
			return protocol.InterruptReply{}, err
		}
		caller, cause = r.Authority.Parent.SessionID, protocol.CauseParent
		if caller == r.ChildID {
			return protocol.InterruptReply{}, protocol.Errorf(protocol.CodeUnauthorized, "an agent cannot interrupt itself")
		}
		// The ancestry comes from the headers, live or not: a caller
		// that is not an ancestor is refused whether or not anything runs
		// (chaos seed 1: another root's interrupt of an idle child was
		// answered as if it had authority), and whether or not the child
		// exists (authority before existence).
		h, err := c.childHeaderOf(ctx, r.ChildID, true)
		if errors.Is(err, protocol.ErrNotFound) {
			return protocol.InterruptReply{}, protocol.Errorf(protocol.CodeUnauthorized, "session %s is not an ancestor of %s (or %s does not exist)", caller, r.ChildID, r.ChildID)
		}
		if err != nil {
			return protocol.InterruptReply{}, err
		}
		up, err := c.lineage(ctx, h)
		if err != nil {
			return protocol.InterruptReply{}, protocol.Errorf(protocol.CodeUnavailable, "read the ancestry of %s: %w", r.ChildID, err)
		}
		if !contains(up, caller) {
			return protocol.InterruptReply{}, protocol.Errorf(protocol.CodeUnauthorized, "session %s is not an ancestor of %s", caller, r.ChildID)
		}
	default:
		return protocol.InterruptReply{}, protocol.Errorf(protocol.CodeUnauthorized, "an ancestor's credential or a user grant is required")
	}
	l, err := c.st.Lease(ctx, r.ChildID)
	if err != nil || l.Value.Kind != protocol.AgentContinuable || !c.leaseLive(l.Value) {
		return protocol.InterruptReply{ChildID: r.ChildID}, nil // absent, one-shot or settled: nothing to stop
	}
	hctx, cancel := context.WithTimeout(ctx, HostCallTimeout)
	defer cancel()
	if err := c.callHost(hctx, l.Value.HostID, c.subj.Host(l.Value.HostID, protocol.OpHostInterrupt), protocol.HostChildRequest{ChildID: r.ChildID, Cause: cause}, nil); err != nil {
		return protocol.InterruptReply{}, err
	}
	return protocol.InterruptReply{ChildID: r.ChildID, Interrupted: true}, nil
}

// continuableReport sends a child's report to its live parent, joining the
// parent's next step (docs/upstream-behaviour.md §5.13).
func (c *Coordinator) continuableReport(ctx context.Context, req rpc.Request, r protocol.ReportRequest) (protocol.FollowupReply, error) {
	l, err := c.authorize(ctx, r.Child)
	if err != nil {
		return protocol.FollowupReply{}, err
	}
	if l.rec.Kind != protocol.AgentContinuable {
		return protocol.FollowupReply{}, protocol.Errorf(protocol.CodeUnauthorized, "only a resident continuable child reports to its parent")
	}
	if err := c.checkPrompt(r.Content); err != nil {
		return protocol.FollowupReply{}, err
	}
	parent := l.rec.ParentSession
	pl, err := c.st.Lease(ctx, parent)
	if err != nil || !c.leaseLive(pl.Value) {
		return protocol.FollowupReply{}, protocol.Errorf(protocol.CodeParentUnavailable, "parent %s is not live", parent)
	}
	ph, err := c.headers.get(ctx, c.st, parent)
	if err != nil {
		return protocol.FollowupReply{}, protocol.Errorf(protocol.CodeParentUnavailable, "parent %s: %v", parent, err)
	}
	content := append([]protocol.ContentBlock{{Type: protocol.BlockText, Text: fmt.Sprintf("Subagent %s reported:", r.Child.SessionID)}}, r.Content...)
	mid, _, err := c.st.Enqueue(ctx, ph.Scope(), parent, store.InboxItem{
		Content:  content,
		Source:   protocol.MessageSource{Kind: protocol.SourceSubagentReport, Form: "relay", SenderSessionID: r.Child.SessionID},
		Delivery: store.DeliveryNextStep,
	}, "")
	if err != nil {
		return protocol.FollowupReply{}, protocol.NewError(protocol.CodeParentUnavailable, map[string]any{"reason": "the parent's inbox refused the report: " + err.Error()})
	}
	return protocol.FollowupReply{MessageID: mid}, nil
}
