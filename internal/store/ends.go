package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The end of a run or of an epoch, as its settlement winner publishes it
// (docs/design.md §7; order.go). Hosts publish the ends they settled; a
// coordinator publishes the ends it settled on HOST_LOST, and publishes
// again the end of a record it finds settled under a dead host's lease (the
// host may have died before it published): both are idempotent (subagent/end
// and the settlement notice carry ids; a caller's RunNotice comes at least
// once, always with the same result). An end is published before its lease
// is released, so a winner that dies in between is taken over and its end
// published again.

// NoticeFunc delivers the settled run rec's RunNotice: PublishRunNotice
// (a coordinator, which may publish on every notify subject) or
// RequestRunNotice (a host, which asks the coordinators to). Failures go
// to onErr.
type NoticeFunc func(rec protocol.RunRecord, onErr func(error))

// PublishRunEnd emits subagent/end for the settled run rec, then delivers
// its RunNotice with notice (NoticeFunc). The end event goes first,
// on the same connection, so the events stream holds it before anything a
// caller does once it has the result (the next run's subagent/start):
// readers of the events see them in causal order. Failures go to onErr.
// A run settled never started had no subagent/start: it gets the notice
// only. The channel is closed once subagent/end is stored (or given up on,
// after AsyncBudget): the publisher releases the lease only then, so a
// publisher that dies first leaves the lease to a takeover, which publishes
// the end again (chaos seed 1 of make test: a worker killed -9 between its
// release and its end's acknowledgement; the end was never stored).
func (s *Store) PublishRunEnd(rec protocol.RunRecord, notice NoticeFunc, onErr func(error)) <-chan struct{} {
	res := *rec.Result
	if rec.NotStarted { // no subagent/start, so no subagent/end: the notice only
		notice(rec, onErr)
		return closedChan()
	}
	ev := protocol.LifecycleEvent{
		Type: protocol.LifecycleEnd, RunID: rec.RunID, Provider: rec.Provider, ID: rec.ChildID,
		ParentSession: rec.ParentSession, Local: !rec.Remote, Mode: rec.Mode, Time: NowMs(),
		StopReason: res.StopReason, ErrorCode: res.ErrorCode, Usage: res.Usage, Takeovers: rec.Takeovers,
	}
	if len(res.Output) > 0 {
		ev.LastAssistantMessage = res.Output
	}
	done := s.PublishEvent(ev, onErr)
	notice(rec, onErr)
	return done
}

func closedChan() <-chan struct{} {
	done := make(chan struct{})
	close(done)
	return done
}

// StartAgainMargin is kept back from the events stream's duplicate window
// by PublishStartAgain.
const StartAgainMargin = 30 * time.Second

// PublishStartAgain publishes a run's subagent/start once more, for a party
// about to publish the run's end that cannot tell whether the first start
// was stored: a coordinator settling a run or epoch taken over from a host
// that may have died before its start was stored (chaos seed 1 of make
// test: a subagent/end with no subagent/start). The copy carries the first
// one's Nats-Msg-Id, so within the stream's duplicate window it is stored
// only if the first one is not; a run created longer ago than the window
// less StartAgainMargin gets no copy (its host stored its start, or gave up
// on it, long before), so no start is ever stored twice, and neither does a
// run that never started. The channel is closed once the copy is stored or
// given up on, or at once when none is sent: publish the end after it.
func (s *Store) PublishStartAgain(rec protocol.RunRecord, onErr func(error)) <-chan struct{} {
	if rec.NotStarted || time.Since(time.UnixMilli(rec.CreatedAt)) > s.Cfg.DuplicateWindow-StartAgainMargin {
		return closedChan()
	}
	return s.PublishEvent(protocol.LifecycleEvent{
		Type: protocol.LifecycleStart, RunID: rec.RunID, Provider: rec.Provider, ID: rec.ChildID,
		ParentSession: rec.ParentSession, Local: !rec.Remote, Mode: rec.Mode, Time: rec.CreatedAt,
	}, onErr)
}

// RequestRunNotice asks the coordinators to publish the settled run rec's
// RunNotice (none when it has no notify subject): a message with no payload
// on protocol.Subjects.Notice(rec.Provider, rec.RunID), which a coordinator
// answers by publishing what the run's records hold (PublishRunNotice),
// never what the host says. A host publishes no notice itself: a deployment
// lets no worker publish on a client's inbox (docs/security.md). A request
// no coordinator takes loses the notice, as a notice the caller missed is
// lost: the caller asks runs.await (pkg/client's AwaitFallback).
func (s *Store) RequestRunNotice(rec protocol.RunRecord, onErr func(error)) {
	if rec.Notify == "" {
		return
	}
	if err := s.NC.Publish(s.Subj.Notice(rec.Provider, rec.RunID), nil); err != nil {
		onErr(fmt.Errorf("ask for the notice of run %s: %w", rec.RunID, err))
	}
}

// PublishRunNotice publishes the settled run rec's RunNotice to its notify
// subject (none: nothing), in the encoding of the start request (JSON when
// rec.NotifyJSON, else MessagePack). A run settled never started has no
// subagent/end, only this notice. Coordinators publish notices; hosts ask
// them to (RequestRunNotice).
func (s *Store) PublishRunNotice(rec protocol.RunRecord, onErr func(error)) {
	if rec.Notify == "" {
		return
	}
	enc := protocol.Msgpack
	if rec.NotifyJSON {
		enc = protocol.JSON
	}
	data, err := protocol.Marshal(enc, protocol.RunNotice{
		RunID: rec.RunID, ChildID: rec.ChildID, ParentSession: rec.ParentSession, Provider: rec.Provider, Result: *rec.Result,
	})
	if err == nil {
		err = s.NC.PublishMsg(&nats.Msg{Subject: rec.Notify, Data: data, Header: nats.Header{
			protocol.HeaderContentType: []string{enc.ContentType()}}})
	}
	if err != nil {
		onErr(fmt.Errorf("notify %s: %w", rec.Notify, err))
	}
}

// ErrOwnershipKept marks EndEpoch's report (to onErr) of an ownership edge
// it could not remove. The caller must not let it go: the owner cannot
// settle while the edge lists the child, so an edge left behind keeps the
// owner's epoch waiting for good (make test's chaos seed 1: an epoch
// running with its lease held by a live host, its removal cut off during a
// leader election). The caller keeps the child's lease and tries
// ReleaseOwnership again before it releases the lease.
var ErrOwnershipKept = errors.New("the ownership edge was not removed")

// ReleaseOwnership removes the edge owner → child (RemoveOwnership) and
// wakes the owner.
func (s *Store) ReleaseOwnership(ctx context.Context, owner, child string) error {
	if err := s.RemoveOwnership(ctx, owner, child); err != nil {
		return err
	}
	if scope, err := s.SessionScope(ctx, owner); err == nil && scope != "" {
		s.wake(scope, owner) // best effort (wake)
	}
	return nil
}

// EpochEnd is what the end of a continuable child's epoch publishes.
type EpochEnd struct {
	ChildID, Parent, Owner, RunID, Provider string
	Remote                                  bool
	Result                                  protocol.SubagentResult
	// AncestorEnded: an ancestor of the child is an ended one-shot run
	// (EndedAncestor), so the parent, under it too, is being disposed by
	// its end and gets no notice (internal/worker/ending.go).
	AncestorEnded bool
	// Takeovers counts the agent/takeover records of the epoch's events:
	// the times its host was lost and the epoch continued on another
	// (docs/protocol.md §8.4); subagent/end carries it.
	Takeovers int64
	// Delegate, for a host, asks the coordinators to carry out the
	// notice and the ownership release (EndEpochRecords), which write
	// records only coordinators write (another session's inbox, ownership
	// records; protocol.Subjects.EpochEnd); owner is cmp.Or(Owner, Parent).
	// Nil: this store carries them out itself (a coordinator).
	Delegate func(ctx context.Context, owner string) error
}

// EndEpoch delivers the subagent-settled notice to the live parent and
// removes the ownership edge (EndEpochRecords; for a host, e.Delegate asks
// the coordinators to), then emits subagent/end (docs/design.md §7, Ownership).
// Hosts and coordinators (HOST_LOST) both use it. Failures go to onErr (an
// edge not removed, or a delegation that failed, as ErrOwnershipKept); the
// later steps are still taken. The channel is closed once subagent/end is
// stored (or given up on): release the lease only then (PublishRunEnd).
func (s *Store) EndEpoch(ctx context.Context, e EpochEnd, onErr func(error)) <-chan struct{} {
	if e.Delegate == nil {
		s.EndEpochRecords(ctx, e, onErr)
	} else if owner := cmp.Or(e.Owner, e.Parent); owner != "" {
		if err := e.Delegate(ctx, owner); err != nil {
			onErr(fmt.Errorf("%w: the end of epoch %s (its notice, the ownership of %s by %s): %w", ErrOwnershipKept, e.RunID, e.ChildID, owner, err))
		}
	}
	ev := protocol.LifecycleEvent{
		Type: protocol.LifecycleEnd, RunID: e.RunID, Provider: e.Provider, ID: e.ChildID, ParentSession: e.Parent,
		Local: !e.Remote, Mode: protocol.ModeContinuable, Time: NowMs(), StopReason: e.Result.StopReason, ErrorCode: e.Result.ErrorCode,
		Usage: e.Result.Usage, Takeovers: e.Takeovers,
	}
	if len(e.Result.Output) > 0 {
		ev.LastAssistantMessage = e.Result.Output
	}
	return s.PublishEvent(ev, onErr)
}

// EndEpochRecords is the part of an epoch's end that writes records only
// coordinators write: it delivers the subagent-settled notice to the live
// parent (inbox, next step, idempotency key settled-<runId>), then removes
// the ownership edge from the owner's record (the parent's, when the epoch
// names no owner) and wakes the owner. A parent that is gone or ending
// gets no notice (its turn is over), nor does one under an ended one-shot
// ancestor (e.AncestorEnded): that ancestor's end disposes it, and nothing
// under an ended run starts work again (RELIABILITY.md I5). Failures go to
// onErr (an edge not removed as ErrOwnershipKept); the removal is still
// tried after a failed notice. Every step is idempotent.
func (s *Store) EndEpochRecords(ctx context.Context, e EpochEnd, onErr func(error)) {
	if e.Parent != "" && !e.AncestorEnded {
		if p, err := s.LeaseLatest(ctx, e.Parent); err == nil && !p.Value.Ending {
			summary, content := sessionlog.SettledNotice(e.ChildID, e.Result)
			scope, err := s.SessionScope(ctx, e.Parent)
			if err == nil && scope == "" {
				err = fmt.Errorf("the parent %s has no header", e.Parent)
			}
			if err == nil {
				_, _, err = s.Enqueue(ctx, scope, e.Parent, InboxItem{
					Content:  content,
					Source:   protocol.MessageSource{Kind: protocol.SourceSubagentSettled, Form: "notice", Summary: summary, SenderSessionID: e.ChildID, Usage: e.Result.Usage},
					Delivery: DeliveryNextStep,
				}, "settled-"+e.RunID)
			}
			if err != nil {
				onErr(fmt.Errorf("settlement notice to %s: %w", e.Parent, err))
			}
		}
	}
	// The parent's edge goes even when the epoch names no owner: a cold
	// resume registers the edge before it activates, and a resume that
	// failed keeps it for the epoch that eventually runs the child, which
	// the liveness sweep may start with no owner (the parent was not live
	// then); left behind, it kept the parent's next epoch waiting for good
	// (TestYourProviderUnderFaults: I6, an epoch running with its lease held
	// by a live host). Removal is idempotent: a parent that owns nothing
	// costs one read.
	if owner := cmp.Or(e.Owner, e.Parent); owner != "" {
		if err := s.ReleaseOwnership(ctx, owner, e.ChildID); err != nil {
			onErr(fmt.Errorf("%w: release ownership of %s by %s: %w", ErrOwnershipKept, e.ChildID, owner, err))
		}
	}
}
