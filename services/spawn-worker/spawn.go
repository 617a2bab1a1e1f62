// Package spawnworker is the `spawn` provider worker (docs/design.md §6): a fresh
// child agent per run, with the parent's cwd and nothing of its history.
package spawnworker

import (
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// DefaultName is the provider name unless configured.
const DefaultName = "spawn"

// Descriptor returns the spawn provider's descriptor (docs/design.md §6).
func Descriptor(name string) protocol.ProviderDescriptor {
	return provider.AgentDescriptor(name, false)
}

// Config configures a spawn worker; its children's `subagent` tool delegates
// to spawn unless SubagentProvider says otherwise.
type Config = provider.AgentConfig

// Service is a running worker: a host of the provider SDK (pkg/provider)
// serving this one provider (Run(ctx) serves until ctx is done, then drains;
// ID names the host).
type Service = provider.Host

// New builds the worker.
func New(cfg Config) (*Service, error) {
	return provider.NewAgentHost(cfg, Descriptor(DefaultName))
}
