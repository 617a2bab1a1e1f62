package coordinator

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Finding a run or child while it waits in its parent's start queue, and
// disposing of it there (startqueue.go has the queue).

// queuedRun finds run runID (or a queued start's child id) in
// parent's start queue: a run record of state RunQueued, or found false;
// queues reports that parent has a start queue.
func (c *Coordinator) queuedRun(ctx context.Context, parent, runID string) (_ protocol.RunRecord, found, queues bool) {
	cur, err := c.st.StartQueue(ctx, parent)
	if err != nil {
		return protocol.RunRecord{}, false, !errors.Is(err, store.ErrNotFound)
	}
	for _, e := range cur.Value.Entries {
		// Or named by its child id: a queued continuable child's first
		// epoch's run id is the coordinator's until it starts, and a
		// remote run's child is listed by its own id (children.list).
		if e.RunID == runID || e.ChildID == runID {
			return protocol.RunRecord{RunID: e.RunID, ChildID: e.ChildID, ParentSession: parent, Provider: e.Provider,
				Mode: queuedMode(e), State: protocol.RunQueued, CreatedAt: e.QueuedAt}, true, true
		}
	}
	return protocol.RunRecord{}, false, true
}

// queueLeftWait bounds how long loadRun waits for the record of a run
// found neither recorded nor queued under a parent that has a start queue:
// an entry leaves the queue (admitted, or disposed by a concurrent
// request) a moment before its run's record is written.
const queueLeftWait = 2 * time.Second

// runLeftQueue reads run runID's record from the leader until it is there
// or queueLeftWait passed (store.ErrNotFound then).
func (c *Coordinator) runLeftQueue(ctx context.Context, runID string) (store.Record[protocol.RunRecord], error) {
	deadline := time.Now().Add(queueLeftWait)
	for {
		rec, err := c.st.RunLatest(ctx, runID)
		if !errors.Is(err, store.ErrNotFound) || !time.Now().Before(deadline) {
			return rec, err
		}
		select {
		case <-ctx.Done():
			return rec, err
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// queuedRows are the children.list rows of parent's queued starts, oldest
// first: state queued, the mode of the child each makes.
func (c *Coordinator) queuedRows(ctx context.Context, parent string) []protocol.ChildRow {
	if !c.agents.hasQueue(parent) {
		return nil
	}
	cur, err := c.st.StartQueue(ctx, parent)
	if err != nil {
		return nil
	}
	rows := make([]protocol.ChildRow, 0, len(cur.Value.Entries))
	for _, e := range cur.Value.Entries {
		rows = append(rows, protocol.ChildRow{Kind: protocol.RowChild, ID: e.ChildID, Activity: protocol.ActivityInactive, State: protocol.RunQueued, Mode: queuedMode(e),
			Provider: e.Provider, Label: e.Options.Label, CreatedAt: e.QueuedAt})
	}
	return rows
}

// disposeQueued disposes a queued run q: its entry leaves the queue and
// the run is settled never started, cancelled (its caller notified, its
// budget charge given back). An entry a replica is admitting now is
// disposed as a started run once its record is there.
func (c *Coordinator) disposeQueued(ctx context.Context, q protocol.RunRecord) (protocol.RunStatus, error) {
	var removed *protocol.QueuedStart
	err := c.updateQueue(ctx, q.ParentSession, func(rec *protocol.StartQueueRecord) (bool, error) {
		removed = nil
		i := slices.IndexFunc(rec.Entries, func(e protocol.QueuedStart) bool { return e.RunID == q.RunID })
		if i < 0 || rec.Entries[i].AdmittingBy != "" {
			return false, nil
		}
		e := rec.Entries[i]
		removed = &e
		rec.Entries = slices.Delete(rec.Entries, i, i+1)
		return true, nil
	})
	if err != nil {
		return protocol.RunStatus{}, err
	}
	if removed != nil {
		c.settleQueued(ctx, q.ParentSession, *removed, protocol.NewError(protocol.CodeCancelled, map[string]any{"reason": "the run was disposed while its start waited in its parent's queue"}))
	}
	run, err := c.st.RunLatest(ctx, q.RunID)
	for wait := time.Now().Add(c.disposeWait()); errors.Is(err, store.ErrNotFound) && time.Now().Before(wait); run, err = c.st.RunLatest(ctx, q.RunID) {
		select {
		case <-ctx.Done():
			return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "dispose queued run %s: %w", q.RunID, ctx.Err())
		case <-time.After(queuedPollInterval):
		}
	}
	if err != nil {
		return protocol.RunStatus{}, protocol.Errorf(protocol.CodeUnavailable, "read run %s: %w", q.RunID, err)
	}
	if run.Value.State == protocol.RunSettled {
		return status(run.Value), nil
	}
	return c.disposeRun(ctx, run.Value, protocol.CauseDisposed)
}

// queuedChild finds continuable child childID while its start waits in its
// parent's queue, asked with auth: its parent's credential, or a user
// grant covering the parent's tree (as for a started child). ok is false
// when it is not queued there (or auth may not see it: the caller answers
// as for an unknown child).
func (c *Coordinator) queuedChild(ctx context.Context, childID string, auth protocol.Authority) (e protocol.QueuedStart, ok bool) {
	parent := c.agents.queuedParentOf(childID)
	switch {
	case auth.Grant != "":
		g, err := c.grantOf(ctx, auth.Grant)
		if err != nil || parent == "" || c.grantCoversQueued(ctx, g, auth.Grant, parent, func() error { return errHidden }) != nil {
			return e, false
		}
	case auth.Parent != nil:
		if parent != auth.Parent.SessionID && !c.agents.hasQueue(auth.Parent.SessionID) {
			return e, false
		}
		if _, err := c.authorize(ctx, *auth.Parent); err != nil {
			return e, false
		}
		parent = auth.Parent.SessionID
	default:
		return e, false
	}
	cur, err := c.st.StartQueue(ctx, parent)
	if err != nil {
		return e, false
	}
	for _, e := range cur.Value.Entries {
		if e.Continuable() && e.ChildID == childID {
			return e, true
		}
	}
	return e, false
}

// errHidden stands for the refusal queuedChild does not answer.
var errHidden = errors.New("not covered")
