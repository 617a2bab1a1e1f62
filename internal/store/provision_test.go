package store_test

import (
	"context"
	"errors"
	"slices"
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
	if !errors.Is(err, store.ErrNotProvisioned) || !strings.Contains(err.Error(), "BROOD_LOG_spawn") || !strings.Contains(err.Error(), "brood provision") {
		t.Fatalf("open before provision = %v, want ErrNotProvisioned naming BROOD_LOG_spawn and brood provision", err)
	}
	js := noStreams(ctx, t, nc, "BROOD_LOG_root")

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

	// An operator (or an attacker with the right) changes BROOD_LOG_spawn.
	str, err := js.Stream(ctx, "BROOD_LOG_spawn")
	if err != nil {
		t.Fatal(err)
	}
	changed := str.CachedInfo().Config
	changed.MaxMsgsPerSubject = 1
	if _, err := js.UpdateStream(ctx, changed); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(ctx, nc, subj, cfg)
	if !errors.Is(err, store.ErrMisconfigured) || !strings.Contains(err.Error(), "BROOD_LOG_spawn: max_msgs_per_subject 1, want -1") {
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
		st.Subj.Log(protocol.ScopeRoot, "mine"), st.Subj.Inbox("spawn", "mine"), st.Subj.Events("spawn", "mine", "end"), st.Subj.Session("mine")} {
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
	info, err := js.Stream(ctx, "BROOD_LOG_spawn")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config.Replicas; got != 3 {
		t.Fatalf("BROOD_LOG_spawn has %d replicas, want 3", got)
	}
}

// TestEachScopeHasItsOwnLogAndInboxStreams (issue 17, point 4, design item
// 1 of docs/security.md's "What comes next"): Provision makes a log and an
// inbox stream per provider of Config.Providers and the roots'; every write
// goes to its session's scope's stream and no other, a read of one scope
// never sees another's, a scope without streams is refused; Open names the
// streams a service's providers lack and the command that makes them, and
// a worker's (SkipRoots) needs no root stream.
func TestEachScopeHasItsOwnLogAndInboxStreams(t *testing.T) {
	nc := testutil.Connect(t, testutil.Server(t).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	cfg.Providers = []string{"a", "b-2"}
	st, err := store.Provision(ctx, nc, subj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	msgs := func(name string) uint64 {
		t.Helper()
		str, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := str.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	for _, name := range []string{"BROOD_LOG_a", "BROOD_INBOX_a", "BROOD_LOG_b-2", "BROOD_INBOX_b-2", "BROOD_LOG_root", "BROOD_INBOX_root"} {
		if n := msgs(name); n != 0 {
			t.Fatalf("%s holds %d messages before any write", name, n)
		}
	}
	noStreams(ctx, t, nc, "BROOD_LOG", "BROOD_INBOX", "BROOD_LOG_spawn")

	ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.NewLogWriter("a", "S", 0, 0).Append(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Enqueue(ctx, "b-2", "S", store.InboxItem{Content: protocol.Text("hi")}, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Enqueue(ctx, protocol.ScopeRoot, "R", store.InboxItem{Content: protocol.Text("hi")}, ""); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint64{"BROOD_LOG_a": 1, "BROOD_INBOX_a": 0, "BROOD_LOG_b-2": 0, "BROOD_INBOX_b-2": 1, "BROOD_LOG_root": 0, "BROOD_INBOX_root": 1} {
		if n := msgs(name); n != want {
			t.Errorf("%s holds %d messages, want %d", name, n, want)
		}
	}
	if log, err := st.ReadLog(ctx, "a", "S"); err != nil || len(log.Events) != 1 {
		t.Fatalf("S's log in scope a: %d events, %v; want 1", len(log.Events), err)
	}
	if log, err := st.ReadLog(ctx, "b-2", "S"); err != nil || len(log.Events) != 0 {
		t.Fatalf("S's log read in scope b-2: %d events, %v; want none", len(log.Events), err)
	}
	if items, err := st.InboxOf("a", "S").Pending(ctx, 0); err != nil || len(items) != 0 {
		t.Fatalf("S's inbox read in scope a: %d items, %v; want none", len(items), err)
	}
	if items, err := st.InboxOf("b-2", "S").Pending(ctx, 0); err != nil || len(items) != 1 {
		t.Fatalf("S's inbox in scope b-2: %d items, %v; want 1", len(items), err)
	}
	pending, err := st.PendingInboxes(ctx)
	if err != nil || len(pending) != 2 || pending[subj.Inbox("b-2", "S")] != 1 || pending[subj.Inbox(protocol.ScopeRoot, "R")] != 1 {
		t.Fatalf("pending inboxes over every scope: %v, %v", pending, err)
	}
	// A scope without streams: no write lands anywhere.
	if _, _, err := st.Enqueue(ctx, "c", "S", store.InboxItem{Content: protocol.Text("hi")}, ""); !errors.Is(err, store.ErrNotProvisioned) {
		t.Fatalf("an item for an unprovisioned scope: %v, want ErrNotProvisioned", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	defer wcancel()
	if _, err := st.NewLogWriter("c", "S", 0, 0).Append(wctx, ev); err == nil {
		t.Fatal("an append to an unprovisioned scope's log landed")
	}

	// Open: a service's providers' streams, named when missing.
	for _, tc := range []struct {
		name      string
		providers []string
		skipRoots bool
		missing   []string // nil: opens
		present   []string // not named
	}{
		{"provisioned providers", []string{"b-2"}, false, nil, nil},
		{"a worker of a provisioned provider", []string{"a"}, true, nil, nil},
		{"a provider never provisioned", []string{"a", "c"}, false, []string{"BROOD_LOG_c", "BROOD_INBOX_c", "--providers"}, []string{"BROOD_LOG_a"}},
		{"a worker of a provider never provisioned", []string{"c"}, true, []string{"BROOD_LOG_c", "BROOD_INBOX_c"}, []string{"root"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.Providers, c.SkipRoots = tc.providers, tc.skipRoots
			_, err := store.Open(ctx, nc, subj, c)
			if tc.missing == nil {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				return
			}
			if !errors.Is(err, store.ErrNotProvisioned) {
				t.Fatalf("open: %v, want ErrNotProvisioned", err)
			}
			for _, s := range tc.missing {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("open: %v, want it to name %s", err, s)
				}
			}
			for _, s := range tc.present {
				if strings.Contains(err.Error(), s) {
					t.Errorf("open: %v names %s, which exists", err, s)
				}
			}
		})
	}
}

// TestProviderNamesAreChecked: a provider list with a name that is no
// valid id (it names streams and subjects), the roots' scope, or a name
// twice is INVALID_ARGUMENT, and Provision makes nothing of it.
func TestProviderNamesAreChecked(t *testing.T) {
	for _, tc := range []struct {
		providers []string
		ok        bool
	}{
		{nil, true},
		{[]string{"spawn", "fork", "a_b-C9"}, true},
		{[]string{"root"}, false},
		{[]string{"a.b"}, false},
		{[]string{"a*"}, false},
		{[]string{""}, false},
		{[]string{"spawn", "spawn"}, false},
		{[]string{strings.Repeat("p", 65)}, false},
		{slices.Repeat([]string{"p"}, store.ProvidersMax+1), false},
	} {
		err := store.CheckProviders(tc.providers)
		if tc.ok != (err == nil) || (err != nil && protocol.CodeOf(err) != protocol.CodeInvalidArgument) {
			t.Errorf("CheckProviders(%q) = %v, want ok %v or INVALID_ARGUMENT", tc.providers, err, tc.ok)
		}
	}
	nc := testutil.Connect(t, testutil.Server(t).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := store.DefaultConfig()
	cfg.Providers = []string{"root"}
	if _, err := store.Provision(ctx, nc, protocol.MustSubjects(""), cfg); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
		t.Fatalf("provision of a provider named root: %v", err)
	}
	noStreams(ctx, t, nc, "BROOD_SESSIONS")
}

// noStreams fails the test unless none of the streams names exists, and
// returns a JetStream context on nc.
func noStreams(ctx context.Context, t *testing.T, nc *nats.Conn, names ...string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if _, err := js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("stream %s: %v, want none", name, err)
		}
	}
	return js
}
