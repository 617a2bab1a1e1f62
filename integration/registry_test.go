package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// TestADifferentDescriptorIsRefused: a worker whose provider is already
// registered with another descriptor refuses to start (DUPLICATE_PROVIDER).
// It reads the other hosts' records with one direct get, no consumer (a
// worker's NATS user may create none; docs/security.md).
func TestADifferentDescriptorIsRefused(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	desc := spawnworker.Descriptor(spawnworker.DefaultName)
	desc.Capabilities.Persona = !desc.Capabilities.Persona
	nc := s.Conn()
	w, err := worker.NewInProcessHost(worker.InProcessConfig{
		NC: nc, Store: testutil.Store(t, nc), Models: func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, DrainGrace: time.Second, Logger: testutil.Logger(t),
	}, desc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Run(ctx); !errors.Is(err, protocol.ErrDuplicateProvider) {
		t.Fatalf("a second spawn provider with another descriptor: Run = %v, want DUPLICATE_PROVIDER", err)
	}
	// The same descriptor is another instance of the provider.
	s.AddSpawnWorker()
	testutil.Eventually(t, 10*time.Second, func() bool {
		r, err := s.Client.Providers(ctx)
		return err == nil && r.Instances[spawnworker.DefaultName] == 2
	}, "two spawn instances listed")
}
