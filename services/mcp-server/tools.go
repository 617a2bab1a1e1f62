package mcpserver

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Kinds of child a tool answers about.
const (
	KindOneShot     = "one-shot"
	KindContinuable = "continuable"
)

// Status is what delegate, followup, state, result, interrupt and dispose
// answer about a child: its ids, kind and state, and its answer once it has
// one. State is a one-shot run's (running, settled) or a continuable
// child's residency (running, waiting, settled, none: docs/protocol.md
// §5.11).
type Status struct {
	ChildID   string   `json:"childId" jsonschema:"the child's session id: pass it to followup, state, result, interrupt, dispose"`
	RunID     string   `json:"runId,omitempty" jsonschema:"a one-shot child's run id"`
	Kind      string   `json:"kind" jsonschema:"one-shot or continuable"`
	State     string   `json:"state" jsonschema:"one-shot: running or settled; continuable: running, waiting, settled or none (idle)"`
	Queued    uint64   `json:"queued,omitempty" jsonschema:"messages waiting in a continuable child's inbox"`
	MessageID string   `json:"messageId,omitempty" jsonschema:"the id of the message a delegate or followup queued"`
	Held      string   `json:"held,omitempty" jsonschema:"why an accepted message waits (a drain holds admission closed)"`
	Result    *Result  `json:"result,omitempty" jsonschema:"the child's answer: a one-shot run's result, or a continuable child's last finished turn"`
	Disposed  []string `json:"disposed,omitempty" jsonschema:"activations dispose ended, child first"`
}

// Result is a child's answer.
type Result struct {
	StopReason string `json:"stopReason" jsonschema:"completed, aborted, error, max-tokens or refusal"`
	Output     string `json:"output" jsonschema:"the answer's text"`
	Structured any    `json:"structured,omitempty" jsonschema:"the answer as JSON, when delegated with an outputSchema"`
	Diagnostic string `json:"diagnostic,omitempty" jsonschema:"why it did not complete"`
	ErrorCode  string `json:"errorCode,omitempty" jsonschema:"the catalogue code of a failure (docs/protocol.md §3)"`
	Turn       int64  `json:"turn,omitempty" jsonschema:"a continuable child's turn this answers"`
}

func fromSubagent(r *protocol.SubagentResult) *Result {
	if r == nil {
		return nil
	}
	return &Result{StopReason: string(r.StopReason), Output: protocol.PlainText(r.Output), Structured: r.Structured,
		Diagnostic: r.Diagnostic, ErrorCode: string(r.ErrorCode)}
}

// DelegateInput is delegate's input.
type DelegateInput struct {
	Provider     string         `json:"provider" jsonschema:"the provider to delegate to (see providers), e.g. spawn"`
	Prompt       string         `json:"prompt" jsonschema:"the task"`
	OutputSchema map[string]any `json:"outputSchema,omitempty" jsonschema:"a JSON Schema the answer must match (one-shot only): the result's structured field"`
	Continuable  bool           `json:"continuable,omitempty" jsonschema:"start a continuable child that keeps its conversation for followup (default: one-shot)"`
	Label        string         `json:"label,omitempty" jsonschema:"a short label for the child"`
	WaitSeconds  *float64       `json:"waitSeconds,omitempty" jsonschema:"wait up to this long for the answer (default 30, at most 300; 0 answers at once with the ids)"`
}

// FollowupInput is followup's input.
type FollowupInput struct {
	ChildID     string   `json:"childId" jsonschema:"a continuable child's id"`
	Message     string   `json:"message" jsonschema:"the child's next turn"`
	WaitSeconds *float64 `json:"waitSeconds,omitempty" jsonschema:"wait up to this long for the turn's answer (default 30, at most 300; 0 answers at once)"`
}

// IDInput names a child (a one-shot run or child id, or a continuable
// child's id).
type IDInput struct {
	ID string `json:"id" jsonschema:"a child id (or a one-shot run id)"`
}

// ResultInput is result's input.
type ResultInput struct {
	ID          string   `json:"id" jsonschema:"a child id (or a one-shot run id)"`
	WaitSeconds *float64 `json:"waitSeconds,omitempty" jsonschema:"wait up to this long for a running child to answer (default 30, at most 300; 0: as it is now)"`
}

// ChildrenInput is children's input.
type ChildrenInput struct {
	Parent      string `json:"parent,omitempty" jsonschema:"list this session's children (default: the children delegated through this server)"`
	Descendants bool   `json:"descendants,omitempty" jsonschema:"the whole subtree, not only direct children"`
	Live        bool   `json:"live,omitempty" jsonschema:"instead: every live continuable child of this user, wherever delegated from"`
}

// ChildrenOutput lists children.
type ChildrenOutput struct {
	Children []protocol.ChildRow `json:"children"`
}

// ProvidersOutput lists the live providers.
type ProvidersOutput struct {
	Providers []ProviderInfo `json:"providers"`
}

// ProviderInfo is one live provider.
type ProviderInfo struct {
	Name        string   `json:"name"`
	Instances   int      `json:"instances" jsonschema:"live instances serving it"`
	Continuable bool     `json:"continuable" jsonschema:"it serves continuable children"`
	Remote      bool     `json:"remote,omitempty" jsonschema:"its children are not Brood agents (ACP)"`
	Tools       []string `json:"tools,omitempty" jsonschema:"the tools its children have"`
}

func (s *Server) addTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "providers", Description: "List the live Brood providers a task can be delegated to, with their tools.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, handle(s.providers))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "delegate", Description: "Delegate a task to a new child agent of a provider. " +
		"One-shot by default (optionally with an outputSchema its answer must match); continuable keeps the child for followup. " +
		"Waits up to waitSeconds for the answer, else answers with the ids: call result later."}, handle(s.delegate))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "followup", Description: "Send a continuable child its next turn; waits up to waitSeconds for that turn's answer."},
		handle(s.followup))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "state", Description: "How a child is doing now: running, settled, or (continuable) waiting or none when idle.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, handle(s.state))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "result", Description: "A child's answer: a one-shot run's result, or a continuable child's last finished turn; waits up to waitSeconds while it runs.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, handle(s.result))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "children", Description: "List the children delegated through this server, or a session's children (or subtree), or (live) this user's live continuable children.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, handle(s.children))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "interrupt", Description: "Stop a continuable child's current turn; its queued messages wait for the next followup."},
		handle(s.interrupt))
	destructive := true
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "dispose", Description: "End a child: a one-shot run settles aborted; a continuable child's activation (and its subtree's) ends (a later followup resumes it).",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive, IdempotentHint: true}}, handle(s.dispose))
}

func (s *Server) providers(ctx context.Context, _ struct{}) (ProvidersOutput, error) {
	r, err := s.cfg.Client.Providers(ctx)
	if err != nil {
		return ProvidersOutput{}, err
	}
	out := ProvidersOutput{Providers: []ProviderInfo{}}
	for _, d := range r.Providers {
		out.Providers = append(out.Providers, ProviderInfo{Name: d.Name,
			Instances: r.Instances[d.Name], Continuable: d.Continuable, Remote: d.Remote, Tools: d.Tools})
	}
	return out, nil
}

func (s *Server) delegate(ctx context.Context, in DelegateInput) (Status, error) {
	if in.Provider == "" || in.Prompt == "" {
		return Status{}, invalid("delegate: provider and prompt are required")
	}
	if in.Continuable && in.OutputSchema != nil {
		return Status{}, invalid("delegate: outputSchema is for one-shot children (a continuable child answers each turn in text)")
	}
	var st Status
	err := s.withRoot(ctx, func(parent protocol.ParentRef) error {
		label := in.Label
		if label == "" {
			label = firstWords(in.Prompt, labelWords)
		}
		if in.Continuable {
			r, err := s.cfg.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{
				Provider: in.Provider, Parent: parent, Label: label, Prompt: protocol.Text(in.Prompt)})
			if err != nil {
				return err
			}
			st = Status{ChildID: r.ChildID, Kind: KindContinuable, State: protocol.StateRunning, MessageID: r.MessageID}
			return nil
		}
		var schema any
		if in.OutputSchema != nil {
			schema = in.OutputSchema
		}
		run, err := s.cfg.Client.StartRun(ctx, protocol.RunStartRequest{Provider: in.Provider, Parent: parent, Label: label,
			Prompt: protocol.Text(in.Prompt), Options: protocol.StartOptions{OutputSchema: schema}})
		if err != nil {
			return err
		}
		st = Status{ChildID: run.ChildID, RunID: run.RunID, Kind: KindOneShot, State: protocol.RunRunning}
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	return s.await(ctx, st.RunID, st.ChildID, st, wait(in.WaitSeconds), 0)
}

// withRoot runs start with the root's ref, reopening the root once when
// its lease was lost (UNAUTHORIZED: the coordinator no longer knows its
// credential).
func (s *Server) withRoot(ctx context.Context, start func(protocol.ParentRef) error) error {
	ref, err := s.rootRef(ctx, false)
	if err != nil {
		return err
	}
	err = start(ref)
	if !errors.Is(err, protocol.ErrUnauthorized) {
		return err
	}
	if ref, err = s.rootRef(ctx, true); err != nil {
		return err
	}
	return start(ref)
}

func (s *Server) followup(ctx context.Context, in FollowupInput) (Status, error) {
	if in.ChildID == "" || in.Message == "" {
		return Status{}, invalid("followup: childId and message are required")
	}
	auth, err := s.authority(ctx)
	if err != nil {
		return Status{}, err
	}
	// The turn the message will run is after the last finished one.
	before, err := s.cfg.Client.SessionResult(ctx, protocol.SessionResultRequest{SessionID: in.ChildID, Authority: auth})
	if err != nil {
		return Status{}, err
	}
	r, err := s.cfg.Client.Followup(ctx, protocol.FollowupRequest{ChildID: in.ChildID, Authority: auth, Message: protocol.Text(in.Message)})
	if err != nil {
		return Status{}, err
	}
	st := Status{ChildID: in.ChildID, Kind: KindContinuable, State: protocol.StateRunning, MessageID: r.MessageID, Held: r.Held}
	return s.await(ctx, "", in.ChildID, st, wait(in.WaitSeconds), before.Turn)
}

func (s *Server) state(ctx context.Context, in IDInput) (Status, error) {
	if in.ID == "" {
		return Status{}, invalid("state: id is required")
	}
	return s.status(ctx, in.ID, 0, 0)
}

func (s *Server) result(ctx context.Context, in ResultInput) (Status, error) {
	if in.ID == "" {
		return Status{}, invalid("result: id is required")
	}
	st, err := s.status(ctx, in.ID, 0, 0)
	if err != nil {
		return Status{}, err
	}
	return s.await(ctx, st.RunID, st.ChildID, st, wait(in.WaitSeconds), 0)
}

// status is a child's status now: a one-shot run's (runs.await, waiting up
// to waitMs) or, when id names no run this user may see, a continuable
// child's (continuable.state and sessions.result).
func (s *Server) status(ctx context.Context, id string, waitMs int64, afterTurn int64) (Status, error) {
	auth, err := s.authority(ctx)
	if err != nil {
		return Status{}, err
	}
	rs, err := s.cfg.Client.Await(ctx, protocol.RunRef{RunID: id, Grant: auth.Grant, WaitMs: waitMs})
	if err == nil {
		return Status{ChildID: rs.ChildID, RunID: rs.RunID, Kind: KindOneShot, State: rs.State, Result: fromSubagent(rs.Result)}, nil
	}
	// No such run, or (a user's grant) none it may see: a continuable
	// child's id names no run (brood result does the same).
	if !errors.Is(err, protocol.ErrNotFound) && !errors.Is(err, protocol.ErrUnauthorized) {
		return Status{}, err
	}
	cs, err := s.cfg.Client.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
	if err != nil {
		return Status{}, err
	}
	st := Status{ChildID: id, Kind: KindContinuable, State: cs.State, Queued: cs.Queued, RunID: cs.RunID}
	res, err := s.cfg.Client.SessionResult(ctx, protocol.SessionResultRequest{SessionID: id, Authority: auth})
	if err != nil {
		return Status{}, err
	}
	if res.Finished && res.Turn > afterTurn {
		st.Result = &Result{StopReason: string(res.StopReason), Output: protocol.PlainText(res.Output), Structured: res.Structured,
			Diagnostic: res.Diagnostic, Turn: res.Turn}
	}
	return st, nil
}

// await waits up to d for the child to answer: a one-shot run to settle, a
// continuable child to go idle (nothing running or queued) with a turn
// after afterTurn finished. It answers st's ids with the status it reached.
func (s *Server) await(ctx context.Context, runID, childID string, st Status, d time.Duration, afterTurn int64) (Status, error) {
	deadline := time.Now().Add(d)
	if st.Kind == KindOneShot {
		id := runID
		if id == "" {
			id = childID
		}
		for {
			left := time.Until(deadline)
			waitMs := max(left.Milliseconds(), 0)
			waitMs = min(waitMs, protocol.ReadWaitMsMax)
			got, err := s.status(ctx, id, waitMs, 0)
			if err != nil {
				return Status{}, err
			}
			if got.State == protocol.RunSettled || time.Until(deadline) <= 0 {
				return merge(st, got), nil
			}
		}
	}
	t := time.NewTicker(statePoll)
	defer t.Stop()
	for {
		got, err := s.status(ctx, childID, 0, afterTurn)
		if err != nil {
			return Status{}, err
		}
		idle := got.State == protocol.StateNone && got.Queued == 0 && got.Result != nil
		if idle || time.Until(deadline) <= 0 {
			return merge(st, got), nil
		}
		select {
		case <-ctx.Done():
			return Status{}, protocol.Errorf(protocol.CodeCancelled, "waiting for %s: %w", childID, ctx.Err())
		case <-t.C:
		}
	}
}

// merge keeps what the call itself learnt (message id, hold) over a later
// status.
func merge(st, got Status) Status {
	got.MessageID, got.Held = st.MessageID, st.Held
	if got.RunID == "" {
		got.RunID = st.RunID
	}
	return got
}

func (s *Server) children(ctx context.Context, in ChildrenInput) (ChildrenOutput, error) {
	auth, err := s.authority(ctx)
	if err != nil {
		return ChildrenOutput{}, err
	}
	parent := in.Parent
	switch {
	case in.Live && parent != "":
		return ChildrenOutput{}, invalid("children: live lists every live continuable child; give it without parent")
	case !in.Live && parent == "":
		if parent = s.rootID(); parent == "" {
			return ChildrenOutput{Children: []protocol.ChildRow{}}, nil // nothing delegated yet
		}
	}
	r, err := s.cfg.Client.Children(ctx, protocol.ChildrenListRequest{Parent: parent, Authority: auth, Descendants: in.Descendants})
	if err != nil {
		return ChildrenOutput{}, err
	}
	if r.Rows == nil {
		r.Rows = []protocol.ChildRow{}
	}
	return ChildrenOutput{Children: r.Rows}, nil
}

func (s *Server) interrupt(ctx context.Context, in IDInput) (Status, error) {
	if in.ID == "" {
		return Status{}, invalid("interrupt: id is required")
	}
	auth, err := s.authority(ctx)
	if err != nil {
		return Status{}, err
	}
	if _, err := s.cfg.Client.Interrupt(ctx, protocol.InterruptRequest{ChildID: in.ID, Authority: auth}); err != nil {
		return Status{}, err
	}
	return s.status(ctx, in.ID, 0, 0)
}

func (s *Server) dispose(ctx context.Context, in IDInput) (Status, error) {
	if in.ID == "" {
		return Status{}, invalid("dispose: id is required")
	}
	auth, err := s.authority(ctx)
	if err != nil {
		return Status{}, err
	}
	rs, err := s.cfg.Client.Dispose(ctx, protocol.RunRef{RunID: in.ID, Grant: auth.Grant})
	if err == nil {
		return Status{ChildID: rs.ChildID, RunID: rs.RunID, Kind: KindOneShot, State: rs.State, Result: fromSubagent(rs.Result)}, nil
	}
	// Not a one-shot run: a continuable child (brood dispose does the same).
	if !errors.Is(err, protocol.ErrNotFound) && !errors.Is(err, protocol.ErrUnauthorized) {
		return Status{}, err
	}
	r, err := s.cfg.Client.Drain(ctx, protocol.DrainRequest{Authority: auth, Children: []string{in.ID}})
	if err != nil {
		return Status{}, err
	}
	st, err := s.status(ctx, in.ID, 0, 0)
	if err != nil {
		return Status{}, err
	}
	st.Disposed = r.Disposed
	if st.Disposed == nil {
		st.Disposed = []string{}
	}
	return st, nil
}

// labelWords is how many of a prompt's first words label a child delegated
// without a label (as brood start does).
const labelWords = 5

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	out := strings.Join(f, " ")
	if len(out) > protocol.LabelBytesMax {
		out = strings.ToValidUTF8(out[:protocol.LabelBytesMax], "")
	}
	return out
}
