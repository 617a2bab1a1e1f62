package worker

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
)

// ModelFactory returns the model a new agent uses.
type ModelFactory func() (model.Model, error)

// ModelChooser returns one of the models a provider's descriptor offers, for
// a session whose header names it (a start's `model` option,
// docs/protocol.md §5.5).
type ModelChooser func(protocol.ModelInfo) (model.Model, error)

// ToolsFactory returns the global tools of one new agent (the tools named in
// the provider descriptor, in order).
type ToolsFactory func(spec SessionSpec) ([]*agent.Tool, error)

// InProcess is the provider driver shared by `spawn` and `fork`: the child
// is a Brood agent running in this host (docs/upstream-behaviour.md §2, in-process
// one-shot driver).
type InProcess struct {
	Desc   protocol.ProviderDescriptor
	Models ModelFactory
	// ModelFor serves a session whose header chose a model other than the
	// default (Desc.Models[0], served by Models); nil serves the default
	// only, so Desc should then offer one model.
	ModelFor ModelChooser
	Tools    ToolsFactory
	Persona  string
	Limits   agent.Limits
	Logger   *slog.Logger
	// Seeded providers (fork) seed each child with the parent's balanced
	// completed-turn prefix, read from Store.
	Seeded bool
	Store  *store.Store
	// SeedEventsMax bounds a seed (default 100,000 events); a longer parent
	// is refused with LIMIT_EXCEEDED rather than cut.
	SeedEventsMax int
	// Local returns child-only tools added after filtering (report).
	Local func(spec SessionSpec) []*agent.Tool
	// Metrics, when set, counts the agents' model and tool calls.
	Metrics *telemetry.Metrics
	// Requests, when set, parks a call to a tool that needs approval on a
	// request until it is answered (agent.Config.Requests); unset, such a
	// call is an error result.
	Requests agent.Requester
	// Budget, when set, reserves a budgeted child's model requests and tool
	// calls on its budgets (agent.Config.Budget); unset (tests that host
	// agents without a coordinator), nothing is reserved.
	Budget agent.Budgeter
}

// DefaultSeedEventsMax is the default bound of a fork seed.
const DefaultSeedEventsMax = 100_000

// Prepare returns the child's creation spec: for a seeded provider the
// length of the parent's balanced completed-turn prefix (docs/upstream-behaviour.md
// §3.6), which the coordinator read and checked (req.ParentCompleted: a
// worker reads no other session's log), within SeedEventsMax; 0 otherwise.
func (p *InProcess) Prepare(ctx context.Context, req protocol.ProviderPrepareRequest) (protocol.ProviderPrepareReply, error) {
	if !p.Seeded {
		return protocol.ProviderPrepareReply{}, nil
	}
	if req.ParentCompleted < 0 {
		return protocol.ProviderPrepareReply{}, protocol.Errorf(protocol.CodeInvalidArgument, "parentCompleted must not be negative")
	}
	if err := p.seedWithin(req.ParentCompleted); err != nil {
		return protocol.ProviderPrepareReply{}, err
	}
	return protocol.ProviderPrepareReply{SeedLength: req.ParentCompleted}, nil
}

// seedWithin refuses a seed of n events past SeedEventsMax with
// LIMIT_EXCEEDED rather than cut it.
func (p *InProcess) seedWithin(n int64) error {
	limit := p.SeedEventsMax
	if limit <= 0 {
		limit = DefaultSeedEventsMax
	}
	if n > int64(limit) {
		return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
			"limit": "fork seed events", "reason": fmt.Sprintf("the parent's completed history has %d events; the limit is %d", n, limit)})
	}
	return nil
}

// readSeed reads the seed of fork child h (the first h.SeedLength events
// of its parent's log) through the coordinators, page by page
// (protocol.Subjects.Read, ReadForkSeed: a worker reads no header and no
// log of another provider's session), checked to replay cleanly. A page
// answered UNAVAILABLE (an election of the log's stream outlasting the
// coordinator's budget) is asked again within ctx (worker.RunWriteBudget).
func (p *InProcess) readSeed(ctx context.Context, h protocol.SessionHeader) ([]protocol.SessionEvent, error) {
	if err := p.seedWithin(h.SeedLength); err != nil {
		return nil, err
	}
	seed := make([]protocol.SessionEvent, 0, h.SeedLength)
	req := protocol.ForkSeedRequest{Parent: h.ParentSession, EventsMax: protocol.LogPageEventsMax}
	subject := p.Store.Subj.Read(h.Provider, protocol.ReadForkSeed, h.ID)
	for int64(len(seed)) < h.SeedLength {
		var page protocol.LogPage
		if err := callWhileUnavailable(ctx, p.Store.NC, subject, req, &page); err != nil {
			if protocol.CodeOf(err) != "" {
				return nil, err
			}
			return nil, protocol.Errorf(protocol.CodeUnavailable, "read the fork seed: %w", err)
		}
		seed = append(seed, page.Events...)
		if page.Complete || len(page.Events) == 0 {
			break
		}
		req.FromSeq, req.Cursor = page.NextSeq, page.Cursor
	}
	if int64(len(seed)) != h.SeedLength {
		return nil, protocol.Errorf(protocol.CodeInternal, "the fork seed has %d events, not the header's %d", len(seed), h.SeedLength)
	}
	if err := sessionlog.ValidateReplay(seed, false); err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "the parent's history does not replay: %w", err)
	}
	return seed, nil
}

// writeSeed copies the seed into the child's log (records under the size
// limit) and closes it with session/end-seed.
func (p *InProcess) writeSeed(ctx context.Context, spec SessionSpec) ([]protocol.SessionEvent, error) {
	seed, err := p.readSeed(ctx, spec.Header)
	if err != nil {
		return nil, err
	}
	end, err := protocol.NewEvent(protocol.EvSessionEndSeed, time.Now().UnixMilli(), struct{}{})
	if err != nil {
		return nil, err
	}
	written, err := store.AppendChunked(ctx, spec.Log, append(append([]protocol.SessionEvent(nil), seed...), end))
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeDurabilityFailed, "write the seed: %w", err)
	}
	return written, nil
}

// Descriptor implements Provider.
func (p *InProcess) Descriptor() protocol.ProviderDescriptor { return p.Desc }

// NewSession composes the child agent: global tools restricted by the tool
// filter, the persona (the child's own shadows the deployment's), the model.
func (p *InProcess) NewSession(ctx context.Context, spec SessionSpec) (Session, error) {
	tools, err := p.Tools(spec)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "compose tools: %w", err)
	}
	reg, err := agent.NewRegistry(tools...)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "compose tools: %w", err)
	}
	if f := spec.Options.ToolFilter; f != nil {
		if reg, err = reg.Restrict(*f); err != nil {
			return nil, err
		}
	}
	// The ceiling every ancestor narrowed (docs/design.md §7): a descendant never
	// gets a tool an ancestor was denied, whatever its own filter says.
	reg = reg.Ceiling(spec.Header.ToolCeiling).ForSession(spec.Header)
	var sections []string
	if p.Local != nil {
		if local := p.Local(spec); len(local) > 0 {
			reg = reg.WithLocal(local...)
		}
	}
	if spec.Options.OutputSchema != "" {
		so, err := agent.StructuredOutputTool(spec.Options.OutputSchema)
		if err != nil {
			return nil, err
		}
		reg = reg.WithLocal(so)
		sections = append(sections, agent.StructuredOutputInstruction)
	}
	m, err := p.model(spec.Header)
	if err != nil {
		return nil, err
	}
	persona := p.Persona
	if persona == "" {
		persona = agent.DefaultPersona
	}
	if spec.Options.Persona != nil {
		persona = *spec.Options.Persona
	}
	vars := map[string]string{"provider": m.Provider(), "model": m.Name(), "cwd": spec.Header.Cwd}
	system, err := agent.SystemPrompt(persona, vars, spec.Header, sections...)
	if err != nil {
		return nil, err
	}
	logger := p.Logger
	if logger == nil {
		logger = slog.Default()
	}
	events := spec.Events
	if p.Seeded && spec.Header.SeedLength > 0 && len(events) == 0 {
		if events, err = p.writeSeed(ctx, spec); err != nil {
			return nil, err
		}
	}
	return agent.New(agent.Config{
		Header: spec.Header, Log: spec.Log, Events: events, Model: m, Tools: reg,
		System: system, Credential: spec.Credential, Limits: p.Limits.Within(spec.Header.Limits), Logger: logger,
		Inbox: spec.Inbox, InboxDirty: spec.InboxDirty, Metrics: p.Metrics, Requests: p.Requests, Budget: p.Budget,
		Continuable: spec.Continuable,
	})
}

// model returns a session's model: the one its header chose (the
// coordinator checked it against the descriptor; checked again here, since
// a worker serves only what it offers), else the default.
func (p *InProcess) model(h protocol.SessionHeader) (model.Model, error) {
	factory := p.Models
	if h.Model != nil && (len(p.Desc.Models) == 0 || *h.Model != p.Desc.Models[0]) {
		if !p.Desc.Offers(*h.Model) || p.ModelFor == nil {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "provider %s does not serve model %s here", p.Desc.Name, h.Model)
		}
		chosen := *h.Model
		factory = func() (model.Model, error) { return p.ModelFor(chosen) }
	}
	m, err := factory()
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "model: %w", err)
	}
	return m, nil
}
