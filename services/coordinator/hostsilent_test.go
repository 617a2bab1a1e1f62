package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// TestTheStateOfAChildWhoseHostJustDiedSaysSo: continuable.state of a
// child whose host stopped answering a moment ago (its connection gone,
// as after a kill -9; its heartbeat not yet HostExpiry old, so its lease
// is still live) is UNAVAILABLE naming the silent host, the child and
// when a coordinator takes it over. It said "nobody serves
// brood.v1.host.<id>.state".
func TestTheStateOfAChildWhoseHostJustDiedSaysSo(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(cfg *coordinator.Config) { cfg.HostExpiry = time.Minute })
	nc := s.Conn()
	s.AddSpawnWorker(func(cfg *worker.InProcessConfig) { cfg.NC = nc })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: s.Root().Ref(), Label: "slow", Prompt: protocol.Text("sleep 60s\nsay late")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: r.ChildID, Authority: s.Grant()})
		return err == nil && st.State == protocol.StateRunning
	}, "the child runs")
	nc.Close() // the worker's connection: its subscriptions and heartbeats end at once
	_, err = s.Client.State(ctx, protocol.ChildRef{ChildID: r.ChildID, Authority: s.Grant()})
	want := "the host spawn."
	if !errors.Is(err, protocol.ErrUnavailable) || !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), " of "+r.ChildID+" does not answer: if it stopped, a coordinator takes "+r.ChildID+" over once its last heartbeat is 1m0s old; ask again then") {
		t.Fatalf("state of a child whose host died: %v; want UNAVAILABLE naming its silent host", err)
	}
}
