// Package spawnworker is the `spawn` provider worker (DESIGN.md §6): a fresh
// child agent per run, with the parent's cwd and nothing of its history.
package spawnworker

import (
	"context"

	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultName is the provider name unless configured.
const DefaultName = "spawn"

// Descriptor returns the spawn provider's descriptor (DESIGN.md §6).
func Descriptor(name string) protocol.ProviderDescriptor {
	return worker.InProcessDescriptor(name, false)
}

// Config configures a spawn worker; its children's `subagent` tool delegates
// to spawn unless SubagentProvider says otherwise.
type Config = worker.InProcessConfig

// Service is a running spawn worker.
type Service struct{ host *worker.Host }

// New builds the worker.
func New(cfg Config) (*Service, error) {
	h, err := worker.NewInProcessHost(cfg, Descriptor(DefaultName))
	if err != nil {
		return nil, err
	}
	return &Service{host: h}, nil
}

// HostID returns the worker's host id.
func (s *Service) HostID() string { return s.host.ID() }

// Run serves until ctx is done, then drains (nil on a clean stop).
func (s *Service) Run(ctx context.Context) error { return s.host.Run(ctx) }
