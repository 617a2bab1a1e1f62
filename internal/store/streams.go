package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Logs and inboxes by scope (docs/security.md, "What comes next", item 1).
// Each scope, a provider's name or protocol.ScopeRoot, has its own log
// stream BROOD_LOG_<scope> on <p>.v1.log.<scope>.* and inbox stream
// BROOD_INBOX_<scope> on <p>.v1.inbox.<scope>.*: a batch direct get or a
// leader get names its stream in the API subject, so a NATS permission
// gives a provider's workers the reads of their own scope's logs and
// inboxes and no other. Every read and write of a log or an inbox goes
// through LogStream or InboxStream (or the subject and stream names of
// protocol.Subjects for the same scope), with the scope taken from the
// session's header (protocol.SessionHeader.Scope) or known (a worker's
// own provider).

// ProvidersMax bounds how many providers one provisioning names (each has
// two streams).
const ProvidersMax = 64

// CheckProviders refuses a provider list with a name that is not a
// protocol.ValidID, the roots' scope (protocol.ScopeRoot), a duplicate, or
// more than ProvidersMax names; the error is INVALID_ARGUMENT.
func CheckProviders(providers []string) error {
	if len(providers) > ProvidersMax {
		return protocol.Errorf(protocol.CodeInvalidArgument, "%d providers: at most %d", len(providers), ProvidersMax)
	}
	seen := map[string]bool{}
	for _, p := range providers {
		switch {
		case !protocol.ValidID(p):
			return protocol.Errorf(protocol.CodeInvalidArgument, "provider %q must match ^[A-Za-z0-9_-]{1,64}$", p)
		case p == protocol.ScopeRoot:
			return protocol.Errorf(protocol.CodeInvalidArgument, "provider %q: %q is the roots' scope, which no provider may take", p, protocol.ScopeRoot)
		case seen[p]:
			return protocol.Errorf(protocol.CodeInvalidArgument, "provider %q is named twice", p)
		}
		seen[p] = true
	}
	return nil
}

// scopes are the scopes whose log and inbox streams cfg provisions and
// checks: the roots' (unless cfg.SkipRoots) and each of cfg.Providers.
func (cfg Config) scopes() []string {
	if cfg.SkipRoots {
		return slices.Clone(cfg.Providers)
	}
	return append([]string{protocol.ScopeRoot}, cfg.Providers...)
}

// scopeStreams returns the configuration of scope's log and inbox streams
// (before the settings every stream shares: streamConfigs).
func (cfg Config) scopeStreams(subj protocol.Subjects, scope string) (log, inbox jetstream.StreamConfig) {
	return jetstream.StreamConfig{
			Name:              subj.StreamLog(scope),
			Description:       "Brood session logs of scope " + scope + ": records of SessionEvents, one fenced writer per session",
			Subjects:          []string{subj.LogsOf(scope)},
			MaxMsgsPerSubject: -1,
			Discard:           jetstream.DiscardNew,
			DenyDelete:        true,
		}, jetstream.StreamConfig{
			Name:                 subj.StreamInbox(scope),
			Description:          "Brood inboxes of scope " + scope + ": exactly the pending items of each session",
			Subjects:             []string{subj.InboxesOf(scope)},
			MaxMsgsPerSubject:    cfg.InboxItemsMax,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
		}
}

func newStore(nc *nats.Conn, js jetstream.JetStream, subj protocol.Subjects, cfg Config) *Store {
	s := &Store{NC: nc, JS: js, Subj: subj, Cfg: cfg, streams: &sync.Map{},
		roots: &sync.Map{}, rootsCached: &atomic.Int64{}, specs: &sync.Map{}, specsCached: &atomic.Int64{},
		api: APIPrefix(cfg.JSDomain)}
	if cfg.JSDomain != "" {
		s.kvWritePrefix = s.api
	}
	return s
}

// LogStream returns the stream of scope's logs (protocol.Subjects.StreamLog),
// bound on first use and then cached. A stream that does not exist is
// ErrNotProvisioned, naming it and the command that creates it.
func (s *Store) LogStream(ctx context.Context, scope string) (jetstream.Stream, error) {
	return s.scopeStream(ctx, scope, s.Subj.StreamLog)
}

// InboxStream returns the stream of scope's inboxes
// (protocol.Subjects.StreamInbox), as LogStream.
func (s *Store) InboxStream(ctx context.Context, scope string) (jetstream.Stream, error) {
	return s.scopeStream(ctx, scope, s.Subj.StreamInbox)
}

func (s *Store) scopeStream(ctx context.Context, scope string, name func(string) string) (jetstream.Stream, error) {
	if !protocol.ValidID(scope) {
		return nil, fmt.Errorf("store: scope %q names no stream", scope)
	}
	n := name(scope)
	v, ok := s.streams.Load(n)
	if !ok {
		str, err := s.JS.Stream(ctx, n)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("%w: stream %s not found; run `brood provision --providers ...` naming provider %s as the admin user before its workers start (docs/security.md)",
				ErrNotProvisioned, n, scope)
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", n, err)
		}
		v, _ = s.streams.LoadOrStore(n, str)
	}
	str := v.(jetstream.Stream)
	if s.faults != nil {
		str = faultStream{Stream: str, f: *s.faults}
	}
	return str, nil
}

// LogStreams returns the log stream of every scope that has one (the
// streams whose subjects are log subjects and whose names are
// StreamLog(scope)): what a reader of every scope walks (the chaos
// observer). It needs the right to list streams ($JS.API.STREAM.NAMES).
func (s *Store) LogStreams(ctx context.Context) ([]jetstream.Stream, error) {
	return s.listScopeStreams(ctx, s.Subj.LogAll(), s.Subj.StreamLog(""), s.LogStream)
}

// InboxStreams returns the inbox stream of every scope that has one, as
// LogStreams: what a coordinator's sweeps over every pending inbox read.
func (s *Store) InboxStreams(ctx context.Context) ([]jetstream.Stream, error) {
	return s.listScopeStreams(ctx, s.Subj.InboxAll(), s.Subj.StreamInbox(""), s.InboxStream)
}

func (s *Store) listScopeStreams(ctx context.Context, subjects, namePrefix string, bind func(context.Context, string) (jetstream.Stream, error)) ([]jetstream.Stream, error) {
	names := s.JS.StreamNames(ctx, jetstream.WithStreamListSubject(subjects))
	var out []jetstream.Stream
	for name := range names.Name() {
		scope, ok := strings.CutPrefix(name, namePrefix)
		if !ok || !protocol.ValidID(scope) {
			continue
		}
		str, err := bind(ctx, scope)
		if err != nil {
			return nil, err
		}
		out = append(out, str)
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list the streams of %s: %w", subjects, err)
	}
	return out, nil
}

// PendingInboxes returns how many items each inbox with pending items
// holds, by inbox subject (protocol.Subjects.Inbox), over the inbox
// streams of every scope (InboxStreams; one stream info each).
func (s *Store) PendingInboxes(ctx context.Context) (map[string]uint64, error) {
	strs, err := s.InboxStreams(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, str := range strs {
		info, err := str.Info(ctx, jetstream.WithSubjectFilter(s.Subj.InboxAll()))
		if err != nil {
			return nil, err
		}
		for subject, n := range info.State.Subjects {
			if n > 0 {
				out[subject] = n
			}
		}
	}
	return out, nil
}
