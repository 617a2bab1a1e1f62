// Package testutil is the test harness: an embedded JetStream server per
// test, provisioned stores, services run in the background with cleanup, and
// polling with a deadline instead of sleeping.
package testutil

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Server starts an embedded nats-server with JetStream on a free loopback
// port with its store in a temp dir; it stops at the end of the test.
func Server(t testing.TB) *embedded.Server {
	t.Helper()
	return ServerIn(t, t.TempDir())
}

// ServerWithUsers is Server accepting only the given users (tests of NATS
// permissions); connect with their names and passwords in the URL.
func ServerWithUsers(t testing.TB, users []*server.User) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: -1, DataDir: t.TempDir(), ServerName: "test", Users: users})
	if err != nil {
		t.Fatalf("embedded server: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// ServerIn is Server with a given store directory (to restart on the same data).
func ServerIn(t testing.TB, dir string) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: -1, DataDir: dir, ServerName: "test"})
	if err != nil {
		t.Fatalf("embedded server: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Connect dials url; the connection closes at the end of the test.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// NewStore is a store provisioned (store.DefaultConfig) on a fresh
// embedded server of its own, for a test that needs nothing else of the
// server; both stop when the test ends.
func NewStore(t testing.TB) *store.Store {
	t.Helper()
	return Store(t, Connect(t, Server(t).ClientURL()))
}

// Store provisions Brood's streams and buckets (file storage, R1).
func Store(t testing.TB, nc *nats.Conn) *store.Store {
	t.Helper()
	return StoreWith(t, nc, store.DefaultConfig())
}

// StoreWith provisions Brood's streams and buckets with cfg.
func StoreWith(t testing.TB, nc *nats.Conn, cfg store.Config) *store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := store.Provision(ctx, nc, protocol.MustSubjects(""), cfg)
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	return st
}

// Runner is a component with the Run(ctx) lifecycle.
type Runner interface {
	Run(ctx context.Context) error
}

// Background runs r until the end of the test (or until the returned stop is
// called), then checks it drained cleanly (Run returned nil).
func Background(t testing.TB, r Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("component stopped with error: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("component did not drain within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Subscribe subscribes nc to subject and returns the channel its messages
// arrive on (64 buffered; a channel subscription: once Subscribe returned,
// having flushed, everything the server delivers is in the channel). The
// subscription ends with the test.
func Subscribe(t testing.TB, nc *nats.Conn, subject string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// Eventually polls cond every step until it holds or total passed.
func Eventually(t testing.TB, total time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(total)
	step := 10 * time.Millisecond
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %s", total, fmt.Sprintf(format, args...))
		}
		time.Sleep(step)
		if step < 200*time.Millisecond {
			step *= 2
		}
	}
}

// Consistently checks that cond holds, polling every 50 ms, for the whole of
// d (an absence: nothing happens that must not). It fails at the first poll
// where cond does not hold. d must cover several periods of whatever would
// break the condition (a sweep, a heartbeat), so a fault is caught nearly
// always, not only when a single period happens to fall inside it.
func Consistently(t testing.TB, d time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !cond() {
			t.Fatalf("condition broken within %s: %s", d, fmt.Sprintf(format, args...))
		}
	}
}

// Logger is a slog logger writing to the test log (at warn unless
// BROOD_TEST_LOG=debug|info).
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	switch strings.ToLower(os.Getenv("BROOD_TEST_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended must not panic
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// PutRun writes rec as a run's record in any state, its spec and its state
// (store.RunSpecKey, store.RunStateKey of its provider), as the tests that
// set up a run a host or coordinator left behind need; it returns the
// state's revision. Services create runs with store.CreateRun.
func PutRun(t testing.TB, st *store.Store, rec protocol.RunRecord) uint64 {
	t.Helper()
	ctx := context.Background()
	rev, err := st.CreateRunRecords(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// ScopeOf is the scope session id's header names (its provider, or
// protocol.ScopeRoot); a session without a header ends the test.
func ScopeOf(t testing.TB, st *store.Store, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := st.GetHeader(ctx, id)
	if err != nil {
		t.Fatalf("read the header of %s: %v", id, err)
	}
	return h.Scope()
}

// InboxOf is the inbox of session id, in the scope its header names (a
// session without a header ends the test).
func InboxOf(t testing.TB, st *store.Store, id string) *store.SessionInbox {
	t.Helper()
	return st.InboxOf(ScopeOf(t, st, id), id)
}

// PendingSeqs returns the stream sequences of the items pending in session
// id's inbox, oldest first (store.SessionInbox.Pending from the start); a
// read that fails ends the test.
func PendingSeqs(ctx context.Context, t testing.TB, st *store.Store, id string) []protocol.Seq {
	t.Helper()
	items, err := InboxOf(t, st, id).Pending(ctx, 0)
	if err != nil {
		t.Fatalf("read the inbox of %s: %v", id, err)
	}
	var seqs []protocol.Seq
	for _, it := range items {
		seqs = append(seqs, it.Seq)
	}
	return seqs
}
