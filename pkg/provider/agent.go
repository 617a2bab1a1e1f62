package provider

import (
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// AgentConfig configures a host whose one provider's children are Brood
// agents running in the host (the in-repo spawn and fork providers,
// docs/protocol.md §9.1 "Built-in descriptors"): their model, limits, the
// directories their workspaces may lie in, the provider their `subagent`
// tool delegates to. Its store, model and limits are of this module's
// runtime, so it serves compositions inside the module (services/spawn-worker,
// services/fork-worker); a program outside the module writes a text or a
// session provider instead.
type AgentConfig = worker.InProcessConfig

// AgentTools are the global tools a Brood agent child offers, in order (the
// descriptor's tools, against which a start's toolFilter is validated).
var AgentTools = worker.GlobalTools

// AgentDescriptor is the descriptor of a provider of Brood agent children:
// every start capability, continuable, AgentTools; inheritsParentContext
// makes each child start from its parent's balanced completed-turn prefix
// (a fork; docs/protocol.md §8.8).
func AgentDescriptor(name string, inheritsParentContext bool) protocol.ProviderDescriptor {
	return worker.InProcessDescriptor(name, inheritsParentContext)
}

// NewAgentHost builds a host serving one provider of Brood agent children
// described by desc (AgentDescriptor; cfg.Name, when set, renames it).
func NewAgentHost(cfg AgentConfig, desc protocol.ProviderDescriptor) (*Host, error) {
	h, err := worker.NewInProcessHost(cfg, desc)
	if err != nil {
		return nil, err
	}
	return &Host{h: h}, nil
}
