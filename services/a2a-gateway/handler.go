package a2agateway

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/brood-dev/brood/pkg/protocol"
)

// More limits of the handler.
const (
	// cancelSettleTimeout bounds the wait, after a dispose answered, for the
	// cancelled turn's end to be read from the log.
	cancelSettleTimeout = 30 * time.Second
	// rootCloseTimeout bounds closing the root a new context was started from.
	rootCloseTimeout = 5 * time.Second
	// eventsScanPagesMax bounds the lifecycle-event pages one ListTasks
	// without a context reads (each page examines at most 4 096 events,
	// docs/protocol.md §5.16).
	eventsScanPagesMax = 64
	// labelWordsMax is how many words of the first message name a context.
	labelWordsMax = 8
)

// handler is a2asrv.RequestHandler for one provider's agent, acting as one
// caller's Brood user. It is made per HTTP request (after the bearer check)
// and holds nothing between requests.
type handler struct {
	g        *Gateway
	provider string
	caller   Caller
}

var _ a2asrv.RequestHandler = (*handler)(nil)

func (h *handler) conn(ctx context.Context) (*userConn, protocol.Authority, error) {
	u, err := h.g.user(h.caller)
	if err != nil {
		return nil, protocol.Authority{}, a2aErr(err)
	}
	auth, err := h.g.grant(ctx, u)
	if err != nil {
		return nil, protocol.Authority{}, a2aErr(err)
	}
	return u, auth, nil
}

// a2aErr maps a Brood error to the A2A error a caller gets, keeping the
// Brood code in the message and in details.broodCode. A session the caller
// may not act on is TaskNotFound, exactly as one that does not exist
// (authority before existence, docs/protocol.md §4).
func a2aErr(err error) error {
	if err == nil {
		return nil
	}
	var ae *a2a.Error
	if errors.As(err, &ae) {
		return err
	}
	code := protocol.CodeOf(err)
	var kind error
	switch code {
	case protocol.CodeUnauthorized, protocol.CodeNotFound:
		return a2a.NewError(a2a.ErrTaskNotFound, "TASK_NOT_FOUND: no such task or context for this caller").
			WithDetails(map[string]any{"broodCode": string(code)})
	case protocol.CodeInvalidArgument, protocol.CodeLimitExceeded, protocol.CodeInvalidPersona, protocol.CodeInvalidToolFilter, protocol.CodeDepthExceeded:
		kind = a2a.ErrInvalidParams
	case protocol.CodeNoProvider, protocol.CodeUnsupportedCapability, protocol.CodeNotResumable:
		kind = a2a.ErrUnsupportedOperation
	case protocol.CodeCancelled:
		kind = context.Canceled
	default:
		kind = a2a.ErrServerError
	}
	msg := err.Error()
	if code != "" && !strings.HasPrefix(msg, string(code)) {
		msg = string(code) + ": " + msg
	}
	return a2a.NewError(kind, msg).WithDetails(map[string]any{"broodCode": string(code)})
}

func notFound(what string) error {
	return a2a.NewError(a2a.ErrTaskNotFound, "TASK_NOT_FOUND: no such "+what+" for this caller")
}

// prompt checks an A2A message and returns its text: text parts only
// (Brood's content is text, docs/protocol.md §5.8), non-empty.
func prompt(m *a2a.Message) (string, error) {
	if m == nil {
		return "", a2a.NewError(a2a.ErrInvalidParams, "INVALID_ARGUMENT: message is required")
	}
	var b strings.Builder
	for _, p := range m.Parts {
		if p == nil {
			continue
		}
		if _, ok := p.Content.(a2a.Text); !ok {
			return "", a2a.NewError(a2a.ErrUnsupportedContentType, "INVALID_ARGUMENT: only text parts are accepted (Brood's content is text)")
		}
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString(p.Text())
	}
	if b.Len() > MessageBytesMax {
		return "", a2a.NewError(a2a.ErrInvalidParams, fmt.Sprintf("LIMIT_EXCEEDED: the message's text is %d bytes; the limit is %d", b.Len(), MessageBytesMax)).
			WithDetails(map[string]any{"broodCode": string(protocol.CodeLimitExceeded)})
	}
	if strings.TrimSpace(b.String()) == "" {
		return "", a2a.NewError(a2a.ErrInvalidParams, "INVALID_ARGUMENT: the message has no text")
	}
	return b.String(), nil
}

// send starts a task: a message without a contextId starts a new context (a
// root is opened for it, the continuable child started, the root closed: the
// child lives on as the user's); one with a contextId is a followup, the
// context's next task. A message naming a taskId would continue that task,
// which needs input-required (a pending approval or question): not in Brood
// yet, so it is refused (docs/a2a.md, "Seams").
func (h *handler) send(ctx context.Context, req *a2a.SendMessageRequest) (*userConn, protocol.Authority, *taskFold, error) {
	if req == nil {
		return nil, protocol.Authority{}, nil, a2a.NewError(a2a.ErrInvalidParams, "INVALID_ARGUMENT: no request")
	}
	text, err := prompt(req.Message)
	if err != nil {
		return nil, protocol.Authority{}, nil, err
	}
	if req.Message.TaskID != "" {
		return nil, protocol.Authority{}, nil, a2a.NewError(a2a.ErrUnsupportedOperation,
			"UNSUPPORTED: a task takes no further input (input-required is not implemented); send with its contextId to start the context's next task")
	}
	u, auth, err := h.conn(ctx)
	if err != nil {
		return nil, protocol.Authority{}, nil, err
	}
	if req.Message.ContextID == "" {
		root, err := u.cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: h.g.cfg.Workspace, Label: "a2a"})
		if err != nil {
			return nil, protocol.Authority{}, nil, a2aErr(err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rootCloseTimeout)
			defer cancel()
			_ = root.Close(cctx)
		}()
		r, err := u.cl.StartContinuable(ctx, protocol.ContinuableStartRequest{
			Provider: h.provider, Parent: root.Ref(), Label: "a2a: " + firstWords(text, labelWordsMax), Prompt: protocol.Text(text),
		})
		if err != nil {
			return nil, protocol.Authority{}, nil, a2aErr(err)
		}
		return u, auth, newTaskFold(r.ChildID, r.MessageID), nil
	}
	child := req.Message.ContextID
	if err := h.ownContext(ctx, u, auth, child); err != nil {
		return nil, protocol.Authority{}, nil, err
	}
	fr := protocol.FollowupRequest{ChildID: child, Authority: auth, Message: protocol.Text(text)}
	if protocol.ValidID(req.Message.ID) {
		// A retried message (same messageId) is accepted once.
		fr.IdempotencyKey = req.Message.ID
	}
	r, err := u.cl.Followup(ctx, fr)
	if err != nil {
		return nil, protocol.Authority{}, nil, a2aErr(err)
	}
	return u, auth, newTaskFold(child, r.MessageID), nil
}

// ownContext checks that child is a context of this caller's user on this
// provider: its header, read with the user's grant (UNAUTHORIZED outside
// the user's trees, whether it exists or not), names the provider.
func (h *handler) ownContext(ctx context.Context, u *userConn, auth protocol.Authority, child string) error {
	if !protocol.ValidID(child) {
		return notFound("context")
	}
	hdr, err := u.cl.Header(ctx, protocol.SessionGetRequest{SessionID: child, Authority: auth})
	if err != nil {
		return a2aErr(err)
	}
	if hdr.ParentSession == "" || hdr.Provider != h.provider {
		return notFound("context on provider " + h.provider)
	}
	return nil
}

// SendMessage implements a2asrv.RequestHandler: send, then (unless
// returnImmediately) wait for the task's end in the log.
func (h *handler) SendMessage(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	u, auth, f, err := h.send(ctx, req)
	if err != nil {
		return nil, err
	}
	var hist *int
	if req.Config != nil {
		hist = req.Config.HistoryLength
		if req.Config.ReturnImmediately {
			return f.task(hist), nil
		}
	}
	if err := h.follow(ctx, u, auth, f, true, func(a2a.Event) bool { return true }); err != nil {
		return nil, err
	}
	return f.task(hist), nil
}

// SendStreamingMessage implements a2asrv.RequestHandler: the task, then its
// updates as the session log records them, until it ends.
func (h *handler) SendStreamingMessage(ctx context.Context, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		u, auth, f, err := h.send(ctx, req)
		if err != nil {
			yield(nil, err)
			return
		}
		if !yield(f.task(nil), nil) {
			return
		}
		if err := h.follow(ctx, u, auth, f, true, func(e a2a.Event) bool { return yield(e, nil) }); err != nil {
			yield(nil, err)
		}
	}
}

// follow reads the context's log from the fold's position on, waiting for
// new events (a live tail, logWaitMs per read), feeding each to the fold and
// its A2A events to emit, until the task ended, emit says stop or ctx ends.
// With wait false it reads only what the log holds now.
func (h *handler) follow(ctx context.Context, u *userConn, auth protocol.Authority, f *taskFold, wait bool, emit func(a2a.Event) bool) error {
	for !f.terminal() {
		req := protocol.LogReadRequest{SessionID: f.childID, Authority: auth, FromSeq: f.nextSeq, Cursor: f.cursor, EventsMax: logEventsPerPage}
		if wait {
			req.WaitMs = logWaitMs
		}
		page, err := u.cl.LogPage(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return a2aErr(err)
		}
		for _, ev := range page.Events {
			for _, e := range f.apply(ev) {
				if !emit(e) {
					return nil
				}
			}
		}
		if page.NextSeq > f.nextSeq {
			f.nextSeq = page.NextSeq
		}
		f.cursor = page.Cursor
		if !wait && page.Complete {
			return nil
		}
	}
	return nil
}

// snapshot folds the whole log as it is now into a task of childID and
// messageID. A message the log does not name yet is a task only while the
// context has work queued or running; otherwise the id names nothing
// (TaskNotFound, as for another caller's task).
func (h *handler) snapshot(ctx context.Context, id a2a.TaskID) (*userConn, protocol.Authority, *taskFold, error) {
	child, msg, ok := parseTaskID(id)
	if !ok {
		return nil, protocol.Authority{}, nil, notFound("task")
	}
	u, auth, err := h.conn(ctx)
	if err != nil {
		return nil, protocol.Authority{}, nil, err
	}
	if err := h.ownContext(ctx, u, auth, child); err != nil {
		return nil, protocol.Authority{}, nil, err
	}
	f := newTaskFold(child, msg)
	if err := h.follow(ctx, u, auth, f, false, func(a2a.Event) bool { return true }); err != nil {
		return nil, protocol.Authority{}, nil, err
	}
	if f.turn == 0 && !f.terminal() {
		st, err := u.cl.State(ctx, protocol.ChildRef{ChildID: child, Authority: auth})
		if err != nil {
			return nil, protocol.Authority{}, nil, a2aErr(err)
		}
		if st.State == protocol.StateNone && st.Queued == 0 {
			// Claimed between the read and the state? Read once more.
			if err := h.follow(ctx, u, auth, f, false, func(a2a.Event) bool { return true }); err != nil {
				return nil, protocol.Authority{}, nil, err
			}
			if f.turn == 0 && !f.terminal() {
				return nil, protocol.Authority{}, nil, notFound("task")
			}
		}
	}
	return u, auth, f, nil
}

// GetTask implements a2asrv.RequestHandler.
func (h *handler) GetTask(ctx context.Context, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	_, _, f, err := h.snapshot(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return f.task(req.HistoryLength), nil
}

// SubscribeToTask implements a2asrv.RequestHandler: the task as the log
// has it now, then its updates until it ends. Nothing is kept by the
// gateway, so a re-subscribe after a restart (of this gateway or another)
// resumes from the log.
func (h *handler) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		u, auth, f, err := h.snapshot(ctx, req.ID)
		if err != nil {
			yield(nil, err)
			return
		}
		if !yield(f.task(nil), nil) || f.terminal() {
			return
		}
		if err := h.follow(ctx, u, auth, f, true, func(e a2a.Event) bool { return yield(e, nil) }); err != nil {
			yield(nil, err)
		}
	}
}

// CancelTask implements a2asrv.RequestHandler: a dispose of the context
// (continuable.drain of that child, with the user's grant): its activation
// and every continuable descendant's end, child first, and the one-shot runs
// they started are disposed with their turns (ExtCascadingCancel). Only the
// task whose turn is running can be cancelled: a task still queued behind
// another is TaskNotCancelable (a dispose keeps accepted messages, docs/protocol.md §5.13).
func (h *handler) CancelTask(ctx context.Context, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	u, auth, f, err := h.snapshot(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	if f.terminal() {
		return nil, a2a.NewError(a2a.ErrTaskNotCancelable, "TASK_NOT_CANCELABLE: the task already ended "+string(f.state))
	}
	if f.turn == 0 {
		return nil, a2a.NewError(a2a.ErrTaskNotCancelable, "TASK_NOT_CANCELABLE: the task waits behind another task of its context; cancel that one first")
	}
	if _, err := u.cl.Drain(ctx, protocol.DrainRequest{Authority: auth, Children: []string{f.childID}}); err != nil {
		return nil, a2aErr(err)
	}
	wctx, cancel := context.WithTimeout(ctx, cancelSettleTimeout)
	defer cancel()
	if err := h.follow(wctx, u, auth, f, true, func(a2a.Event) bool { return true }); err != nil {
		return nil, err
	}
	return f.task(nil), nil
}

// ListTasks implements a2asrv.RequestHandler: the tasks of one context
// (contextId), or of the caller's contexts on this provider, newest context
// first (the user's children, from their lifecycle events; at most
// listContextsMax contexts per call). A task is a message the user sent
// (its source is the user); pageToken is the offset of the next page.
func (h *handler) ListTasks(ctx context.Context, req *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	u, auth, err := h.conn(ctx)
	if err != nil {
		return nil, err
	}
	size := req.PageSize
	if size <= 0 {
		size = listPageSizeDefault
	}
	size = min(size, listPageSizeMax)
	offset := 0
	if req.PageToken != "" {
		if offset, err = strconv.Atoi(req.PageToken); err != nil || offset < 0 {
			return nil, a2a.NewError(a2a.ErrInvalidParams, "INVALID_ARGUMENT: pageToken is not one this gateway gave")
		}
	}
	var contexts []string
	if req.ContextID != "" {
		if err := h.ownContext(ctx, u, auth, req.ContextID); err != nil {
			return nil, err
		}
		contexts = []string{req.ContextID}
	} else if contexts, err = h.contexts(ctx, u, auth); err != nil {
		return nil, err
	}
	var all []*a2a.Task
	for _, c := range contexts {
		folds, err := h.contextTasks(ctx, u, auth, c)
		if err != nil {
			if errors.Is(err, a2a.ErrTaskNotFound) {
				continue
			}
			return nil, err
		}
		for _, f := range folds {
			if req.Status != "" && f.state != req.Status {
				continue
			}
			if req.StatusTimestampAfter != nil && !f.updated.After(*req.StatusTimestampAfter) {
				continue
			}
			t := f.task(req.HistoryLength)
			if !req.IncludeArtifacts {
				t.Artifacts = nil
			}
			all = append(all, t)
		}
	}
	resp := &a2a.ListTasksResponse{TotalSize: len(all), PageSize: size, Tasks: []*a2a.Task{}}
	if offset < len(all) {
		end := min(offset+size, len(all))
		resp.Tasks = all[offset:end]
		if end < len(all) {
			resp.NextPageToken = strconv.Itoa(end)
		}
	}
	return resp, nil
}

// contexts are the caller's children on this provider, newest first, from
// the lifecycle events of the user's trees (a user grant reads only those,
// docs/protocol.md §5.19): every subagent/start of a continuable child.
func (h *handler) contexts(ctx context.Context, u *userConn, auth protocol.Authority) ([]string, error) {
	var ids []string
	seen := map[string]bool{}
	var after protocol.Seq
	for range eventsScanPagesMax {
		page, err := u.cl.Events(ctx, protocol.EventsReadRequest{Authority: auth, AfterSeq: after, EventsMax: logEventsPerPage})
		if err != nil {
			return nil, a2aErr(err)
		}
		for _, e := range page.Events {
			if e.Type == protocol.LifecycleStart && e.Provider == h.provider && e.Mode == protocol.ModeContinuable && !seen[e.ID] {
				seen[e.ID] = true
				ids = append(ids, e.ID)
			}
		}
		after = page.Cursor
		if page.Complete {
			break
		}
	}
	slices.Reverse(ids)
	if len(ids) > listContextsMax {
		ids = ids[:listContextsMax]
	}
	return ids, nil
}

// contextTasks folds a context's whole log into its tasks: one per message
// the user sent, in the order the log records them.
func (h *handler) contextTasks(ctx context.Context, u *userConn, auth protocol.Authority, child string) ([]*taskFold, error) {
	var folds []*taskFold
	var from int64
	var cursor protocol.Seq
	for {
		page, err := u.cl.LogPage(ctx, protocol.LogReadRequest{SessionID: child, Authority: auth, FromSeq: from, Cursor: cursor, EventsMax: logEventsPerPage})
		if err != nil {
			return nil, a2aErr(err)
		}
		for _, ev := range page.Events {
			if ev.Type == protocol.EvUserMessage {
				var d protocol.UserMessageData
				if ev.Decode(&d) == nil && d.Source.Kind == protocol.SourceUser && protocol.ValidID(d.ID) {
					folds = append(folds, newTaskFold(child, d.ID))
				}
			}
			for _, f := range folds {
				f.apply(ev)
			}
		}
		from, cursor = page.NextSeq, page.Cursor
		if page.Complete || len(page.Events) == 0 {
			return folds, nil
		}
	}
}

// GetTaskPushConfig and the other push methods: push notices are not
// offered (the card says so); a caller streams or re-subscribes instead.
func (h *handler) GetTaskPushConfig(context.Context, *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

func (h *handler) ListTaskPushConfigs(context.Context, *a2a.ListTaskPushConfigRequest) (*a2a.ListTaskPushConfigResponse, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

func (h *handler) CreateTaskPushConfig(context.Context, *a2a.PushConfig) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

func (h *handler) DeleteTaskPushConfig(context.Context, *a2a.DeleteTaskPushConfigRequest) error {
	return a2a.ErrPushNotificationNotSupported
}

// GetExtendedAgentCard: there is no extended card; the public one is whole.
func (h *handler) GetExtendedAgentCard(context.Context, *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	return nil, a2a.ErrExtendedCardNotConfigured
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	out := strings.Join(f, " ")
	if len(out) > 200 {
		out = out[:200]
	}
	return out
}
