package acpagent

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// session is one ACP session: a Brood root and its in-process agent.
type session struct {
	s     *Service
	id    string
	root  *client.Root
	agent *agent.Agent
	inbox rootInbox
	// requests is the session's view of its tree's requests (requests.go);
	// delegating names its tools that start children.
	requests   *requestsState
	delegating map[string]bool

	turnMu sync.Mutex // one turn at a time

	stopWatch context.CancelFunc // of the inbox watcher
	watching  sync.WaitGroup

	mu       sync.Mutex
	cancel   context.CancelCauseFunc // of the running turn
	streamed bool                    // text of the current step already went out as chunks
	closed   bool
}

// build composes a session's agent over its log: the model (its text
// streamed to the client), the tools (narrowed by the header's ceiling) and
// the system prompt; appended events are forwarded to the client.
func (s *Service) build(root *client.Root, h protocol.SessionHeader, events []protocol.SessionEvent, log agent.Appender) (*session, error) {
	m, err := s.cfg.Models()
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "model: " + err.Error()})
	}
	tools, err := s.cfg.Tools(ToolSpec{Header: h, Client: s.cfg.Client})
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "tools: " + err.Error()})
	}
	var allowed []*agent.Tool
	for _, t := range tools {
		if h.ToolCeiling.Allows(t.Name) {
			allowed = append(allowed, t)
		}
	}
	reg, err := agent.NewRegistry(allowed...)
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "tools: " + err.Error()})
	}
	reg = reg.ForSession(h) // no subagent tool at the depth cap
	system, err := agent.SystemPrompt(s.cfg.Persona, map[string]string{"provider": m.Provider(), "model": m.Name(), "cwd": h.Cwd}, h)
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": "system prompt: " + err.Error()})
	}
	ss := &session{s: s, id: h.ID, root: root, inbox: rootInbox{root: root}, requests: newRequestsState(), delegating: map[string]bool{}}
	for _, n := range reg.Names() {
		if t, ok := reg.Lookup(n); ok && t.Delegates {
			ss.delegating[n] = true
		}
	}
	ss.sawDelegation(events)
	// The root's inbox feeds the agent: notices and reports join a running
	// turn at its next step (the agent looks at every step), and the
	// watcher turns those that arrive while it is idle into turns of their own.
	ss.agent, err = agent.New(agent.Config{
		Header: h, Log: observedLog{inner: log, on: ss.appended}, Events: events,
		Model: teeModel{Model: m, onText: ss.text}, Tools: reg, System: system,
		Credential: root.Credential, Limits: s.cfg.Limits.Within(h.Limits), Logger: s.log, Inbox: ss.inbox,
	})
	if err != nil {
		return nil, acp.NewInternalError(map[string]any{"error": err.Error()})
	}
	return ss, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// errClosing refuses a turn on a session that is closing.
var errClosing = errors.New("the session is closing")

// turn runs one turn with run under the turn lock, cancellable by
// session/cancel (cancelTurn); the turn ends aborted{user} when ctx (the
// prompt's) is cancelled. The turn keeps ctx's values: its span (the
// prompt's, in the trace its `_meta` carried), so the turn's requests join
// the delegation tree's trace.
func (ss *session) turn(ctx context.Context, run func(tctx context.Context) agent.Outcome) (agent.Outcome, error) {
	ss.turnMu.Lock()
	defer ss.turnMu.Unlock()
	tctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(&agent.Cancel{Cause: protocol.CauseUser}) })
	defer stop()
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return agent.Outcome{}, errClosing
	}
	ss.cancel = cancel
	ss.streamed = false
	ss.mu.Unlock()
	out := run(tctx)
	ss.mu.Lock()
	ss.cancel = nil
	ss.mu.Unlock()
	return out, nil
}

// prompt runs one turn whose message came from src (the user, unless the ACP
// bridge said otherwise). The SDK cancels ctx on session/cancel and when the
// client disconnects: the turn then ends aborted{user}. A turn that fails
// (a model error) is a stop reason, not a JSON-RPC error: the error text is
// streamed as a marked agent message (so an editor shows why) and the
// response says end_turn with `_meta.brood.turnEnd` {kind: error, error}.
// Only what is not a turn's answer (the log fenced, JetStream refusing
// writes, a closing session) is a JSON-RPC error.
func (ss *session) prompt(ctx context.Context, content []protocol.ContentBlock, src protocol.MessageSource) (acp.PromptResponse, error) {
	out, err := ss.turn(ctx, func(tctx context.Context) agent.Outcome {
		return ss.agent.RunTurn(tctx, agent.Input{Content: content, Source: src})
	})
	if err != nil {
		return acp.PromptResponse{}, acp.NewInternalError(map[string]any{"error": err.Error()})
	}
	switch {
	case out.Fenced:
		return acp.PromptResponse{}, acp.NewInternalError(map[string]any{"error": "session " + ss.id +
			" was taken over by another process (its log is fenced); load it again where it lives now"})
	case out.Err != nil:
		return acp.PromptResponse{}, acp.NewInternalError(map[string]any{"error": "JetStream did not acknowledge the session log: " + out.Err.Error()})
	}
	switch out.Reason.Kind {
	case protocol.TurnCompleted:
		return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
	case protocol.TurnMaxTokens:
		return acp.PromptResponse{StopReason: acp.StopReasonMaxTokens}, nil
	case protocol.TurnBlocked:
		return acp.PromptResponse{StopReason: acp.StopReasonRefusal}, nil
	case protocol.TurnAborted:
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	default:
		msg := out.Reason.Error
		if msg == "" {
			msg = "the turn ended " + out.Reason.Kind
		}
		u := acp.UpdateAgentMessageText("\n[the turn failed: " + msg + "]")
		u.AgentMessageChunk.Meta = map[string]any{protocol.ACPMetaKey: map[string]any{"notice": ACPNoticeTurnError}}
		ss.notify(u)
		return acp.PromptResponse{StopReason: acp.StopReasonEndTurn, Meta: map[string]any{
			protocol.ACPMetaKey: map[string]any{"turnEnd": protocol.ACPTurnEnd{Kind: out.Reason.Kind, Error: msg}}}}, nil
	}
}

// ACPNoticeTurnError marks (in `_meta.brood.notice` of an agent message
// chunk) the text that tells an editor why a turn failed: it is no part of
// the agent's answer, and the ACP bridge leaves it out of the child's log.
const ACPNoticeTurnError = protocol.ACPNoticeTurnError

func (ss *session) cancelTurn(cause string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.cancel != nil {
		ss.cancel(&agent.Cancel{Cause: cause})
	}
}

// close stops the inbox watcher, ends a running turn (aborted, disposed),
// waits for both within ctx and closes the root (its lease ends; its
// one-shot runs are disposed).
func (ss *session) close(ctx context.Context) {
	ss.mu.Lock()
	ss.closed = true
	ss.mu.Unlock()
	if ss.stopWatch != nil {
		ss.stopWatch()
	}
	ss.cancelTurn(protocol.CauseDisposed)
	done := make(chan struct{})
	go func() {
		// Taking the turn lock is waiting for the running turn to end.
		ss.turnMu.Lock()
		ss.turnMu.Unlock()
		ss.watching.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		ss.s.log.Warn("a turn did not end before shutdown", "session", ss.id)
	}
	if err := ss.root.Close(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		ss.s.log.Warn("could not close the root", "session", ss.id, "err", err)
	}
}

// notify sends one session/update; a client that went away is not an error
// of the turn.
func (ss *session) notify(u acp.SessionUpdate) {
	if err := ss.s.conn.SessionUpdate(context.Background(), acp.SessionNotification{SessionId: acp.SessionId(ss.id), Update: u}); err != nil {
		ss.s.log.Debug("session/update not sent", "session", ss.id, "err", err)
	}
}

// text streams a model text fragment as it arrives.
func (ss *session) text(s string) {
	if s == "" {
		return
	}
	ss.mu.Lock()
	ss.streamed = true
	ss.mu.Unlock()
	ss.notify(acp.UpdateAgentMessageText(s))
}

// appended forwards what the agent logged: tool calls and their results, and
// an answer whose text was not streamed (a model adapter that does not stream).
func (ss *session) appended(evs []protocol.SessionEvent) {
	ss.sawDelegation(evs)
	for _, ev := range evs {
		switch ev.Type {
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			if ev.Decode(&d) != nil {
				continue
			}
			ss.mu.Lock()
			streamed := ss.streamed
			ss.streamed = false
			ss.mu.Unlock()
			if t := protocol.AllText(d.Message.Content); t != "" && !streamed {
				ss.notify(acp.UpdateAgentMessageText(t))
			}
		case protocol.EvUserMessage:
			// Input the editor did not send (a background child's notice or
			// report, claimed from the root's inbox) is shown as the user's
			// side of the turn; what the editor sent is not echoed.
			var d protocol.UserMessageData
			if ev.Decode(&d) == nil && (d.Source.Kind == protocol.SourceSubagentSettled || d.Source.Kind == protocol.SourceSubagentReport) {
				if t := protocol.AllText(d.Content); t != "" {
					ss.notify(acp.UpdateUserMessageText(t))
				}
			}
		case protocol.EvToolCall, protocol.EvToolResult:
			if u, ok := toolUpdate(ev); ok {
				ss.notify(u)
			}
		}
	}
}

// sawDelegation opens the watch of the tree's requests at the first call
// of a tool that starts children (requests.go).
func (ss *session) sawDelegation(evs []protocol.SessionEvent) {
	for _, ev := range evs {
		var d protocol.ToolCallData
		if ev.Type == protocol.EvToolCall && ev.Decode(&d) == nil && ss.delegating[d.Name] {
			ss.requests.delegated()
			return
		}
	}
}

// replay sends a loaded session's conversation to the client.
func (ss *session) replay(_ context.Context, events []protocol.SessionEvent) {
	for _, ev := range events {
		switch ev.Type {
		case protocol.EvUserMessage:
			var d protocol.UserMessageData
			if ev.Decode(&d) == nil {
				if t := protocol.AllText(d.Content); t != "" {
					ss.notify(acp.UpdateUserMessageText(t))
				}
			}
		case protocol.EvAssistantMessage:
			var d protocol.AssistantMessageData
			if ev.Decode(&d) == nil {
				if t := protocol.AllText(d.Message.Content); t != "" {
					ss.notify(acp.UpdateAgentMessageText(t))
				}
			}
		case protocol.EvToolCall, protocol.EvToolResult:
			if u, ok := toolUpdate(ev); ok {
				ss.notify(u)
			}
		}
	}
}

// toolUpdate renders tool/call as tool_call (in progress, with the raw
// arguments) and tool/result as tool_call_update (completed or failed).
func toolUpdate(ev protocol.SessionEvent) (acp.SessionUpdate, bool) {
	switch ev.Type {
	case protocol.EvToolCall:
		var d protocol.ToolCallData
		if ev.Decode(&d) != nil {
			return acp.SessionUpdate{}, false
		}
		opts := []acp.ToolCallStartOpt{acp.WithStartKind(toolKind(d.Name)), acp.WithStartStatus(acp.ToolCallStatusInProgress)}
		var raw any
		if json.Unmarshal([]byte(d.Arguments), &raw) == nil {
			opts = append(opts, acp.WithStartRawInput(raw))
		}
		return acp.StartToolCall(acp.ToolCallId(d.CallID), d.Name, opts...), true
	case protocol.EvToolResult:
		var d protocol.ToolResultData
		if ev.Decode(&d) != nil {
			return acp.SessionUpdate{}, false
		}
		status := acp.ToolCallStatusCompleted
		if d.IsError {
			status = acp.ToolCallStatusFailed
		}
		opts := []acp.ToolCallUpdateOpt{acp.WithUpdateStatus(status),
			acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(protocol.AllText(d.Content)))})}
		if len(d.Meta) > 0 {
			// The ids the tool produced (subagent: childId, runId; send_message:
			// messageId), so an editor can link to the child's log.
			meta := make(map[string]any, len(d.Meta))
			for k, v := range d.Meta {
				meta[k] = v
			}
			opts = append(opts, acp.WithUpdateRawOutput(meta), func(u *acp.SessionToolCallUpdate) {
				u.Meta = map[string]any{protocol.ACPMetaKey: meta}
			})
		}
		return acp.UpdateToolCall(acp.ToolCallId(d.CallID), opts...), true
	}
	return acp.SessionUpdate{}, false
}

func toolKind(name string) acp.ToolKind {
	switch name {
	case "list_dir", "read_file":
		return acp.ToolKindRead
	case "write_file", "edit_file":
		return acp.ToolKindEdit
	case "run_command":
		return acp.ToolKindExecute
	default:
		return acp.ToolKindOther
	}
}

// observedLog is the session's log writer, telling the session what each
// acknowledged append wrote.
type observedLog struct {
	inner agent.Appender
	on    func([]protocol.SessionEvent)
}

func (l observedLog) Append(ctx context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error) {
	written, err := l.inner.Append(ctx, evs...)
	if err == nil {
		l.on(written)
	}
	return written, err
}

// teeModel streams the model's text to the client as well as to the runtime.
type teeModel struct {
	model.Model
	onText func(string)
}

func (m teeModel) Stream(ctx context.Context, req model.Request, onText func(string)) (model.Response, error) {
	return m.Model.Stream(ctx, req, func(s string) {
		m.onText(s)
		onText(s)
	})
}
