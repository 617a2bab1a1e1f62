package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestBroodOnProxiedCluster starts the deployment a chaos run uses (2
// coordinators, 2 spawn workers, R3) and runs a one-shot child through a
// client endpoint, then again while a worker is killed -9 and node 2 is
// unreachable, and after both healed.
func TestBroodOnProxiedCluster(t *testing.T) {
	c := testCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := c.StartBrood(ctx, BroodConfig{Binary: broodBin, Heartbeat: 250 * time.Millisecond, HostExpiry: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Coordinators) != 2 || len(b.Workers) != 2 {
		t.Fatalf("%d coordinators, %d workers", len(b.Coordinators), len(b.Workers))
	}
	ep, err := c.NewEndpoint("client")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ep.URLs(1), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, err := client.New(nc, client.Options{AwaitFallback: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eventually(t, 60*time.Second, "spawn listed with 2 instances", func() bool {
		r, err := cl.Providers(ctx)
		return err == nil && r.Instances["spawn"] == 2
	})
	root, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = root.Close(cctx) // stops its renewals
	}()
	run := func(text string) {
		t.Helper()
		var res protocol.SubagentResult
		eventually(t, 60*time.Second, "a one-shot run completes", func() bool {
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			r, err := cl.StartRun(rctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say " + text), Options: protocol.StartOptions{}})
			if err != nil {
				t.Logf("start: %v", err)
				return false
			}
			res, err = r.Result(rctx)
			return err == nil && res.StopReason == protocol.StopCompleted
		})
		if got := protocol.PlainText(res.Output); got != text {
			t.Fatalf("output %q, want %q", got, text)
		}
	}
	run("before")
	b.Workers[0].Kill()
	// Node 2 cut off from the other nodes and from every client: the
	// processes and the client reconnect to the majority.
	c.Unreachable(1, Cut)
	run("during")
	c.HealAll()
	if err := b.Workers[0].Start(ctx); err != nil {
		t.Fatal(err)
	}
	run("after")
}
