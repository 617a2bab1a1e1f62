// Package spawnworker is the `spawn` provider worker (DESIGN.md §6): a fresh
// child agent per run, with the parent's cwd and nothing of its history.
package spawnworker

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultName is the provider name unless configured.
const DefaultName = "spawn"

// Tools are the global tools spawn children offer, in order.
var Tools = []string{"list_dir", "read_file", "subagent"}

// Descriptor returns the spawn provider's descriptor (DESIGN.md §6).
func Descriptor(name string) protocol.ProviderDescriptor {
	return protocol.ProviderDescriptor{
		Name:         name,
		Capabilities: protocol.Capabilities{OutputSchema: true, DepthLimit: true, ToolFilter: true, Persona: true},
		Continuable:  true,
		Tools:        append([]string(nil), Tools...),
	}
}

// Config configures a spawn worker.
type Config struct {
	NC     *nats.Conn
	Store  *store.Store
	Name   string // provider name, default "spawn"
	Models worker.ModelFactory
	// SubagentProvider is the provider the children's `subagent` tool
	// delegates to (default "spawn").
	SubagentProvider string
	// Persona overrides the deployment persona template.
	Persona           string
	Limits            agent.Limits
	HostID            string
	HeartbeatInterval time.Duration
	HostExpiry        time.Duration
	DrainGrace        time.Duration
	Logger            *slog.Logger
}

// Service is a running spawn worker.
type Service struct{ host *worker.Host }

// New builds the worker.
func New(cfg Config) (*Service, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.SubagentProvider == "" {
		cfg.SubagentProvider = DefaultName
	}
	cl, err := client.New(cfg.NC, client.Options{Prefix: cfg.Store.Subj.Prefix()})
	if err != nil {
		return nil, err
	}
	delegate := agent.SubagentTool(agent.SubagentConfig{Client: cl, Provider: cfg.SubagentProvider})
	p := &worker.InProcess{
		Desc: Descriptor(cfg.Name), Models: cfg.Models, Persona: cfg.Persona, Limits: cfg.Limits, Logger: cfg.Logger,
		Tools: func(worker.SessionSpec) ([]*agent.Tool, error) {
			return []*agent.Tool{agent.ListDirTool(), agent.ReadFileTool(), delegate}, nil
		},
	}
	h, err := worker.New(worker.Config{
		NC: cfg.NC, Store: cfg.Store, Providers: []worker.Provider{p}, HostID: cfg.HostID,
		HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry, DrainGrace: cfg.DrainGrace, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Service{host: h}, nil
}

// HostID returns the worker's host id.
func (s *Service) HostID() string { return s.host.ID() }

// Run serves until ctx is done, then drains (nil on a clean stop).
func (s *Service) Run(ctx context.Context) error { return s.host.Run(ctx) }
