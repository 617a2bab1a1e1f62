package agent

import (
	"context"
	"errors"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Operations an agent starts on its turn's behalf (a background start, a
// message to a child, the dispose of a foreground child) are carried out
// by the coordinator once it received them, whether or not their caller
// still listens: a request cut by the turn's own cancellation (an
// interrupt, a drain, the parent's end) may still start the child or queue
// the message. So the turn's cancellation never cuts them: each is sent on
// a context without it (onTurnsBehalf: the turn's values, its trace, kept;
// TurnOpTimeout its bound), under an id chosen before the first send (the
// child's id, an idempotency key), and when no answer came in time the
// agent asks again by that id and reports what the coordinator holds, never
// "not started" for a child that runs (issue 37, item 7).

// TurnOpTimeout bounds one request an agent makes on its turn's behalf,
// whether or not the turn was cancelled meanwhile.
const TurnOpTimeout = 30 * time.Second

// turnOpRereadTimeout bounds the read, by its id, of what an operation
// whose answer did not come did.
const turnOpRereadTimeout = 10 * time.Second

// onTurnsBehalf returns the context of a request made on the turn's behalf
// (ctx the turn's): its values without its cancellation, for TurnOpTimeout.
func onTurnsBehalf(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), TurnOpTimeout)
}

// unanswered reports whether err leaves the outcome of a request unknown:
// no answer came (UNAVAILABLE from the transport, CANCELLED), as opposed
// to the coordinator's refusal.
func unanswered(err error) bool {
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		return true
	}
	return pe.Code == protocol.CodeUnavailable || pe.Code == protocol.CodeCancelled
}

// startContinuable starts a continuable child for the turn (its id chosen
// here), and returns the reply; when no answer came, it reads the child's
// state by that id: a child that exists (running, or with its prompt
// queued) was started, and that is the reply.
func startContinuable(ctx context.Context, cl *client.Client, req protocol.ContinuableStartRequest) (protocol.ContinuableStartReply, error) {
	req.ChildID = ulid.Make().String()
	octx, cancel := onTurnsBehalf(ctx)
	defer cancel()
	r, err := cl.StartContinuable(octx, req)
	if err == nil || !unanswered(err) {
		return r, err
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), turnOpRereadTimeout)
	defer rcancel()
	parent := req.Parent
	st, serr := cl.State(rctx, protocol.ChildRef{ChildID: req.ChildID, Authority: protocol.Authority{Parent: &parent}})
	if serr == nil && (st.State != protocol.StateNone || st.Queued > 0) {
		return protocol.ContinuableStartReply{ChildID: req.ChildID}, nil
	}
	return r, err
}

// followup sends a message to a child for the turn under an idempotency
// key chosen here; when no answer came, it sends it again under that key:
// a message that was queued answers its messageId (docs/protocol.md §5.9),
// so the reply says what the coordinator holds.
func followup(ctx context.Context, cl *client.Client, req protocol.FollowupRequest) (protocol.FollowupReply, error) {
	req.IdempotencyKey = ulid.Make().String()
	octx, cancel := onTurnsBehalf(ctx)
	defer cancel()
	r, err := cl.Followup(octx, req)
	if err == nil || !unanswered(err) {
		return r, err
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), turnOpRereadTimeout)
	defer rcancel()
	if again, aerr := cl.Followup(rctx, req); aerr == nil {
		return again, nil
	}
	return r, err
}

// disposeRun disposes a foreground child for the turn; when no answer
// came, it reads the run's status (runs.await): a run that settled is
// reported as it ended.
func disposeRun(ctx context.Context, cl *client.Client, run *client.Run, parent protocol.ParentRef) (protocol.RunStatus, error) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SubagentDisposeTimeout)
	defer cancel()
	st, err := run.Dispose(octx)
	if err == nil || !unanswered(err) {
		return st, err
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), turnOpRereadTimeout)
	defer rcancel()
	if again, aerr := cl.Await(rctx, protocol.RunRef{RunID: run.RunID, Parent: &parent}); aerr == nil && again.Result != nil {
		return again, nil
	}
	return st, err
}
