package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// noticeReadWaitMax bounds how long a coordinator keeps reading a run whose
// host asked for its notice (a leader election of the runs bucket makes a
// read fail for a few seconds); past it the notice is given up on and the
// caller falls back to runs.await, as for any notice it missed.
const noticeReadWaitMax = 10 * time.Second

// noticeReadRetry is the pause between two reads of such a run.
const noticeReadRetry = 100 * time.Millisecond

// relayNotice serves protocol.Subjects.Notice, <p>.v1.notice.<provider>.<runId>
// (queue group CoordinatorQueue, no reply): a host that settled run runId of
// provider asks for its RunNotice (store.RequestRunNotice). The coordinator
// takes the run as its runs watch saw it settle (runindex.Index.EndedRecord), or
// else reads it from the bucket's leader (store.RunLatest): its spec, which
// only coordinators write, joined with its state under the spec's provider;
// and it publishes the notice the records hold to the spec's notify subject
// (store.PublishRunNotice). A request naming another provider than the
// spec's, a run not settled, or one with no notify subject publishes
// nothing. So a worker, which may publish on no client's inbox
// (docs/security.md), can make a coordinator publish only the true notice
// of a settled run of its own provider, again: a client drops a notice
// whose run it no longer waits for.
func (c *Coordinator) relayNotice(ctx context.Context, req rpc.Request) (any, error) {
	provider, runID, ok := c.subj.NoticeOf(req.Subject())
	if !ok {
		return nil, nil
	}
	publish := func(rec protocol.RunRecord) {
		if rec.Provider != provider || rec.State != protocol.RunSettled || rec.Result == nil {
			c.log.Debug("notice request for a run that has no notice to publish", "run", runID, "provider", provider, "state", rec.State)
			return
		}
		c.st.PublishRunNotice(rec, func(err error) { c.log.Warn("run notice not published", "run", runID, "err", err) })
	}
	// The settlement is usually here already: the runs watch delivers it
	// as the host learns it landed, before the host asks (a settled state
	// never changes, so it is what the leader would answer).
	if rec, ok := c.runs.EndedRecord(runID); ok {
		publish(rec)
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, noticeReadWaitMax)
	defer cancel()
	for {
		run, err := c.st.RunLatest(ctx, runID)
		if err == nil {
			publish(run.Value)
			return nil, nil
		}
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			c.log.Warn("run notice not published: its run was not read", "run", runID, "err", err)
			return nil, nil
		case <-time.After(noticeReadRetry):
		}
	}
}
