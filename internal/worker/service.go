package worker

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/mcptools"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// GlobalTools are the global tools in-process children offer, in order (the
// descriptor's tools, so filters are validated before anything is created).
// write_file, edit_file and run_command need approval (agent.ApprovalTools);
// ask parks on a question to the user or an ancestor (agent.AskTool).
// answer_request answers a descendant's request (agent.AnswerRequestTool).
var GlobalTools = []string{"list_dir", "read_file", "write_file", "edit_file", "run_command", "subagent", "send_message", "interrupt_agent", "list_agents", agent.AskToolName,
	protocol.ToolAnswerRequest}

// InProcessConfig configures the worker of an in-process provider (spawn, fork).
type InProcessConfig struct {
	NC    *nats.Conn
	Store *store.Store
	// Name is the provider name (default: the descriptor's).
	Name   string
	Models ModelFactory
	// ModelFor serves the descriptor's other models (InProcess.ModelFor).
	ModelFor ModelChooser
	// SubagentProvider is the provider the children's `subagent` tool
	// delegates to (default: this provider), and SubagentInherits whether
	// that provider's children see the delegating conversation (tool wording).
	SubagentProvider string
	SubagentInherits bool
	// WorkspaceRoots are the only directories a session's workspace (its
	// cwd) may lie in (agent.ResolveInWorkspace): empty allows none,
	// agent.AnyWorkspace any absolute directory, and a root holding
	// agent.UserToken that directory of the session's user
	// (docs/security.md, "The workspace is fenced").
	WorkspaceRoots []string
	// Persona overrides the deployment persona template.
	Persona string
	// Limits are the turn limits of the host's agents, shown in the
	// descriptor (defaults applied: agent.DefaultLimits) and narrowed per
	// session by its header's (docs/protocol.md §5.5).
	Limits            agent.Limits
	HostID            string
	HeartbeatInterval time.Duration
	HostExpiry        time.Duration
	DrainGrace        time.Duration
	Logger            *slog.Logger
	// Metrics, when set, counts the host's settlements and its agents'
	// model and tool calls, and reports its live runs and activations.
	Metrics *telemetry.Metrics
	// MCPServers are MCP servers whose tools the children get as global
	// tools `<server>__<tool>` (internal/mcptools, docs/mcp.md): connected
	// when the host is built (a server that cannot be reached fails it),
	// listed in the descriptor, stopped when Run returns.
	MCPServers []mcptools.ServerConfig
}

// InProcessDescriptor is the descriptor of an in-process provider: every
// start capability, continuable, the global tools (docs/design.md §6).
func InProcessDescriptor(name string, inheritsParentContext bool) protocol.ProviderDescriptor {
	return protocol.ProviderDescriptor{
		Name:                  name,
		Capabilities:          protocol.Capabilities{OutputSchema: true, DepthLimit: true, ToolFilter: true, Persona: true},
		InheritsParentContext: inheritsParentContext,
		Continuable:           true,
		Tools:                 append([]string(nil), GlobalTools...),
	}
}

// NewInProcessHost builds a host serving one in-process provider. A
// provider that inherits parent context seeds each child with its parent's
// balanced completed-turn prefix.
func NewInProcessHost(cfg InProcessConfig, desc protocol.ProviderDescriptor) (*Host, error) {
	if cfg.Name != "" {
		desc.Name = cfg.Name
	}
	turn := cfg.Limits.Turn()
	desc.Limits = &turn
	if cfg.SubagentProvider == "" {
		cfg.SubagentProvider, cfg.SubagentInherits = desc.Name, desc.InheritsParentContext
	}
	cl, err := client.New(cfg.NC, client.Options{Prefix: cfg.Store.Subj.Prefix()})
	if err != nil {
		return nil, err
	}
	var offered []string // the delegate's models, when it is this provider
	if cfg.SubagentProvider == desc.Name {
		for _, m := range desc.Models {
			offered = append(offered, m.String())
		}
	}
	delegate := agent.SubagentTool(agent.SubagentConfig{
		Client: cl, Provider: cfg.SubagentProvider, InheritsParentContext: cfg.SubagentInherits,
		Background: agent.BackgroundStarter(cl, cfg.SubagentProvider), Models: offered,
	})
	global := []*agent.Tool{agent.ListDirTool(cfg.WorkspaceRoots...), agent.ReadFileTool(cfg.WorkspaceRoots...),
		agent.WriteFileTool(cfg.WorkspaceRoots...), agent.EditFileTool(cfg.WorkspaceRoots...), agent.RunCommandTool(cfg.WorkspaceRoots...), delegate,
		agent.SendMessageTool(cl), agent.InterruptAgentTool(cl), agent.ListAgentsTool(cl), agent.AskTool(),
		agent.AnswerRequestTool(cl)}
	var servers *mcptools.Set
	if len(cfg.MCPServers) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), mcptools.ConnectTimeout*time.Duration(len(cfg.MCPServers)))
		servers, err = mcptools.Start(ctx, cfg.MCPServers, cfg.Logger)
		cancel()
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%w", err)
		}
		for _, name := range servers.Names() {
			if slices.Contains(desc.Tools, name) {
				servers.Close()
				return nil, protocol.Errorf(protocol.CodeInvalidArgument, "MCP tool %s has the name of a built-in tool", name)
			}
		}
		global = append(global, servers.Tools()...)
		desc.Tools = append(slices.Clone(desc.Tools), servers.Names()...)
	}
	for _, n := range desc.ApproveTools {
		if !desc.HasTool(n) {
			servers.Close()
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "approveTools: unknown tool %q; the provider's tools: %s", n, strings.Join(desc.Tools, ", "))
		}
	}
	if desc.ApproveTools = slices.Compact(slices.Sorted(slices.Values(desc.ApproveTools))); len(desc.ApproveTools) == 0 {
		desc.ApproveTools = nil
	}
	report := agent.ReportTool(cl)
	p := &InProcess{
		Desc: desc, Models: cfg.Models, ModelFor: cfg.ModelFor, Persona: cfg.Persona, Limits: cfg.Limits, Logger: cfg.Logger, Metrics: cfg.Metrics,
		Store: cfg.Store, Seeded: desc.InheritsParentContext, Requests: cl, Budget: cl,
		Tools: func(SessionSpec) ([]*agent.Tool, error) { return global, nil },
		Local: func(spec SessionSpec) []*agent.Tool {
			if spec.Continuable {
				return []*agent.Tool{report} // child-only: continuable children report to their parent
			}
			return nil
		},
	}
	h, err := New(Config{
		NC: cfg.NC, Store: cfg.Store, Providers: []Provider{p}, HostID: cfg.HostID,
		HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry, DrainGrace: cfg.DrainGrace, Logger: cfg.Logger,
		Metrics: cfg.Metrics, Stopped: servers.Close,
	})
	if err != nil {
		servers.Close()
	}
	return h, err
}
