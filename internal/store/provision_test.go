package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestOpenChecksAndNeverProvisions: a service's Open refuses a server that
// was not provisioned (naming what is missing and the admin step), accepts
// what Provision made, and refuses a stream someone changed, listing the
// difference, without changing it back (issue 17, point 4).
func TestOpenChecksAndNeverProvisions(t *testing.T) {
	nc := testutil.Connect(t, testutil.Server(t).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()

	_, err := store.Open(ctx, nc, subj, cfg)
	if !errors.Is(err, store.ErrNotProvisioned) || !strings.Contains(err.Error(), "BROOD_LOG") || !strings.Contains(err.Error(), "brood provision") {
		t.Fatalf("open before provision = %v, want ErrNotProvisioned naming BROOD_LOG and brood provision", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, "BROOD_LOG"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Open created a stream: %v", err)
	}

	if _, err := store.Provision(ctx, nc, subj, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(ctx, nc, subj, cfg); err != nil {
		t.Fatalf("open after provision: %v", err)
	}
	// Provisioning again changes nothing and is accepted.
	if _, err := store.Provision(ctx, nc, subj, cfg); err != nil {
		t.Fatal(err)
	}

	// An operator (or an attacker with the right) changes BROOD_LOG.
	str, err := js.Stream(ctx, "BROOD_LOG")
	if err != nil {
		t.Fatal(err)
	}
	changed := str.CachedInfo().Config
	changed.MaxMsgsPerSubject = 1
	if _, err := js.UpdateStream(ctx, changed); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(ctx, nc, subj, cfg)
	if !errors.Is(err, store.ErrMisconfigured) || !strings.Contains(err.Error(), "BROOD_LOG: max_msgs_per_subject 1, want -1") {
		t.Fatalf("open of a changed stream = %v, want ErrMisconfigured naming the difference", err)
	}
	if info, err := str.Info(ctx); err != nil || info.Config.MaxMsgsPerSubject != 1 {
		t.Fatalf("Open rewrote the stream: %+v, %v", info.Config.MaxMsgsPerSubject, err)
	}

	// Replicas are checked when the service is told them.
	want3 := cfg
	want3.Replicas = 3
	if _, err := store.Provision(ctx, nc, subj, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(ctx, nc, subj, want3); !errors.Is(err, store.ErrMisconfigured) || !strings.Contains(err.Error(), "replicas 1, want 3") {
		t.Fatalf("open expecting R3 on R1 streams = %v", err)
	}
	any := cfg
	any.Replicas = 0
	if _, err := store.Open(ctx, nc, subj, any); err != nil {
		t.Fatalf("open without a replica expectation: %v", err)
	}
}

// TestNoRollupPurgesABucketOrStream: a message with Nats-Rollup is refused
// on every stream and bucket, so whoever may write one key or one log cannot
// purge the rest (issue 17: a worker could wipe brood_agents with one put).
func TestNoRollupPurgesABucketOrStream(t *testing.T) {
	nc := testutil.Connect(t, testutil.Server(t).ClientURL())
	st := testutil.Store(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := store.Put(ctx, st.Agents, "other", protocol.DrainRecord{CreatedAt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutHeader(ctx, protocol.SessionHeader{Version: 1, ID: "S1", CreatedAt: 1, Cwd: "/w"}); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"$KV.brood_agents.mine", "$KV.brood_runs.mine", "$KV.brood_hosts.mine",
		st.Subj.Log(protocol.ScopeRoot, "mine"), st.Subj.Inbox("mine"), st.Subj.Events("spawn", "mine", "end"), st.Subj.Session("mine")} {
		for _, rollup := range []string{"all", "sub"} {
			m := nats.NewMsg(subject)
			m.Header.Set("Nats-Rollup", rollup)
			if _, err := st.JS.PublishMsg(ctx, m); err == nil || !strings.Contains(err.Error(), "rollup not permitted") {
				t.Errorf("publish to %s with Nats-Rollup %s = %v, want rollup not permitted", subject, rollup, err)
			}
		}
	}
	if _, err := store.Get[protocol.DrainRecord](ctx, st.Agents, "other"); err != nil {
		t.Fatalf("the other key: %v", err)
	}
	if _, err := st.GetHeader(ctx, "S1"); err != nil {
		t.Fatalf("the header: %v", err)
	}
}

// TestProvisionWaitsForPlacement: provisioning R3 on a fresh cluster whose
// third node has not been heard from yet is answered "no suitable peers for
// placement" (10005, what the deploy forgery suite's set-up got right after
// its cluster started); Provision keeps retrying within its deadline and
// succeeds once the node is up.
func TestProvisionWaitsForPlacement(t *testing.T) {
	c := testutil.NewClusterPartly(t, 3, 2)
	nc := testutil.Connect(t, c.URL(0))
	// Every stream creation request, as the server sees it.
	attempts := make(chan struct{}, 1024)
	sub, err := nc.Subscribe("$JS.API.STREAM.CREATE.*", func(*nats.Msg) { attempts <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := store.DefaultConfig()
	cfg.Replicas = 3
	done := make(chan error, 1)
	go func() {
		_, err := store.Provision(ctx, nc, protocol.MustSubjects(""), cfg)
		done <- err
	}()
	// Three attempts: the first ones were refused and retried, not final.
	for seen := 0; seen < 3; {
		select {
		case <-attempts:
			seen++
		case err := <-done:
			t.Fatalf("Provision ended before the third node started: %v", err)
		case <-ctx.Done():
			t.Fatal("Provision never retried its first stream")
		}
	}
	c.Restart(2)
	if err := <-done; err != nil {
		t.Fatalf("Provision after the third node started: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, "BROOD_LOG")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config.Replicas; got != 3 {
		t.Fatalf("BROOD_LOG has %d replicas, want 3", got)
	}
}
