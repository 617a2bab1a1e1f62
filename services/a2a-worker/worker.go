// Package a2aworker is `brood a2a-worker`: a provider whose children are a
// remote Agent2Agent (A2A) agent (docs/a2a.md, "The a2a provider"). Each
// child is a Brood agent on the worker whose "model" is the remote agent,
// spoken to with the official A2A Go SDK's client: a turn sends the turn's
// message to the remote agent (in the child's remote context, kept across
// followups) and waits for the remote task's end. The remote task's id is
// logged (a tool call and its result, a2a_task) before any event of the
// remote task is read, so a later turn of the child — after a takeover or a
// restart — re-attaches to a remote task its predecessor left running
// instead of starting it again; a dispose or interrupt of the turn (its
// parent's dispose, a drain) sends CancelTask for the remote task.
package a2aworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/providerhost"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/worker"
	broodclient "github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// Bounds of every wait on the remote agent, each with its unit.
const (
	// cardTimeout bounds resolving the remote agent's card.
	cardTimeout = 30 * time.Second
	// sendTimeout bounds one SendMessage (returnImmediately) to the remote.
	sendTimeout = 60 * time.Second
	// cancelTimeout bounds the CancelTask sent when a turn is cancelled.
	cancelTimeout = 10 * time.Second
	// pollInterval is the wait between two GetTask reads of a remote task
	// whose stream broke (the remote restarted, the connection dropped).
	pollInterval = 500 * time.Millisecond
	// TaskTool is the local tool whose call and result log a remote task's
	// id and context id before the task is read (docs/a2a.md).
	TaskTool = "a2a_task"
)

// Config configures an a2a worker.
type Config struct {
	// NC and Store are the worker's connection (the provider's worker user,
	// worker-<Name>, in a deployment with users) and Brood's store.
	NC    *nats.Conn
	Store *store.Store
	// Name is the provider's name (^[A-Za-z0-9_-]{1,64}$; its log and inbox
	// streams must be provisioned: brood provision --providers ...,NAME).
	Name string
	// CardURL is the remote agent's card URL (its
	// /.well-known/agent-card.json). Required.
	CardURL string
	// Token, when set, is sent to the remote agent as `Authorization: Bearer
	// <Token>` (never logged).
	Token string
	// HTTPClient defaults to a client without a timeout (streams are long);
	// every call has its own bound.
	HTTPClient *http.Client
	// HeartbeatInterval, HostExpiry and DrainGrace are the host's (zero:
	// docs/protocol.md §10's defaults).
	HeartbeatInterval time.Duration
	HostExpiry        time.Duration
	DrainGrace        time.Duration
	Logger            *slog.Logger
}

// Descriptor is the a2a provider's descriptor: continuable, no global tool
// (a2a_task is the child's own). Of the start capabilities it takes only
// depthLimit, which its children honour whatever the limit: they start no
// Brood child (what the remote agent does beyond A2A is its own); so an
// agent's subagent tool, which always sends maxDepth, may delegate to it.
func Descriptor(name string) protocol.ProviderDescriptor {
	return protocol.ProviderDescriptor{Name: name, Continuable: true, Capabilities: protocol.Capabilities{DepthLimit: true}, Tools: []string{}}
}

// New returns the worker's host (provider.Host: Run serves it).
func New(cfg Config) (*provider.Host, error) {
	if cfg.NC == nil || cfg.Store == nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a2a-worker: NC and Store are required")
	}
	if !protocol.ValidID(cfg.Name) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a2a-worker: name %q must match ^[A-Za-z0-9_-]{1,64}$", cfg.Name)
	}
	if !strings.HasPrefix(cfg.CardURL, "http://") && !strings.HasPrefix(cfg.CardURL, "https://") {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a2a-worker: the card URL %q must be http(s)", cfg.CardURL)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A child that draws on budgets reserves each step (each a request to
	// the remote agent) and its a2a_task call, as the agent runtime does
	// (docs/protocol.md §5.5), on the worker's own subject with the child's
	// credential.
	cl, err := broodclient.New(cfg.NC, broodclient.Options{Prefix: cfg.Store.Subj.Prefix()})
	if err != nil {
		return nil, err
	}
	r := &remote{cfg: cfg}
	p := &worker.InProcess{
		Budget: cl,
		Desc:   Descriptor(cfg.Name),
		Models: func() (model.Model, error) { return r, nil },
		Tools:  func(worker.SessionSpec) ([]*agent.Tool, error) { return nil, nil },
		Local:  func(worker.SessionSpec) []*agent.Tool { return []*agent.Tool{taskTool()} },
		Logger: cfg.Logger,
	}
	return providerhost.New(providerhost.InModule{Store: cfg.Store}, provider.Config{
		NC: cfg.NC, Providers: []provider.Provider{p}, HeartbeatInterval: cfg.HeartbeatInterval,
		HostExpiry: cfg.HostExpiry, DrainGrace: cfg.DrainGrace, Logger: cfg.Logger,
	})
}

// taskArgs are the a2a_task call's arguments: the remote task the turn
// waits for, and its remote context.
type taskArgs struct {
	TaskID    string `json:"taskId"`
	ContextID string `json:"contextId"`
}

// taskTool only records: its call (by the remote "model") and its result put
// the remote task's ids in the log before anything of the task is read.
func taskTool() *agent.Tool {
	return &agent.Tool{
		Name:        TaskTool,
		Description: "records the remote A2A task this turn waits for",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"taskId":{"type":"string"},"contextId":{"type":"string"}},"required":["taskId"]}`),
		Run: func(_ context.Context, _ agent.ToolContext, args string) agent.ToolResult {
			var a taskArgs
			if err := json.Unmarshal([]byte(args), &a); err != nil || a.TaskID == "" {
				return agent.ErrorResult("a2a_task: invalid arguments")
			}
			return agent.ToolResult{
				Content: protocol.Text("remote task " + a.TaskID),
				Meta:    map[string]string{"remoteTaskId": a.TaskID, "remoteContextId": a.ContextID},
			}
		},
	}
}

// remote is the remote agent as the agent runtime's model.
type remote struct {
	cfg Config

	mu sync.Mutex
	cl *a2aclient.Client
}

func (*remote) Provider() string { return "a2a" }
func (r *remote) Name() string   { return r.cfg.CardURL }

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(req)
}

// client resolves the card once and keeps the SDK client.
func (r *remote) client(ctx context.Context) (*a2aclient.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cl != nil {
		return r.cl, nil
	}
	hc := r.cfg.HTTPClient
	if r.cfg.Token != "" {
		base := hc.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		hc = &http.Client{Transport: bearer{token: r.cfg.Token, base: base}, Timeout: hc.Timeout}
	}
	cctx, cancel := context.WithTimeout(ctx, cardTimeout)
	defer cancel()
	card, err := agentcard.NewResolver(hc).Resolve(cctx, r.cfg.CardURL, agentcard.WithPath(""))
	if err != nil {
		return nil, &model.Error{Diagnostic: fmt.Sprintf("resolve the remote agent's card: %v", err), Retryable: true}
	}
	cl, err := a2aclient.NewFromCard(cctx, card, a2aclient.WithJSONRPCTransport(hc), a2aclient.WithRESTTransport(hc))
	if err != nil {
		return nil, &model.Error{Diagnostic: fmt.Sprintf("the remote agent's card: %v", err)}
	}
	r.cl = cl
	return cl, nil
}

// turnState is what the request's history says of the turn: the logged
// remote tasks, the remote context, and whether this turn already logged
// its task (then the step waits for it).
type turnState struct {
	contextID string
	// current: the task this turn logged (phase 2); empty in phase 1.
	current taskArgs
	// orphan: a task an earlier turn logged and never saw end (its turn was
	// closed by a takeover or a restart): re-attached before a new message
	// goes to the same remote context.
	orphan taskArgs
	prompt string
}

func readHistory(msgs []model.Message) turnState {
	var st turnState
	lastUser := -1
	for i, m := range msgs {
		if m.Role == model.RoleUser {
			lastUser = i
		}
	}
	var pending taskArgs
	for i, m := range msgs {
		if m.Role == model.RoleAssistant {
			for _, tc := range m.ToolCalls {
				var a taskArgs
				if tc.Name == TaskTool && json.Unmarshal([]byte(tc.Arguments), &a) == nil && a.TaskID != "" {
					if a.ContextID != "" {
						st.contextID = a.ContextID
					}
					if i > lastUser {
						st.current = a
					} else {
						pending = a
					}
				}
			}
			if len(m.ToolCalls) == 0 && protocol.PlainText(m.Content) != "" && i < lastUser {
				pending = taskArgs{} // that turn's task ended with an answer
			}
		}
	}
	st.orphan = pending
	if lastUser >= 0 {
		st.prompt = protocol.PlainText(msgs[lastUser].Content)
	}
	return st
}

// Stream answers one step. Phase 1 (the turn has logged no task yet):
// re-attach to an orphaned task of an earlier turn and wait for it, then
// send the turn's message in the remote context (returnImmediately) and
// answer with an a2a_task call carrying the remote task's ids — logged
// before any event of the task is read. Phase 2 (the call is in the
// history): follow the task to its end and answer with its output. A
// cancelled turn sends CancelTask for the task it waits for.
func (r *remote) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	st := readHistory(req.Messages)
	cl, err := r.client(ctx)
	if err != nil {
		return model.Response{}, err
	}
	if st.current.TaskID != "" {
		text, usage, err := r.await(ctx, cl, st.current.TaskID)
		if err != nil {
			return model.Response{}, err
		}
		if st.orphan.TaskID != "" {
			// The answer an earlier turn never gave (its turn was closed
			// while it waited): re-attached in phase 1, ended by now. Its
			// usage was the closed turn's.
			if prev, _, err := r.await(ctx, cl, st.orphan.TaskID); err == nil && prev != "" {
				text = prev + "\n" + text
			}
		}
		if text != "" {
			onText(text)
		}
		// The remote task's usage, when it reports one (ExtUsage), is this
		// step's: a budget charges it instead of the step's whole grant.
		return model.Response{Message: protocol.AssistantMessage{Content: protocol.Text(text)}, Finish: model.FinishStop, Usage: usage}, nil
	}
	if st.orphan.TaskID != "" {
		r.cfg.Logger.Info("re-attaching to a remote task an earlier turn left", "task", st.orphan.TaskID)
		if _, _, err := r.await(ctx, cl, st.orphan.TaskID); err != nil && ctx.Err() != nil {
			return model.Response{}, err
		}
	}
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(st.prompt))
	msg.ContextID = st.contextID
	// The send is not cut by the turn's cancellation: a task the remote
	// agent created must be known, so that a cancelled turn cancels it
	// (below) instead of leaving it running unseen.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sendTimeout)
	defer cancel()
	res, err := cl.SendMessage(sctx, &a2a.SendMessageRequest{Message: msg, Config: &a2a.SendMessageConfig{ReturnImmediately: true}})
	if err != nil {
		if ctx.Err() != nil {
			return model.Response{}, ctx.Err()
		}
		return model.Response{}, &model.Error{Diagnostic: fmt.Sprintf("send to the remote agent: %v", err)}
	}
	if t, ok := res.(*a2a.Task); ok && !t.Status.State.Terminal() {
		if ctx.Err() != nil {
			if cancelled(ctx) {
				r.cancel(cl, string(t.ID))
			}
			return model.Response{}, ctx.Err()
		}
		// The turn may be cancelled before its next step follows the task
		// (between this step and the next the runtime logs the a2a_task
		// call and runs it): the watch sends CancelTask then too.
		go r.watch(ctx, cl, string(t.ID))
	}
	switch v := res.(type) {
	case *a2a.Message:
		// The remote answered at once, without a task: nothing to re-attach.
		text := partsText(v.Parts)
		if text != "" {
			onText(text)
		}
		return model.Response{Message: protocol.AssistantMessage{Content: protocol.Text(text)}, Finish: model.FinishStop}, nil
	case *a2a.Task:
		args, _ := json.Marshal(taskArgs{TaskID: string(v.ID), ContextID: v.ContextID})
		return model.Response{
			Message: protocol.AssistantMessage{Content: []protocol.ContentBlock{}, ToolCalls: []protocol.ToolCall{{ID: "a2a-" + string(v.ID), Name: TaskTool, Arguments: string(args)}}},
			Finish:  model.FinishToolCalls,
		}, nil
	default:
		return model.Response{}, &model.Error{Diagnostic: fmt.Sprintf("the remote agent answered %T", res)}
	}
}

// await follows a remote task to its end (a stream, and GetTask when the
// stream breaks) and returns its output; a turn cancelled meanwhile sends
// CancelTask and returns ctx's error.
func (r *remote) await(ctx context.Context, cl *a2aclient.Client, id string) (string, *protocol.Usage, error) {
	for {
		task, err := cl.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(id)})
		if err == nil && task.Status.State.Terminal() {
			return finish(task)
		}
		if ctx.Err() != nil {
			if cancelled(ctx) {
				r.cancel(cl, id)
			}
			return "", nil, ctx.Err()
		}
		if err == nil {
			for ev, serr := range cl.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: a2a.TaskID(id)}) {
				if serr != nil {
					break
				}
				if t, ok := ev.(*a2a.Task); ok && t.Status.State.Terminal() {
					return finish(t)
				}
				if u, ok := ev.(*a2a.TaskStatusUpdateEvent); ok && u.Status.State.Terminal() {
					break // GetTask reads the whole task, artifacts included
				}
			}
		}
		select {
		case <-ctx.Done():
			if cancelled(ctx) {
				r.cancel(cl, id)
			}
			return "", nil, ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// cancelled reports whether the turn's context ended because the turn was
// interrupted or disposed (a *provider.Cancel cause): then its remote task
// is cancelled. Any other end leaves the task alone: the turn completed,
// or the host lost the child (provider.ErrLeaseLost), whose next turn
// re-attaches to the task.
func cancelled(ctx context.Context) bool {
	var c *provider.Cancel
	return errors.As(context.Cause(ctx), &c)
}

// watch sends CancelTask for a task its turn logged if the turn is cancelled
// (interrupt, dispose) before it ends; it returns when the turn's context
// ends, which it does at every turn's end.
func (r *remote) watch(ctx context.Context, cl *a2aclient.Client, id string) {
	<-ctx.Done()
	if cancelled(ctx) {
		r.cancel(cl, id)
	}
}

// cancel sends CancelTask for a task whose turn was cancelled (bounded; a
// failure is logged: the remote task may have ended meanwhile).
func (r *remote) cancel(cl *a2aclient.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	if _, err := cl.CancelTask(ctx, &a2a.CancelTaskRequest{ID: a2a.TaskID(id)}); err != nil && !errors.Is(err, a2a.ErrTaskNotCancelable) {
		r.cfg.Logger.Warn("cancel the remote task", "task", id, "err", err)
	}
}

// finish is an ended task's output and the usage it reported (taskUsage).
func finish(t *a2a.Task) (string, *protocol.Usage, error) {
	var b strings.Builder
	for _, a := range t.Artifacts {
		b.WriteString(partsText(a.Parts))
	}
	text := b.String()
	if text == "" && t.Status.Message != nil {
		text = partsText(t.Status.Message.Parts)
	}
	if t.Status.State != a2a.TaskStateCompleted {
		return "", nil, &model.Error{Diagnostic: fmt.Sprintf("the remote task %s ended %s: %s", t.ID, t.Status.State, firstBytes(text, 200))}
	}
	return text, taskUsage(t), nil
}

// ExtUsage is the A2A extension under whose key an agent that declares it
// puts its task's model usage in the task's metadata, {inputTokens,
// outputTokens} (docs/a2a.md, "Usage"; Brood's gateway does).
const ExtUsage = "urn:brood:a2a:ext:usage:v1"

// taskUsage is the usage a task's metadata reports under ExtUsage, nil
// when it reports none or a malformed one (then the step's usage is
// unknown, never zero: docs/protocol.md §6.6).
func taskUsage(t *a2a.Task) *protocol.Usage {
	m, ok := t.Metadata[ExtUsage].(map[string]any)
	if !ok {
		return nil
	}
	count := func(k string) (int64, bool) {
		f, ok := m[k].(float64)
		if !ok || f < 0 || f > protocol.BudgetValueMax || f != float64(int64(f)) {
			return 0, false
		}
		return int64(f), true
	}
	in, ok1 := count("inputTokens")
	out, ok2 := count("outputTokens")
	if !ok1 || !ok2 {
		return nil
	}
	return &protocol.Usage{InputTokens: in, OutputTokens: out}
}

func partsText(ps a2a.ContentParts) string {
	var b strings.Builder
	for _, p := range ps {
		if p != nil {
			b.WriteString(p.Text())
		}
	}
	return b.String()
}

func firstBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
