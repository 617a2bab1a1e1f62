// Package dev runs a whole Brood deployment inside one process: an embedded
// NATS server with JetStream on loopback, a coordinator, and workers of the
// spawn and fork providers on the deterministic scripted model (docs/design.md
// §5). It is `brood dev` as a library, without the ACP bridge, for the
// examples and tests of code that talks to Brood only over the wire
// (pkg/client's runnable examples start one).
package dev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
	forkworker "github.com/brood-dev/brood/services/fork-worker"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// ReadyTimeout bounds Start's wait for the providers to be listed.
const ReadyTimeout = 30 * time.Second

// Config configures a deployment. Zero values take the defaults.
type Config struct {
	// DataDir holds JetStream's file storage (required; a fresh temp dir
	// gives a fresh deployment).
	DataDir string
	// Host and Port the server listens on: default 127.0.0.1 and a free port.
	Host string
	Port int
	// Prefix is the subject prefix (default "brood").
	Prefix string
	// HeartbeatInterval and HostExpiry of the services (zero: the services'
	// defaults, protocol.DefaultHeartbeatInterval and DefaultHostExpiry).
	HeartbeatInterval time.Duration
	HostExpiry        time.Duration
	// Logger receives the services' logs (default: discarded).
	Logger *slog.Logger
	// Providers are providers besides spawn and fork whose log and inbox
	// streams are provisioned, for hosts started outside the deployment to
	// serve (a pkg/provider host); store.DefaultProviders always are.
	Providers []string
}

// Deployment is a running deployment; Stop ends it.
type Deployment struct {
	ns      *embedded.Server
	nc      *nats.Conn
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	errMu   sync.Mutex
	errs    []error
	stopped sync.Once
}

// actor is a long-lived service component.
type actor interface {
	Run(ctx context.Context) error
}

// Start starts the server, provisions Brood's streams and buckets, runs a
// coordinator and the spawn and fork workers, and returns once both
// providers are listed. Stop it with Stop.
func Start(ctx context.Context, cfg Config) (*Deployment, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("dev: DataDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = -1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	subj, err := protocol.NewSubjects(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	ns, err := embedded.Start(embedded.Config{Host: cfg.Host, Port: cfg.Port, DataDir: cfg.DataDir})
	if err != nil {
		return nil, err
	}
	d := &Deployment{ns: ns}
	fail := func(err error) (*Deployment, error) {
		d.Stop()
		return nil, err
	}
	if d.nc, err = nats.Connect(ns.ClientURL(), nats.Name("brood-dev-library"), nats.MaxReconnects(-1)); err != nil {
		return fail(err)
	}
	pctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	sc := store.DefaultConfig()
	for _, p := range cfg.Providers {
		if !slices.Contains(sc.Providers, p) {
			sc.Providers = append(sc.Providers, p)
		}
	}
	st, err := store.Provision(pctx, d.nc, subj, sc)
	if err != nil {
		return fail(fmt.Errorf("dev: provision: %w", err))
	}
	models := func() (model.Model, error) { return model.NewScripted(), nil }
	c, err := coordinator.New(coordinator.Config{NC: d.nc, Store: st, HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry, Logger: cfg.Logger})
	if err != nil {
		return fail(err)
	}
	actors := []actor{c}
	for _, desc := range []protocol.ProviderDescriptor{spawnworker.Descriptor(spawnworker.DefaultName), forkworker.Descriptor(forkworker.DefaultName)} {
		desc.Models = []protocol.ModelInfo{model.ScriptedInfo} // what they answer with, named (docs/protocol.md §9.1)
		w, err := worker.NewInProcessHost(worker.InProcessConfig{
			NC: d.nc, Store: st, Models: models, HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry,
			DrainGrace: 2 * time.Second, Logger: cfg.Logger,
			// One user's own development deployment, as `brood dev`: any
			// workspace (docs/security.md, "The workspace is fenced").
			WorkspaceRoots: []string{agent.AnyWorkspace},
		}, desc)
		if err != nil {
			return fail(err)
		}
		actors = append(actors, w)
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = stop
	for _, a := range actors {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := a.Run(runCtx); err != nil {
				d.errMu.Lock()
				d.errs = append(d.errs, err)
				d.errMu.Unlock()
			}
		}()
	}
	if err := d.waitProviders(pctx, subj, spawnworker.DefaultName, forkworker.DefaultName); err != nil {
		return fail(err)
	}
	return d, nil
}

// waitProviders polls providers.list until every name has a live instance.
func (d *Deployment) waitProviders(ctx context.Context, subj protocol.Subjects, names ...string) error {
	for {
		var r protocol.ProvidersListReply
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		data, _ := protocol.Marshal(protocol.Msgpack, protocol.Empty{})
		m, err := d.nc.RequestWithContext(rctx, subj.Coord(protocol.EpProvidersList), data)
		cancel()
		if err == nil && protocol.Unmarshal(protocol.Msgpack, m.Data, &r) == nil {
			all := true
			for _, n := range names {
				all = all && r.Instances[n] > 0
			}
			if all {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			d.errMu.Lock()
			defer d.errMu.Unlock()
			return fmt.Errorf("dev: providers %v not listed in time (service errors: %v)", names, d.errs)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL is the nats:// URL clients connect to.
func (d *Deployment) URL() string { return d.ns.ClientURL() }

// Stop drains the services, then closes the connection and the server. It
// is idempotent.
func (d *Deployment) Stop() {
	d.stopped.Do(func() {
		if d.cancel != nil {
			d.cancel()
		}
		d.wg.Wait()
		if d.nc != nil {
			d.nc.Close()
		}
		d.ns.Shutdown()
	})
}
