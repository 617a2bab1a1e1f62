package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Provisioning is an admin step (docs/security.md): `brood provision
// --replicas N` creates or updates every stream and bucket (Provision) as a
// NATS user allowed to; each service then checks the configuration when it
// starts (Open) and refuses a wrong one instead of rewriting it. So two
// services with different settings can no longer rewrite each other, the
// services' users need no right to create, update or delete a stream, and
// nothing races on a fresh cluster (concurrent creates of one R3 stream by
// several processes could hang until their deadline).

// Errors of Open.
var (
	// ErrNotProvisioned: a stream or bucket does not exist yet; run
	// `brood provision` (services wait for it and check again).
	ErrNotProvisioned = errors.New("store: Brood's streams and buckets are not provisioned")
	// ErrMisconfigured: a stream or bucket exists with settings Brood does
	// not run on (the error lists each difference).
	ErrMisconfigured = errors.New("store: a stream or bucket is not configured as Brood needs it")
)

// kvStreamPrefix names the stream behind a KV bucket (nats.go jetstream).
const kvStreamPrefix = "KV_"

// streamConfigs returns the configuration of every stream and bucket (a KV
// bucket is a stream named KV_<bucket> on subjects $KV.<bucket>.>), each
// setting explicit (docs/design.md §4). Hardening that the services rely on
// (docs/security.md, "JetStream"):
//   - no stream allows roll-ups (a message with Nats-Rollup: all would purge
//     a whole stream, or a whole bucket, for anyone who may publish one
//     message to it), nor message schedules, counters or atomic batches;
//   - only BROOD_SESSIONS and the log streams can be purged, for the
//     collector to remove the headers, child indexes and logs of trees
//     whose retention passed (gc.go; a deployment lets only the collector
//     user purge them, by subject), and only the inbox streams allow
//     message deletes (a claimed item is deleted);
//   - logs and inboxes have a stream per scope: one per provider of
//     cfg.Providers and the roots' (scopeStreams);
//   - KV buckets allow per-message TTLs (AllowMsgTTL) for keys that expire
//     on their own (grants, settled runs), without delete markers, which
//     would need roll-ups.
func (cfg Config) streamConfigs(subj protocol.Subjects) []jetstream.StreamConfig {
	streams := []jetstream.StreamConfig{
		{
			Name:                 subj.StreamSessions(),
			Description:          "Brood session headers (immutable, one per session id, ever) and each parent's child index",
			Subjects:             []string{subj.Session("*"), subj.ChildrenOf("*")},
			MaxMsgsPerSubject:    1,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
			DenyDelete:           true,
		},
		{
			Name:              subj.StreamEvents(),
			Description:       "Brood lifecycle events subagent/start and subagent/end by parent",
			Subjects:          []string{subj.Events("*", "*", "*")},
			MaxAge:            cfg.EventsMaxAge,
			MaxMsgsPerSubject: -1,
			Discard:           jetstream.DiscardOld,
			DenyDelete:        true,
		},
	}
	purgeable := map[string]bool{subj.StreamSessions(): true}
	for _, scope := range cfg.scopes() {
		log, inbox := cfg.scopeStreams(subj, scope)
		streams = append(streams, log, inbox)
		purgeable[log.Name] = true
	}
	for i := range streams {
		c := &streams[i]
		c.Retention = jetstream.LimitsPolicy
		c.Duplicates = cfg.DuplicateWindow
		// MaxAge stays 0 (no age limit) except for BROOD_EVENTS: an accepted
		// item or logged event is never expired away.
	}
	buckets := []struct {
		name, description string
		ttl               time.Duration
	}{
		{subj.BucketAgents(), "Brood agent leases by session id", 0},
		{subj.BucketHosts(), "Brood live hosts and their heartbeats", cfg.HostsMaxAge},
		// No max age: a run's records never expire while it runs; a
		// settled run's are given a per-message TTL of Config.RunsMaxAge
		// (runs.go: SettleRun, ExpireRunSpec).
		{subj.BucketRuns(), "Brood run records by run id", 0},
	}
	for _, b := range buckets {
		dup := cfg.DuplicateWindow
		if b.ttl > 0 && b.ttl < dup {
			dup = b.ttl // the server refuses a duplicate window above MaxAge
		}
		streams = append(streams, jetstream.StreamConfig{
			Name:              kvStreamPrefix + b.name,
			Description:       b.description,
			Subjects:          []string{"$KV." + b.name + ".>"},
			Retention:         jetstream.LimitsPolicy,
			MaxMsgsPerSubject: 1, // history 1: a key's current value only
			MaxAge:            b.ttl,
			Discard:           jetstream.DiscardNew,
			Duplicates:        dup,
			DenyDelete:        true,
			AllowMsgTTL:       true,
		})
	}
	for i := range streams {
		c := &streams[i]
		c.Storage = cfg.Storage
		c.Replicas = cfg.Replicas
		c.MaxMsgSize = cfg.MsgBytesMax
		c.MaxMsgs = -1
		c.MaxBytes = -1
		c.MaxConsumers = -1
		c.AllowDirect = true
		c.DenyPurge = !purgeable[c.Name]
		c.AllowRollup = false
	}
	return streams
}

// diffStream lists how got differs from want in the settings Brood relies
// on, as "setting got, want wanted"; replicas are compared only when
// checkReplicas is set.
func diffStream(want, got jetstream.StreamConfig, checkReplicas bool) []string {
	var out []string
	field := func(name string, g, w any) {
		if fmt.Sprint(g) != fmt.Sprint(w) {
			out = append(out, fmt.Sprintf("%s %v, want %v", name, g, w))
		}
	}
	gs, ws := slices.Clone(got.Subjects), slices.Clone(want.Subjects)
	slices.Sort(gs)
	slices.Sort(ws)
	field("subjects", gs, ws)
	field("retention", got.Retention, want.Retention)
	field("storage", got.Storage, want.Storage)
	if checkReplicas {
		field("replicas", got.Replicas, want.Replicas)
	}
	field("max_msgs", got.MaxMsgs, want.MaxMsgs)
	field("max_bytes", got.MaxBytes, want.MaxBytes)
	field("max_age", got.MaxAge, want.MaxAge)
	field("max_msgs_per_subject", got.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	field("max_msg_size", got.MaxMsgSize, want.MaxMsgSize)
	field("max_consumers", got.MaxConsumers, want.MaxConsumers)
	field("discard", got.Discard, want.Discard)
	field("discard_new_per_subject", got.DiscardNewPerSubject, want.DiscardNewPerSubject)
	field("duplicate_window", got.Duplicates, want.Duplicates)
	field("deny_delete", got.DenyDelete, want.DenyDelete)
	field("deny_purge", got.DenyPurge, want.DenyPurge)
	field("allow_rollup_hdrs", got.AllowRollup, want.AllowRollup)
	field("allow_direct", got.AllowDirect, want.AllowDirect)
	field("allow_msg_ttl", got.AllowMsgTTL, want.AllowMsgTTL)
	field("subject_delete_marker_ttl", got.SubjectDeleteMarkerTTL, want.SubjectDeleteMarkerTTL)
	field("allow_msg_schedules", got.AllowMsgSchedules, want.AllowMsgSchedules)
	field("allow_msg_counter", got.AllowMsgCounter, want.AllowMsgCounter)
	field("allow_atomic", got.AllowAtomicPublish, want.AllowAtomicPublish)
	field("sealed", got.Sealed, want.Sealed)
	field("no_ack", got.NoAck, want.NoAck)
	field("mirror", got.Mirror != nil, want.Mirror != nil)
	field("sources", len(got.Sources), len(want.Sources))
	field("republish", got.RePublish != nil, want.RePublish != nil)
	field("subject_transform", got.SubjectTransform != nil, want.SubjectTransform != nil)
	return out
}

// Provision creates or updates every stream and bucket with Brood's settings
// (streamConfigs) and returns the store: the admin step, `brood provision`,
// run by one process with a NATS user allowed to create and update streams
// (docs/security.md). It is idempotent: run it again to change the replicas
// or after an upgrade. Services do not provision; they Open. It refuses a
// server whose max_payload is below cfg.MsgBytesMax (ErrMaxPayload).
func Provision(ctx context.Context, nc *nats.Conn, subj protocol.Subjects, cfg Config) (*Store, error) {
	if err := CheckMaxPayload(nc, cfg.MsgBytesMax); err != nil {
		return nil, err
	}
	if cfg.Replicas <= 0 {
		return nil, fmt.Errorf("store: provision with at least 1 replica, not %d", cfg.Replicas)
	}
	cfg.SkipRoots = false // the roots' streams are always provisioned
	if err := CheckProviders(cfg.Providers); err != nil {
		return nil, err
	}
	js, err := newJetStream(nc, cfg.JSDomain)
	if err != nil {
		return nil, err
	}
	// Transient failures (a cluster still electing leaders) are retried
	// within ctx's deadline (retry.go), and so is a placement that finds
	// too few peers (placementNotReady): on a cluster that just started, the
	// meta leader can know every peer yet count one as offline for a moment.
	for _, c := range cfg.streamConfigs(subj) {
		if err := Retry(ctx, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateStream(ctx, c)
			if placementNotReady(err) {
				return fmt.Errorf("%w: %w", errPlacementNotReady, err)
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("provision stream %s: %w", c.Name, err)
		}
	}
	return bind(ctx, js, nc, subj, cfg)
}

// Open binds the streams and buckets a service runs on and checks that each
// is configured as Brood needs it (streamConfigs, the replicas only when
// cfg.Replicas is above 0; the log and inbox streams of the roots, unless
// cfg.SkipRoots, and of cfg.Providers, the providers the service serves);
// it never creates or changes one. A missing stream or bucket is
// ErrNotProvisioned, naming it and the `brood provision` to run (then start
// the service again or let it retry); a different configuration is
// ErrMisconfigured, listing every difference. It refuses a server whose
// max_payload is below cfg.MsgBytesMax (ErrMaxPayload).
func Open(ctx context.Context, nc *nats.Conn, subj protocol.Subjects, cfg Config) (*Store, error) {
	if err := CheckMaxPayload(nc, cfg.MsgBytesMax); err != nil {
		return nil, err
	}
	if err := CheckProviders(cfg.Providers); err != nil {
		return nil, err
	}
	js, err := newJetStream(nc, cfg.JSDomain)
	if err != nil {
		return nil, err
	}
	var missing, wrong []string
	for _, want := range cfg.streamConfigs(subj) {
		str, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			missing = append(missing, want.Name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", want.Name, err)
		}
		if d := diffStream(want, str.CachedInfo().Config, cfg.Replicas > 0); len(d) > 0 {
			wrong = append(wrong, want.Name+": "+strings.Join(d, ", "))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s not found; run `brood provision --replicas N --providers P,...` as the admin user, naming every provider of the deployment%s (docs/security.md)",
			ErrNotProvisioned, strings.Join(missing, ", "), providersNote(cfg.Providers))
	}
	if len(wrong) > 0 {
		return nil, fmt.Errorf("%w: %s; run `brood provision` with the settings of this deployment as the admin user, or start the service with the settings the streams have",
			ErrMisconfigured, strings.Join(wrong, "; "))
	}
	return bind(ctx, js, nc, subj, cfg)
}

// providersNote names the providers a service needs, for its errors.
func providersNote(providers []string) string {
	if len(providers) == 0 {
		return ""
	}
	return " (this service's: " + strings.Join(providers, ",") + ")"
}

// bind returns a store on streams and buckets that exist.
func bind(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, subj protocol.Subjects, cfg Config) (*Store, error) {
	s := newStore(nc, js, subj, cfg)
	for _, p := range []struct {
		dst  *jetstream.Stream
		name string
	}{{&s.Sessions, subj.StreamSessions()}, {&s.Events, subj.StreamEvents()}} {
		str, err := js.Stream(ctx, p.name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", p.name, err)
		}
		*p.dst = str
	}
	for _, scope := range cfg.scopes() {
		if _, err := s.LogStream(ctx, scope); err != nil {
			return nil, err
		}
		if _, err := s.InboxStream(ctx, scope); err != nil {
			return nil, err
		}
	}
	for _, p := range []struct {
		dst  *jetstream.KeyValue
		name string
	}{{&s.Agents, subj.BucketAgents()}, {&s.Hosts, subj.BucketHosts()}, {&s.Runs, subj.BucketRuns()}} {
		kv, err := js.KeyValue(ctx, p.name)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", p.name, err)
		}
		*p.dst = &bucket{KeyValue: kv, s: s} // landed-write checks read from the leader
	}
	return s, nil
}

// placementNotReady reports the meta leader's "no suitable peers for
// placement" (JSClusterNoPeersErr, 10005). Right after a cluster starts, or
// a node restarts, a peer is known but not yet current and counts as
// offline; the same answer also means a cluster smaller than the replicas,
// which no retry outlives: Provision's deadline then ends it with this
// error.
func placementNotReady(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10005
}
