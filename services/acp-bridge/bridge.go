// Package acpbridge is the ACP bridge (docs/design.md §6; docs/upstream-behaviour.md §4): a
// provider worker whose children are Agent Client Protocol agents driven over
// stdio with the ACP Go SDK (github.com/coder/acp-go-sdk). Each configured
// agent is one provider; each run spawns the agent in its own process group,
// initializes it with every client capability false, opens an ACP session in
// the parent's workspace, prompts it, and keeps a Brood session log of the
// child like any other child (docs/design.md §4), so `brood log`, the settlement
// protocol and HOST_LOST cover ACP children too.
//
// Log of one ACP turn (one record per logical step, each fenced on the last):
//
//	record 1 (host)   turn/start, user/message (the prompt), subagent/descriptor
//	paused            a continuable child at its budget's cap: request/open
//	                  {kind budget}, then request/answer once raised or
//	                  denied (budget.go), before any step
//	record 2          acp/session {sessionId, loadSession} (first turn of an ACP session), step/start
//	records 3…        tool/call, tool/result, acp/permission as the agent reports
//	                  and asks (coalesced); under permission ask, request/open
//	                  and request/answer between a permission request's
//	                  tool/call and its acp/permission
//	last record       pending tool results closed as errors, assistant/message
//	                  (every agent_message_chunk text, interrupted when cut),
//	                  step/end, turn/end {completed|max-tokens|blocked|aborted|error}
//	between turns     acp/late-update and late acp/permission: what the agent sent
//	                  after the turn was sealed (a quiet period after its answer),
//	                  against that turn
//
// A startup failure (spawn, initialize, session/new) ends the turn `error`
// right after record 1, without a step.
package acpbridge

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/providerhost"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	broodclient "github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/provider"
)

// Config configures an ACP bridge process.
type Config struct {
	NC     *nats.Conn
	Store  *store.Store
	Agents []AgentConfig
	// Options are the timing and limits shared by every agent.
	Options           Options
	HostID            string
	HeartbeatInterval time.Duration
	HostExpiry        time.Duration
	DrainGrace        time.Duration
	Logger            *slog.Logger
	// Metrics, when set, counts the host's settlements and requests and
	// the ACP agent processes (Options.Metrics defaults to it).
	Metrics *telemetry.Metrics
}

// Service is a running ACP bridge: one worker host serving one provider per
// configured agent.
type Service struct{ host *provider.Host }

// New validates the configuration and builds the bridge.
func New(cfg Config) (*Service, error) {
	if len(cfg.Agents) == 0 {
		return nil, errors.New("acp-bridge: configure at least one ACP agent (--agent or --config)")
	}
	if cfg.Options.Logger == nil {
		cfg.Options.Logger = cfg.Logger
	}
	if cfg.Options.Metrics == nil {
		cfg.Options.Metrics = cfg.Metrics
	}
	if cfg.Options.Requests == nil {
		// The agents' requests go to the coordinators on the bridge's own
		// subject, as its NATS user (docs/security.md: a worker calls the
		// coordinator for its agents on its own subject).
		cl, err := broodclient.New(cfg.NC, broodclient.Options{Prefix: cfg.Store.Subj.Prefix()})
		if err != nil {
			return nil, err
		}
		cfg.Options.Requests = cl
	}
	if cfg.Options.Budget == nil {
		// Reservations go the same way, with the child's credential.
		cl, err := broodclient.New(cfg.NC, broodclient.Options{Prefix: cfg.Store.Subj.Prefix()})
		if err != nil {
			return nil, err
		}
		cfg.Options.Budget = cl
	}
	providers, err := Providers(cfg.Agents, cfg.Options)
	if err != nil {
		return nil, err
	}
	h, err := providerhost.New(providerhost.InModule{Store: cfg.Store, Metrics: cfg.Metrics}, provider.Config{
		NC: cfg.NC, Providers: providers, HostID: cfg.HostID,
		HeartbeatInterval: cfg.HeartbeatInterval, HostExpiry: cfg.HostExpiry, DrainGrace: cfg.DrainGrace, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Service{host: h}, nil
}

// Providers builds one provider per agent (for hosts composed elsewhere, such
// as tests). Agent names must be distinct.
func Providers(agents []AgentConfig, o Options) ([]provider.Provider, error) {
	seen := map[string]bool{}
	var out []provider.Provider
	for _, a := range agents {
		p, err := NewProvider(a, o)
		if err != nil {
			return nil, err
		}
		if seen[a.Name] {
			return nil, errors.New("acp-bridge: two ACP agents are named " + a.Name)
		}
		seen[a.Name] = true
		out = append(out, p)
	}
	return out, nil
}

// HostID returns the bridge's host id.
func (s *Service) HostID() string { return s.host.ID() }

// Run serves until ctx is done, then drains (nil on a clean stop).
func (s *Service) Run(ctx context.Context) error { return s.host.Run(ctx) }
