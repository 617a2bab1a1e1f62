// Package forkworker is the `fork` provider worker (docs/design.md §6;
// docs/upstream-behaviour.md §2, §3.6): each child's log starts with its parent's
// balanced completed-turn prefix, read from the parent's log in JetStream, so
// a fork works whichever host runs the parent.
package forkworker

import (
	"github.com/brood-dev/brood/internal/providerhost"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// DefaultName is the provider name unless configured.
const DefaultName = "fork"

// Descriptor returns the fork provider's descriptor: every capability,
// inheritsParentContext, continuable (its preparation returns the seed).
func Descriptor(name string) protocol.ProviderDescriptor {
	return providerhost.AgentDescriptor(name, true)
}

// Config configures a fork worker; its children's `subagent` tool forks again
// unless SubagentProvider says otherwise.
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
