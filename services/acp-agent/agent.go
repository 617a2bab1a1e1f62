// Package acpagent is `brood acp-agent` (docs/design.md §6, §7): a Brood agent
// served over ACP on stdio with the ACP Go SDK's agent side, so an editor
// that speaks ACP (or the ACP bridge) can drive a Brood fleet.
//
// Its ACP sessions are Brood sessions. session/new opens a root agent with
// agents.open {cwd, reopenable, lineage} (the lineage comes from the `_meta`
// the ACP bridge puts on session/new, so a hop through ACP never resets a
// depth limit or a tool ceiling: the coordinator narrows the root's header
// with it); the ACP session id is the root's session id. This process holds
// the root's lease (renewed every third of it) and so is the one writer of
// its log in BROOD_LOG, which the in-process agent appends like any worker's.
// session/load reopens the root by id after any restart, reads its log and
// replays it to the client; it is advertised.
//
// Write order, per operation (each log append fenced on the previous record):
//
//	session/new    coordinator: header (BROOD_SESSIONS) ∥ root lease (brood_agents Create)
//	session/prompt turn opening record → one record per step (two with tool calls) → turn end;
//	               at each step, items waiting in the root's inbox (inbox.read) are claimed
//	               into the step (enqueue, dequeue, user/message) and then acknowledged (inbox.ack)
//	notice         (a background child's settlement notice or report arrives while idle; the
//	               session's watcher long-polls inbox.read) turn opening record with the claim
//	               (enqueue, dequeue, user/message) → steps → turn end → inbox.ack; the editor
//	               gets session/update notifications for it, the notice as the user's side
//	session/load   coordinator: lease Create, or CAS over a lapsed lease (the previous
//	               incarnation's credential dies) → log read (batch direct get, with a
//	               completeness check) → turn/end{interrupted} for a turn the previous
//	               incarnation left open, fenced on the last record → replay to the client;
//	               loads of one session at once are one load: the others wait, then replay (load.go)
//	request        (a pending request in the root's tree, listed by requests.go's watch)
//	               tool_call update (pending) → session/request_permission → the editor's
//	               choice as requests.answer with a user grant → tool_call_update (its outcome);
//	               nothing is written to the root's log
//	exit           running turns cancelled and ended (aborted) → agents.close per root
package acpagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	acp "github.com/coder/acp-go-sdk"

	"github.com/brood-dev/brood/internal/acpio"
	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// ToolSpec is what a tools factory gets for one ACP session's agent: its
// header (cwd, lineage, ceiling) and the coordinator client the agent may
// delegate through (the `subagent` tool acts with the agent's credential,
// which arrives in each call's ToolContext).
type ToolSpec struct {
	Header protocol.SessionHeader
	Client *client.Client
}

// ToolsFactory returns the global tools of one session's agent. The
// session's tool ceiling is applied afterwards: a tool it denies is removed,
// whatever the factory returned.
type ToolsFactory func(ToolSpec) ([]*agent.Tool, error)

// DefaultTools gives every session the workspace tool list_dir, with no
// workspace root: it refuses every path (DelegationTools takes the roots).
func DefaultTools(ToolSpec) ([]*agent.Tool, error) {
	return []*agent.Tool{agent.ListDirTool()}, nil
}

// DelegationTools gives every session the workspace tools (bounded by
// workspaceRoots: none allows no workspace; agent.ResolveInWorkspace) and the delegation
// tools: `subagent` on provider (foreground one-shot, or run_in_background
// for a continuable child), send_message, interrupt_agent and list_agents,
// all acting with the session agent's own credential.
func DelegationTools(provider string, workspaceRoots ...string) ToolsFactory {
	return func(spec ToolSpec) ([]*agent.Tool, error) {
		return []*agent.Tool{
			agent.ListDirTool(workspaceRoots...), agent.ReadFileTool(workspaceRoots...),
			agent.SubagentTool(agent.SubagentConfig{Client: spec.Client, Provider: provider,
				Background: agent.BackgroundStarter(spec.Client, provider)}),
			agent.SendMessageTool(spec.Client), agent.InterruptAgentTool(spec.Client), agent.ListAgentsTool(spec.Client),
		}, nil
	}
}

// Config configures an ACP agent server.
type Config struct {
	// Client talks to the coordinators; Store reads and writes session logs.
	Client *client.Client
	Store  *store.Store
	Models worker.ModelFactory
	// Tools builds each session's tools (default DefaultTools).
	Tools ToolsFactory
	// Persona is the persona template (default agent.DefaultPersona).
	Persona string
	Limits  agent.Limits
	// In carries the client's messages (stdin), Out ours (stdout). Nothing
	// else may write to Out.
	In  io.Reader
	Out io.Writer
	// ShutdownTimeout bounds the wait for running turns and root closes
	// when the client disconnects (10 s).
	ShutdownTimeout time.Duration
	Version         string
	Logger          *slog.Logger
}

// Service is one ACP connection's agent server.
type Service struct {
	cfg  Config
	log  *slog.Logger
	conn *acp.AgentSideConnection

	mu       sync.Mutex
	sessions map[string]*session
	// loading holds the session/load requests in progress by session id;
	// the channel is closed when that load ends (load.go).
	loading map[string]chan struct{}
	closing bool
	// grant is the user grant the editor's answers to requests go with
	// (requests.go), minted when first needed.
	grant protocol.UserGrantReply
}

// New checks cfg and returns the server; Run serves it.
func New(cfg Config) (*Service, error) {
	if cfg.Client == nil || cfg.Store == nil || cfg.Models == nil || cfg.In == nil || cfg.Out == nil {
		return nil, errors.New("acp-agent: Client, Store, Models, In and Out are required")
	}
	if cfg.Tools == nil {
		cfg.Tools = DefaultTools
	}
	if cfg.Persona == "" {
		cfg.Persona = agent.DefaultPersona
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.Version == "" {
		cfg.Version = "0.1.0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := protocol.ValidatePersona(cfg.Persona); err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, loading: map[string]chan struct{}{}}, nil
}

// Run serves the ACP connection until the client disconnects (EOF on In) or
// ctx is done, then ends running turns (aborted) and closes every root. A
// disconnect is a clean stop: nil.
func (s *Service) Run(ctx context.Context) error {
	// The SDK starts reading In in its constructor and reads its logger
	// unguarded when In ends: nothing is read until the logger is set (a
	// client that disconnected at once raced with SetLogger).
	in := &gatedReader{r: s.cfg.In, open: make(chan struct{})}
	s.conn = acp.NewAgentSideConnection(s, s.cfg.Out, in)
	s.conn.SetLogger(s.log.With("component", "acp-sdk"))
	close(in.open)
	select {
	case <-s.conn.Done():
	case <-ctx.Done():
	}
	s.shutdown()
	return nil
}

// gatedReader is r, read only once open is closed.
type gatedReader struct {
	r    io.Reader
	open chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	<-g.open
	return g.r.Read(p)
}

func (s *Service) shutdown() {
	s.mu.Lock()
	s.closing = true
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, ss := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss.close(ctx)
		}()
	}
	wg.Wait()
}

func (s *Service) get(id acp.SessionId) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.sessions[string(id)]
	if !ok {
		return nil, notFound(fmt.Sprintf("session %s is not open in this agent process; load it with session/load", id))
	}
	return ss, nil
}

func (s *Service) add(ss *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return acp.NewInternalError(map[string]any{"error": "the agent is shutting down"})
	}
	s.sessions[ss.id] = ss
	return nil
}

func notFound(msg string) error {
	return &acp.RequestError{Code: -32002, Message: "Resource not found", Data: map[string]any{"error": msg}}
}

// brood maps a Brood error to a JSON-RPC error that keeps its code and message.
func brood(what string, err error) error {
	pe := protocol.AsError(err)
	if pe.Code == protocol.CodeNotFound {
		return notFound(what + ": " + pe.Error())
	}
	return acp.NewInternalError(map[string]any{"error": what + ": " + pe.Error(), "code": string(pe.Code)})
}

// Initialize implements acp.Agent: protocol version 1, session/load offered.
func (s *Service) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{
		ProtocolVersion:   acp.ProtocolVersionNumber,
		AgentCapabilities: acp.AgentCapabilities{LoadSession: true},
		AgentInfo:         &acp.Implementation{Name: "brood", Version: s.cfg.Version},
		AuthMethods:       []acp.AuthMethod{},
	}, nil
}

// Authenticate implements acp.Agent; no authentication is needed (the NATS
// connection's permissions are the authority).
func (s *Service) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, nil
}

// NewSession implements acp.Agent: a new reopenable root in cwd, narrowed by
// the lineage in `_meta` when the ACP bridge sent one.
func (s *Service) NewSession(ctx context.Context, p acp.NewSessionRequest) (_ acp.NewSessionResponse, err error) {
	ctx, span := startSpan(ctx, acp.AgentMethodSessionNew, p.Meta, "")
	defer func() { tracecontext.End(span, err) }()
	if err := acpio.ValidateDir(p.Cwd); err != nil {
		return acp.NewSessionResponse{}, acp.NewInvalidParams(map[string]any{"error": "cwd: " + err.Error()})
	}
	lineage, err := protocol.LineageFromMeta(p.Meta)
	if err != nil {
		return acp.NewSessionResponse{}, acp.NewInvalidParams(map[string]any{"error": err.Error()})
	}
	req := protocol.AgentsOpenRequest{Cwd: p.Cwd, Reopenable: true}
	if lineage != nil {
		req.Lineage = &protocol.RootLineage{
			ParentSession: lineage.ParentSession, DelegationDepth: lineage.DelegationDepth,
			DepthCap: lineage.DepthCap, ToolCeiling: lineage.ToolCeiling,
		}
	}
	root, err := s.cfg.Client.OpenRoot(ctx, req)
	if err != nil {
		return acp.NewSessionResponse{}, brood("open a Brood session", err)
	}
	h, err := s.cfg.Store.GetHeader(ctx, root.SessionID)
	if err != nil {
		s.closeRoot(root)
		return acp.NewSessionResponse{}, brood("read the session header", err)
	}
	ss, err := s.build(root, h, nil, s.cfg.Store.NewLogWriter(protocol.ScopeRoot, root.SessionID, 0, 0))
	if err == nil {
		err = s.add(ss)
	}
	if err != nil {
		s.closeRoot(root)
		return acp.NewSessionResponse{}, err
	}
	ss.watch()
	s.log.Info("ACP session opened", "session", root.SessionID, "depth", h.DelegationDepth, "parent", h.ParentSession)
	return acp.NewSessionResponse{SessionId: acp.SessionId(root.SessionID)}, nil
}

// LoadSession implements acp.AgentLoader: the root is reopened (or found open
// in this process), its log read, a turn left open closed as interrupted,
// and the conversation replayed as session/update notifications.
func (s *Service) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (_ acp.LoadSessionResponse, err error) {
	id := string(p.SessionId)
	ctx, span := startSpan(ctx, acp.AgentMethodSessionLoad, p.Meta, id)
	defer func() { tracecontext.End(span, err) }()
	ss, done, err := s.beginLoad(ctx, id)
	if err != nil {
		return acp.LoadSessionResponse{}, err
	}
	if ss != nil {
		ss.replay(ctx, ss.agent.Events())
		return acp.LoadSessionResponse{}, nil
	}
	defer done()
	if !protocol.ValidID(id) {
		return acp.LoadSessionResponse{}, notFound(fmt.Sprintf("session %q is not a Brood session id", id))
	}
	// Reopening takes the root's identity over: it needs a user grant, which
	// this process (a trusted host acting for the editor's user) mints.
	grant, err := s.cfg.Client.UserGrant(ctx)
	if err != nil {
		return acp.LoadSessionResponse{}, brood("mint a user grant to reopen session "+id, err)
	}
	root, err := s.cfg.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{SessionID: id, Grant: grant.Grant})
	if err != nil {
		return acp.LoadSessionResponse{}, brood("reopen session "+id, err)
	}
	h, err := s.cfg.Store.GetHeader(ctx, id)
	if err != nil {
		s.closeRoot(root)
		return acp.LoadSessionResponse{}, brood("read the session header", err)
	}
	if p.Cwd != h.Cwd {
		s.log.Info("session/load names another cwd; the session keeps its own", "session", id, "asked", p.Cwd, "cwd", h.Cwd)
	}
	lg, err := s.cfg.Store.ReadLog(ctx, protocol.ScopeRoot, id)
	if err != nil {
		s.closeRoot(root)
		return acp.LoadSessionResponse{}, brood("read the session log", err)
	}
	lw := s.cfg.Store.NewLogWriter(protocol.ScopeRoot, id, lg.LastSubjSeq, int64(len(lg.Events)))
	events := lg.Events
	closing, err := sessionlog.CloseOpenTurn(events, protocol.TurnEndReason{Kind: protocol.TurnInterrupted}, store.NowMs())
	if err == nil && len(closing) > 0 {
		var written []protocol.SessionEvent
		if written, err = lw.Append(ctx, closing...); err == nil {
			events = append(events, written...)
		}
	}
	if err != nil {
		s.closeRoot(root)
		return acp.LoadSessionResponse{}, brood("close the turn the previous process left open", err)
	}
	ss, err = s.build(root, h, events, lw)
	if err == nil {
		err = s.add(ss)
	}
	if err != nil {
		s.closeRoot(root)
		return acp.LoadSessionResponse{}, err
	}
	ss.replay(ctx, events)
	ss.watch()
	s.log.Info("ACP session loaded", "session", id, "events", len(events))
	return acp.LoadSessionResponse{}, nil
}

// Prompt implements acp.Agent: one Brood turn; text streams as
// agent_message_chunk, tool calls as tool_call / tool_call_update.
func (s *Service) Prompt(ctx context.Context, p acp.PromptRequest) (_ acp.PromptResponse, err error) {
	ctx, span := startSpan(ctx, acp.AgentMethodSessionPrompt, p.Meta, string(p.SessionId))
	defer func() { tracecontext.End(span, err) }()
	ss, err := s.get(p.SessionId)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	var content []protocol.ContentBlock
	for _, b := range p.Prompt {
		switch {
		case b.Text != nil && b.Text.Text != "":
			content = append(content, protocol.ContentBlock{Type: protocol.BlockText, Text: b.Text.Text})
		case b.ResourceLink != nil:
			content = append(content, protocol.ContentBlock{Type: protocol.BlockText, Text: "[resource " + b.ResourceLink.Uri + "]"})
		}
	}
	if len(content) == 0 {
		return acp.PromptResponse{}, acp.NewInvalidParams(map[string]any{"error": "the prompt has no text"})
	}
	// Who sent it: the ACP bridge says so for a prompt relayed from a parent
	// agent (provenance only); an editor's prompt is the user's.
	src := protocol.MessageSource{Kind: protocol.SourceUser}
	var pm protocol.ACPPromptMeta
	if protocol.ACPMetaOf(p.Meta, &pm) && pm.Source != nil && pm.Source.Kind != "" {
		src = *pm.Source
	}
	return ss.prompt(ctx, content, src)
}

// Cancel implements acp.Agent: the session's running turn ends aborted{user}.
func (s *Service) Cancel(_ context.Context, p acp.CancelNotification) error {
	if ss, err := s.get(p.SessionId); err == nil {
		ss.cancelTurn(protocol.CauseUser)
	}
	return nil
}

// CloseSession, ListSessions, ResumeSession, SetSessionConfigOption and
// SetSessionMode are not offered (their capabilities are not advertised).
func (s *Service) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

func (s *Service) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}

func (s *Service) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

func (s *Service) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

func (s *Service) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

func (s *Service) closeRoot(root *client.Root) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := root.Close(ctx); err != nil {
		s.log.Warn("could not close a root", "session", root.SessionID, "err", err)
	}
}

var (
	_ acp.Agent       = (*Service)(nil)
	_ acp.AgentLoader = (*Service)(nil)
)
