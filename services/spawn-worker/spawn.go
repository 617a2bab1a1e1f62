// Package spawnworker is the `spawn` provider worker (docs/design.md §6): a fresh
// child agent per run, with the parent's cwd and nothing of its history.
package spawnworker

import (
	"github.com/brood-dev/brood/internal/providerhost"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// DefaultName is the provider name unless configured.
const DefaultName = "spawn"

// Descriptor returns the spawn provider's descriptor (docs/design.md §6).
func Descriptor(name string) protocol.ProviderDescriptor {
	return providerhost.AgentDescriptor(name, false)
}

// Config configures a spawn worker; its children's `subagent` tool delegates
// to spawn unless SubagentProvider says otherwise.
type Config = providerhost.AgentConfig

// Service is a running worker: a host of the provider SDK (pkg/provider)
// serving this one provider (Run(ctx) serves until ctx is done, then drains;
// ID names the host). Its provider is a Brood agent on a model, composed in
// the module (internal/providerhost.NewAgentHost: the agent runtime and the
// deployment's store are not public), and handed to the SDK's host.
type Service = provider.Host

// New builds the worker.
func New(cfg Config) (*Service, error) {
	return providerhost.NewAgentHost(cfg, Descriptor(DefaultName))
}
