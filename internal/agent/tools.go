package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// ToolContext is what a tool knows of the agent calling it.
type ToolContext struct {
	Header     protocol.SessionHeader
	Credential string
	Turn, Step int64
	CallID     string
}

// ToolResult is a tool's answer. IsError results are shown to the model as
// failures; Conclude ends the turn after this step (structured capture).
type ToolResult struct {
	Content  []protocol.ContentBlock
	IsError  bool
	Conclude bool
	// Structured is the captured value of structured_output (canonical JSON).
	Structured string
	// Meta is logged with the result, never shown to the model.
	Meta map[string]string
	// ChildUsage, logged with the result (never shown to the model), is
	// the usage of the child a delegation waited for: the log's subtree
	// usage counts it (docs/protocol.md §6.6).
	ChildUsage *protocol.UsageSummary
}

// ErrorResult is an isError result with one text block.
func ErrorResult(format string, args ...any) ToolResult {
	return ToolResult{Content: protocol.Text(fmt.Sprintf(format, args...)), IsError: true}
}

// TextResult is a successful result with one text block.
func TextResult(s string) ToolResult { return ToolResult{Content: protocol.Text(s)} }

// Tool is one model-facing tool. Parameters is its JSON Schema. Run gets the
// raw JSON arguments exactly as the model produced them; it must honour ctx
// and never panic on bad input (bad input is an isError result).
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
	Run         func(ctx context.Context, tc ToolContext, args string) ToolResult
	// Available, when set, says whether a session may be offered the tool
	// at all (the subagent tool is hidden from a session at its depth cap);
	// Registry.ForSession drops the tool where it answers false.
	Available func(h protocol.SessionHeader) bool
	// Delegates marks a tool that may start children (the subagent tool):
	// an agent that called one has descendants to dispose when it ends.
	Delegates bool
	// NeedsApproval marks a tool that changes the workspace or runs a
	// program (ApprovalTools): it runs only when the session's header
	// allows it outright (SessionHeader.AutoApprove) or an approval was
	// given. Any other tool asks the same way when the header's
	// ApproveTools names it (SessionHeader.Asks); otherwise the call gets an error result and the turn goes on
	// (Agent.runTool; docs/protocol.md §9.1, "Workspace tools").
	NeedsApproval bool
	// Asks marks the ask tool: the agent runs the call itself, parking it
	// on a question request (Agent.ask), and never calls Run.
	Asks bool
	// Idempotent marks a tool whose call may run twice with the effect of
	// once (read_file, list_dir: they change nothing). When a run's host
	// dies with a call logged and its result not, the host that continues
	// the turn (Agent.ContinueTurn) runs an idempotent call again and gives
	// any other an error result saying it was interrupted by a host loss
	// and may or may not have taken effect (docs/protocol.md §8.4,
	// "Continued after a host loss"). Default false: a tool is taken to
	// change something unless it says otherwise.
	Idempotent bool
}

// Registry is an agent's tool set: global tools (subject to tool filters) and
// child-local tools (structured_output, report) added after filtering
// (docs/upstream-behaviour.md §1.7). Immutable once built; Restrict and WithLocal
// return new registries.
type Registry struct {
	tools []*Tool
	local map[string]bool
}

// NewRegistry builds a registry of global tools. Names must be unique.
func NewRegistry(tools ...*Tool) (*Registry, error) {
	r := &Registry{local: map[string]bool{}}
	seen := map[string]bool{}
	for _, t := range tools {
		if seen[t.Name] {
			return nil, fmt.Errorf("tool %q registered twice", t.Name)
		}
		seen[t.Name] = true
		r.tools = append(r.tools, t)
	}
	return r, nil
}

// Names returns the global tool names in registration order.
func (r *Registry) Names() []string {
	var out []string
	for _, t := range r.tools {
		if !r.local[t.Name] {
			out = append(out, t.Name)
		}
	}
	return out
}

// Lookup finds a tool the agent may call.
func (r *Registry) Lookup(name string) (*Tool, bool) {
	for _, t := range r.tools {
		if t.Name == name {
			return t, true
		}
	}
	return nil, false
}

// Specs returns the tools as advertised to the model.
func (r *Registry) Specs() []model.ToolSpec {
	out := make([]model.ToolSpec, 0, len(r.tools))
	for _, t := range r.tools {
		out = append(out, model.ToolSpec{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	return out
}

// Restrict returns the registry with f applied to its global tools: allow
// first, then deny. Removed tools vanish from the prompt and are refused as
// unknown when called anyway.
func (r *Registry) Restrict(f protocol.ToolFilter) (*Registry, error) {
	if err := protocol.ValidateToolFilter(f, r.Names()); err != nil {
		return nil, err
	}
	keep := func(name string) bool {
		if r.local[name] {
			return true
		}
		if f.Allow != nil && !contains(f.Allow, name) {
			return false
		}
		return !contains(f.Deny, name)
	}
	out := &Registry{local: r.local}
	for _, t := range r.tools {
		if keep(t.Name) {
			out.tools = append(out.tools, t)
		}
	}
	return out, nil
}

// WithLocal returns the registry plus child-local tools, which filters never
// remove. A local tool replaces a global one of the same name.
func (r *Registry) WithLocal(tools ...*Tool) *Registry {
	out := &Registry{local: map[string]bool{}}
	for k, v := range r.local {
		out.local[k] = v
	}
	names := map[string]bool{}
	for _, t := range tools {
		names[t.Name] = true
		out.local[t.Name] = true
	}
	for _, t := range r.tools {
		if !names[t.Name] {
			out.tools = append(out.tools, t)
		}
	}
	out.tools = append(out.tools, tools...)
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ForSession returns the registry without the tools that are not available
// to the session with header h (Tool.Available): they vanish from the prompt
// and are refused as unknown when called anyway.
func (r *Registry) ForSession(h protocol.SessionHeader) *Registry {
	out := &Registry{local: r.local}
	for _, t := range r.tools {
		if t.Available == nil || t.Available(h) {
			out.tools = append(out.tools, t)
		}
	}
	return out
}

// Ceiling returns the registry without the global tools a tool ceiling (the
// intersection of every ancestor's filter, docs/design.md §7) denies. Names the
// registry does not know are ignored: a ceiling spans providers.
func (r *Registry) Ceiling(c *protocol.ToolFilter) *Registry {
	if c == nil {
		return r
	}
	out := &Registry{local: r.local}
	for _, t := range r.tools {
		if r.local[t.Name] || c.Allows(t.Name) {
			out.tools = append(out.tools, t)
		}
	}
	return out
}

// approvalRequired is the result of a call to a tool that needs approval in
// a session whose start did not allow it outright, on a host with no
// request path: the tool did not run, and the turn goes on (the model may
// do without it or say what it needs). A tool the session's approveTools
// names is never allowed outright, so the hint is only for the others.
func approvalRequired(h protocol.SessionHeader, name string) ToolResult {
	if slices.Contains(h.ApproveTools, name) {
		return ErrorResult("%s needs approval before each call in this session (approveTools), and this session cannot ask for it; it did not run. "+
			"Do without it or say in your answer what you need", name)
	}
	return ErrorResult("%s needs approval before it runs, and this session cannot ask for it; it did not run. "+
		"A start allows it outright with the autoApprove option (brood run --auto-approve %s); otherwise do without it or say in your answer what you need",
		name, name)
}
