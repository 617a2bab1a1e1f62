package worker

import (
	"context"
	"log/slog"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/pkg/protocol"
)

// ModelFactory returns the model a new agent uses.
type ModelFactory func() (model.Model, error)

// ToolsFactory returns the global tools of one new agent (the tools named in
// the provider descriptor, in order).
type ToolsFactory func(spec SessionSpec) ([]*agent.Tool, error)

// InProcess is the provider driver shared by `spawn` and `fork`: the child
// is a Brood agent running in this host (upstream-behaviour §2, in-process
// one-shot driver).
type InProcess struct {
	Desc    protocol.ProviderDescriptor
	Models  ModelFactory
	Tools   ToolsFactory
	Persona string
	Limits  agent.Limits
	Logger  *slog.Logger
}

// Descriptor implements Provider.
func (p *InProcess) Descriptor() protocol.ProviderDescriptor { return p.Desc }

// NewSession composes the child agent: global tools restricted by the tool
// filter, the persona (the child's own shadows the deployment's), the model.
func (p *InProcess) NewSession(ctx context.Context, spec SessionSpec) (Session, error) {
	tools, err := p.Tools(spec)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "compose tools: %v", err)
	}
	reg, err := agent.NewRegistry(tools...)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "compose tools: %v", err)
	}
	if f := spec.Options.ToolFilter; f != nil {
		if reg, err = reg.Restrict(*f); err != nil {
			return nil, err
		}
	}
	// The ceiling every ancestor narrowed (DESIGN.md §7): a descendant never
	// gets a tool an ancestor was denied, whatever its own filter says.
	reg = reg.Ceiling(spec.Header.ToolCeiling)
	var sections []string
	if spec.Options.OutputSchema != "" {
		so, err := agent.StructuredOutputTool(spec.Options.OutputSchema)
		if err != nil {
			return nil, err
		}
		reg = reg.WithLocal(so)
		sections = append(sections, agent.StructuredOutputInstruction)
	}
	m, err := p.Models()
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "model: %v", err)
	}
	persona := p.Persona
	if persona == "" {
		persona = agent.DefaultPersona
	}
	if spec.Options.Persona != nil {
		persona = *spec.Options.Persona
	}
	vars := map[string]string{"provider": m.Provider(), "model": m.Name(), "cwd": spec.Header.Cwd}
	system, err := agent.SystemPrompt(persona, vars, spec.Header, sections...)
	if err != nil {
		return nil, err
	}
	logger := p.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return agent.New(agent.Config{
		Header: spec.Header, Log: spec.Log, Events: spec.Events, Model: m, Tools: reg,
		System: system, Credential: spec.Credential, Limits: p.Limits, Logger: logger,
	})
}
