package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/providerhost/hook"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
)

// DefaultDrainGrace is how long a stopping host lets in-flight turns finish
// unless Config.DrainGrace says otherwise (10 s).
const DefaultDrainGrace = worker.DefaultDrainGrace

// Config configures a Host. Zero durations take the defaults of
// docs/protocol.md §10.
type Config struct {
	// NC is the host's NATS connection (required). In a deployment with
	// users it is the worker user of the providers' scope (docs/security.md).
	NC *nats.Conn
	// Prefix is the deployment's subject prefix (default "brood").
	Prefix string
	// Providers are the providers the host serves (at least one).
	Providers []Provider
	// Scope is the first token of the host id <Scope>.<HostID>: the name of
	// the one provider served (the default then), or
	// protocol.HostScopeShared (the default with several).
	Scope string
	// HostID is the unique part of the host id, ^[A-Za-z0-9_-]{1,64}$
	// (default a new ULID).
	HostID string
	// HeartbeatInterval is how often the host record is rewritten
	// (protocol.DefaultHeartbeatInterval, 1 s); HostExpiry how old a
	// heartbeat may be before the host counts as dead
	// (protocol.DefaultHostExpiry, 5 s): both must match the coordinators'.
	HeartbeatInterval time.Duration
	HostExpiry        time.Duration
	// DrainGrace is how long a stopping host lets in-flight turns finish
	// before disposing them (DefaultDrainGrace, 10 s).
	DrainGrace time.Duration
	// Logger receives the host's log (default slog.Default()).
	Logger *slog.Logger
}

// Host is one provider worker process: Run serves its providers.
type Host struct{ h *worker.Host }

// StoreOpenTimeout bounds Open's binding of the streams and buckets.
const StoreOpenTimeout = 10 * time.Second

// Open binds the deployment's streams and buckets on cfg.NC (the log and
// inbox streams of cfg's providers, which `brood provision --providers`
// made) and returns the host. It fails when they are not provisioned or are
// configured otherwise than Brood runs on, and when cfg is invalid (names,
// host id). Run serves it.
func Open(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.NC == nil || len(cfg.Providers) == 0 {
		return nil, errors.New("provider: NC and at least one provider are required")
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = protocol.DefaultPrefix
	}
	subj, err := protocol.NewSubjects(prefix)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%w", err)
	}
	sc := store.DefaultConfig()
	sc.Providers, sc.SkipRoots = nil, true
	for _, p := range cfg.Providers {
		sc.Providers = append(sc.Providers, p.Descriptor().Name)
	}
	if err := store.CheckProviders(sc.Providers); err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, StoreOpenTimeout)
	defer cancel()
	st, err := store.Open(octx, cfg.NC, subj, sc)
	if err != nil {
		return nil, fmt.Errorf("provider: open Brood's streams and buckets: %w", err)
	}
	h, err := worker.New(worker.Config{
		NC: cfg.NC, Store: st, Providers: cfg.Providers, Scope: cfg.Scope, HostID: cfg.HostID,
		HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry, DrainGrace: cfg.DrainGrace,
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Host{h: h}, nil
}

// The module's own compositions (internal/providerhost: the services' main,
// the test stack) build their hosts on the store and metrics they already
// hold, then hand them out as this package's Host.
func init() { hook.WrapHost = func(h *worker.Host) any { return &Host{h: h} } }

// ID returns the host id, <Scope>.<HostID>.
func (h *Host) ID() string { return h.h.ID() }

// Run registers the host, serves its providers until ctx is done, then
// drains: it stops admitting, lets in-flight turns finish within DrainGrace,
// disposes what is left, stops serving and removes its host record. It
// returns only once every request handler it started returned; a drain
// returns nil. It fails at once when another live host has the same id.
func (h *Host) Run(ctx context.Context) error { return h.h.Run(ctx) }
