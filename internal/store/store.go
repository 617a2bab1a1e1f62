// Package store is Brood's durable state in JetStream (docs/design.md §4): the
// streams BROOD_SESSIONS (immutable headers), BROOD_LOG_<scope> (session
// event records, one fenced writer per session), BROOD_INBOX_<scope>
// (pending inbox items), one of each per provider and one for roots
// (scope "root"; streams.go), BROOD_EVENTS (lifecycle events) and the KV
// buckets brood_agents (leases), brood_hosts (live hosts) and brood_runs
// (run records).
//
// Write order and writers: order.go, the lock-order file of this package.
// Every write to a KV bucket goes through an operation of this package
// (runs.go, leases.go, ownership.go, markers.go, heartbeat.go) whose key
// comes from keys.go, and so does every read and watch (buckets.go): no
// package outside this one holds a bucket handle.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider/contract"
)

// Config holds every stream and bucket setting; none is left to the server
// default (docs/design.md §4). DefaultConfig gives the documented defaults.
type Config struct {
	// Replicas of every stream and bucket: 1 in `brood dev`, 3 in a cluster.
	// Open checks it only when above 0 (a service that was not told the
	// replica count runs on what the admin provisioned).
	Replicas int
	// Storage is file storage unless a test asks for memory.
	Storage jetstream.StorageType
	// MsgBytesMax is the largest message a stream accepts (1 MiB).
	MsgBytesMax int32
	// InboxItemsMax is the most pending inbox items one session may have (1,000).
	InboxItemsMax int64
	// DuplicateWindow is the Nats-Msg-Id dedupe window (2 minutes).
	DuplicateWindow time.Duration
	// RunsMaxAge keeps a settled run's records (its spec and state) this
	// long after its settlement (24 hours), as a per-message TTL rounded
	// up to whole seconds (Store.RunsTTL); a running run's records never
	// expire (brood_runs has no max age).
	RunsMaxAge time.Duration
	// EventsMaxAge keeps lifecycle events this long (24 hours).
	EventsMaxAge time.Duration
	// HostsMaxAge garbage-collects records of hosts that stopped writing (10 minutes).
	// Liveness is judged from heartbeats, never from this expiry.
	HostsMaxAge time.Duration
	// Providers names the providers whose log and inbox streams
	// (BROOD_LOG_<p>, BROOD_INBOX_<p>) Provision creates and Open checks,
	// besides the roots' (BROOD_LOG_root, BROOD_INBOX_root), which are
	// always there: DefaultProviders by default (`brood provision
	// --providers`). A service Opens with the providers it serves (a
	// worker its own, a coordinator none) and refuses to run while their
	// streams are missing. Each must be a ValidID other than "root".
	Providers []string
	// SkipRoots makes Open neither check nor bind the roots' log and inbox
	// streams: a worker's, which reads and writes no root's log or inbox,
	// and whose NATS user may not see them (docs/security.md). Provision
	// makes them all the same.
	SkipRoots bool
	// JSDomain is the JetStream domain of the hub's JetStream when the
	// service connects through a leaf node whose server runs JetStream of
	// its own (a site's; `--js-domain`, deploy/README.md "Sites"): every
	// API request goes to $JS.<JSDomain>.API.> and every KV write to
	// $JS.<JSDomain>.API.$KV.> (domain.go). Empty (the default): the
	// account's own JetStream, $JS.API.> and $KV.>.
	JSDomain string
}

// DefaultProviders are the providers `brood provision` provisions unless
// told others (--providers): the seed's and `brood dev`'s, spawn, fork and
// acp (one ACP bridge agent named acp).
var DefaultProviders = []string{"spawn", "fork", "acp"}

// DefaultConfig returns the documented defaults (docs/design.md §4).
func DefaultConfig() Config {
	return Config{
		Replicas:        1,
		Storage:         jetstream.FileStorage,
		MsgBytesMax:     1 << 20,
		InboxItemsMax:   1000,
		DuplicateWindow: 2 * time.Minute,
		RunsMaxAge:      24 * time.Hour,
		EventsMaxAge:    24 * time.Hour,
		HostsMaxAge:     10 * time.Minute,
		Providers:       slices.Clone(DefaultProviders),
	}
}

// Store is a handle on the provisioned streams and buckets.
type Store struct {
	NC   *nats.Conn
	JS   jetstream.JetStream
	Subj protocol.Subjects
	Cfg  Config

	Sessions jetstream.Stream
	Events   jetstream.Stream
	// streams caches the log and inbox streams of each scope by name
	// (LogStream, InboxStream: streams.go), bound on first use.
	streams *sync.Map
	// faults wraps those streams (WithFaults), nil in a product path.
	faults *Faults

	// Agents, Hosts and Runs are the buckets brood_agents, brood_hosts and
	// brood_runs. They are exported for tests only (set-ups and checks of
	// raw records in ~35 test files): no non-test file outside this
	// package (and its sub-packages) reads them or names
	// jetstream.KeyValue, which TestNoBucketHandleOutsideTheStore checks
	// (and integration's TestNoBucketHandleOutsideTheStoreTyped, on the
	// packages' types; issue 31, item 3); a product path calls this
	// package's operations (buckets.go, runs.go, leases.go, ...).
	Agents jetstream.KeyValue
	Hosts  jetstream.KeyValue
	Runs   jetstream.KeyValue

	// roots caches what a session's header says about its lease (its scope
	// and parent: sessionFacts) by session id (rootsCached entries).
	roots       *sync.Map
	rootsCached *atomic.Int64
	// specs caches RunSpec by run id (specsCached entries).
	specs       *sync.Map
	specsCached *atomic.Int64
	// lagging is Faults.Lagging (WithFaults), nil in a product path.
	lagging func(seq uint64) bool
	// api is the JetStream API prefix (APIPrefix(Cfg.JSDomain)), and
	// kvWritePrefix what goes before a KV write's subject: empty without a
	// domain, the API prefix with one (kvWriteSubject).
	api, kvWritePrefix string
	// leaderRead is Faults.LeaderRead (WithFaults), nil in a product path:
	// reads from a bucket's leader that pass no bucket (getMatching).
	leaderRead func(ctx context.Context, bucket, key string) error
}

// Errors of the store.
var (
	// ErrNotFound: no such header, record or log.
	ErrNotFound = errors.New("store: not found")
	// ErrConflict: a compare-and-set lost (someone else wrote first).
	ErrConflict = errors.New("store: conflict")
	// ErrFenced: a fenced log append was refused because another writer
	// appended; the caller no longer owns the session log. It is the
	// provider SDK's (pkg/provider/contract), which an Appender's error wraps.
	ErrFenced = contract.ErrFenced
)

// ErrMaxPayload is returned when the NATS server's max_payload is below what
// Brood's records need.
var ErrMaxPayload = errors.New("store: the NATS server's max_payload is too small")

// CheckMaxPayload refuses a connection whose server accepts messages smaller
// than need bytes (the streams' max message size, Config.MsgBytesMax): a
// log record, header or inbox item may be that large, and a server with a
// smaller max_payload would accept the service and then fail its first large
// write (issue 14). The error names both sizes and the setting to change.
func CheckMaxPayload(nc *nats.Conn, need int32) error {
	if got := nc.MaxPayload(); got < int64(need) {
		return fmt.Errorf("%w: it is %d bytes, and Brood's records need %d (the streams' max message size): set max_payload to at least %d (for example max_payload: 1MB) in the nats-server configuration",
			ErrMaxPayload, got, need, need)
	}
	return nil
}

// Bind returns a store on streams and buckets that already exist, without
// checking their configuration (readers such as the chaos observer and
// `brood acp-agent`; services Open). Like Open it refuses a server whose
// max_payload is below the default max message size (ErrMaxPayload).
func Bind(ctx context.Context, nc *nats.Conn, subj protocol.Subjects) (*Store, error) {
	if err := CheckMaxPayload(nc, DefaultConfig().MsgBytesMax); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// The roots' log and inbox streams only: a provider's are bound when
	// first used (LogStream, InboxStream), so a deployment of other
	// providers than DefaultProviders binds as well.
	cfg := DefaultConfig()
	cfg.Providers = nil
	s, err := bind(ctx, js, nc, subj, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (has `brood provision` run against this server?)", err)
	}
	return s, nil
}

// BindLogs returns a store on the session headers and the roots' logs only
// (Sessions and LogStream(protocol.ScopeRoot); the other fields stay nil):
// what a host of roots reads and writes (`brood acp-agent`, a trusted host
// whose NATS user may read no other stream or bucket; docs/security.md).
// It refuses a server whose max_payload is below the default max message
// size (ErrMaxPayload).
func BindLogs(ctx context.Context, nc *nats.Conn, subj protocol.Subjects) (*Store, error) {
	if err := CheckMaxPayload(nc, DefaultConfig().MsgBytesMax); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := newStore(nc, js, subj, DefaultConfig())
	if s.Sessions, err = js.Stream(ctx, subj.StreamSessions()); err != nil {
		return nil, fmt.Errorf("stream %s: %w (has `brood provision` run against this server?)", subj.StreamSessions(), err)
	}
	if _, err = s.LogStream(ctx, protocol.ScopeRoot); err != nil {
		return nil, err
	}
	return s, nil
}

// isWrongLastSeq reports a JetStream expected-last-sequence refusal, which
// replicated streams answer with 10164 and single-replica ones with 10071
// (docs/design.md §12).
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// NowMs is the current time in epoch milliseconds (UTC).
func NowMs() int64 { return time.Now().UnixMilli() }
