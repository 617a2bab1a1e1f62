// Package forkworker is the `fork` provider worker (DESIGN.md §6;
// upstream-behaviour §2, §3.6): each child's log starts with its parent's
// balanced completed-turn prefix, read from the parent's log in JetStream, so
// a fork works whichever host runs the parent.
package forkworker

import (
	"context"

	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultName is the provider name unless configured.
const DefaultName = "fork"

// Descriptor returns the fork provider's descriptor: every capability,
// inheritsParentContext, continuable (its preparation returns the seed).
func Descriptor(name string) protocol.ProviderDescriptor {
	return worker.InProcessDescriptor(name, true)
}

// Config configures a fork worker; its children's `subagent` tool forks again
// unless SubagentProvider says otherwise.
type Config = worker.InProcessConfig

// Service is a running fork worker.
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
