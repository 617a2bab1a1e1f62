// Package providerhost is how the module's own compositions (the services'
// main in cmd/brood, services/dev, the test stack) build provider hosts on
// what they already hold, where a program outside the module calls
// pkg/provider.Open: a host on an opened store and the process's metrics
// (New), and a host whose one provider's children are Brood agents running
// in it (NewAgentHost: the spawn and fork providers, docs/protocol.md §9.1
// "Built-in descriptors"). Either hands back the public SDK's *provider.Host
// (Run, ID), the same door a third party's host goes through; what is here
// needs the module's store, metrics and agent runtime, which no program
// outside the module can name, so it is not part of the public SDK
// (integration/publicapi_test.go).
package providerhost

import (
	"github.com/brood-dev/brood/internal/providerhost/hook"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// InModule is what a composition inside this module already holds and
// hands to the host instead of letting it open its own.
type InModule struct {
	// Store is the opened store (required); the host's subject prefix is
	// the store's (provider.Config.Prefix is not read).
	Store *store.Store
	// Metrics, when set, counts the runs and epochs the host settles and its
	// requests, and reports its live runs and activations.
	Metrics *telemetry.Metrics
}

// New builds a host serving cfg.Providers on m's store, as provider.Open
// does on the store it opens (cfg as there; its zero durations take the
// defaults of docs/protocol.md §10). It fails when cfg is invalid (no
// provider, a bad name or host id).
func New(m InModule, cfg provider.Config) (*provider.Host, error) {
	h, err := worker.New(worker.Config{
		NC: cfg.NC, Store: m.Store, Providers: cfg.Providers, Scope: cfg.Scope, HostID: cfg.HostID,
		HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry, DrainGrace: cfg.DrainGrace,
		Logger: cfg.Logger, Metrics: m.Metrics,
	})
	if err != nil {
		return nil, err
	}
	return wrap(h), nil
}

// AgentConfig configures a host whose one provider's children are Brood
// agents running in the host: their model, limits, the directories their
// workspaces may lie in, the provider their `subagent` tool delegates to,
// the MCP servers whose tools they get (worker.InProcessConfig).
type AgentConfig = worker.InProcessConfig

// AgentDescriptor is the descriptor of a provider of Brood agent children:
// every start capability, continuable, the global tools a Brood agent child
// offers in order (worker.GlobalTools: a start's toolFilter is validated
// against them); inheritsParentContext
// makes each child start from its parent's balanced completed-turn prefix
// (a fork; docs/protocol.md §8.8).
func AgentDescriptor(name string, inheritsParentContext bool) protocol.ProviderDescriptor {
	return worker.InProcessDescriptor(name, inheritsParentContext)
}

// NewAgentHost builds a host serving one provider of Brood agent children
// described by desc (AgentDescriptor; cfg.Name, when set, renames it). It
// fails when an MCP server of cfg cannot be reached or names a built-in
// tool (INVALID_ARGUMENT), and as New does.
func NewAgentHost(cfg AgentConfig, desc protocol.ProviderDescriptor) (*provider.Host, error) {
	h, err := worker.NewInProcessHost(cfg, desc)
	if err != nil {
		return nil, err
	}
	return wrap(h), nil
}

// wrap hands h out as the SDK's Host (pkg/provider sets the hook in its
// init, which has run: this package imports pkg/provider).
func wrap(h *worker.Host) *provider.Host { return hook.WrapHost(h).(*provider.Host) }
