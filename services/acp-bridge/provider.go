package acpbridge

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/brood-dev/brood/internal/acpio"
	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/requestwait"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// Options are the bounds of every wait on an ACP agent (docs/design.md §10: every
// wait on something outside the process has a bound). Zero fields take the
// defaults below.
type Options struct {
	// SilenceTimeout ends a turn `error` when the agent sent no message at
	// all for this long (60 s, docs/design.md §4).
	SilenceTimeout time.Duration
	// TurnTimeout bounds a whole turn, startup included (10 minutes).
	TurnTimeout time.Duration
	// EOFGrace and TermGrace are the teardown ladder's waits after closing
	// stdin and after SIGTERM (6 s and 3 s, docs/upstream-behaviour.md §4).
	EOFGrace  time.Duration
	TermGrace time.Duration
	// ExitGrace is how long a turn waits, after the agent exited, for the
	// messages it wrote before exiting (1 s).
	ExitGrace time.Duration
	// SealQuiet and SealWaitMax bound the wait after the agent answered a
	// session/prompt (issue 14): the turn is sealed once the agent sent
	// nothing for SealQuiet (100 ms), at most SealWaitMax (1 s) after the
	// answer; updates in that time count for the turn, later ones are logged
	// as acp/late-update of the sealed turn.
	SealQuiet   time.Duration
	SealWaitMax time.Duration
	// LineBytesMax bounds one line of the agent's stdout (8 MiB); a longer
	// line is a protocol failure that ends the turn `error`.
	LineBytesMax int
	// OutputBytesMax bounds the text of one turn's answer (512 KiB); more ends
	// the turn `error` with LIMIT_EXCEEDED, nothing is truncated.
	OutputBytesMax int
	// ToolTextBytesMax bounds what one tool call's input or output keeps in
	// the log (64 KiB); a larger one is recorded as omitted, with its size.
	ToolTextBytesMax int
	// AppendTimeout bounds each log append, its retries through transient
	// JetStream failures included (store.SettleBudget, 60 s, as an in-process
	// agent's: a failed append ends the run DURABILITY_FAILED, so it waits
	// out a leader election as long as the run's settlement would).
	AppendTimeout time.Duration
	// Environ is the bridge's environment (default os.Environ): the agent
	// gets only what its config names of it (acpio.AgentEnv), and every
	// value of it is redacted from the agent's stderr and error messages
	// before a diagnostic carries them (acpio.Redactor).
	Environ func() []string
	// Requests opens and reads the requests for approval of agents whose
	// permission policy is ask (PolicyAsk), each with its child's own
	// credential (*client.Client over the bridge's connection; New sets it
	// when nil). NewProvider refuses an ask agent without it.
	Requests requestwait.Requester
	// Budget reserves and settles each turn of a child that draws on
	// budgets (budget.reserve and budget.settle with the child's own
	// credential; *client.Client over the bridge's connection, New sets
	// it when nil). Nil: no turn reserves, and its budgets do not count
	// it (budget.go).
	Budget agent.Budgeter
	// Version is reported to agents as clientInfo.version.
	Version string
	Logger  *slog.Logger
	// Metrics, when set, counts the agent processes started, failed to
	// start and exited, and reports those alive.
	Metrics *telemetry.Metrics
}

// Defaults of Options' timing that `brood acp-bridge` shows as its flags'
// defaults.
const (
	DefaultSilenceTimeout = 60 * time.Second
	DefaultTurnTimeout    = 10 * time.Minute
)

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.SilenceTimeout, DefaultSilenceTimeout)
	def(&o.TurnTimeout, DefaultTurnTimeout)
	def(&o.EOFGrace, acpio.EOFGraceDefault)
	def(&o.TermGrace, acpio.TermGraceDefault)
	def(&o.ExitGrace, time.Second)
	def(&o.SealQuiet, 100*time.Millisecond)
	def(&o.SealWaitMax, time.Second)
	def(&o.AppendTimeout, store.SettleBudget)
	if o.LineBytesMax <= 0 {
		o.LineBytesMax = acpio.LineBytesMaxDefault
	}
	if o.OutputBytesMax <= 0 {
		o.OutputBytesMax = 512 << 10
	}
	if o.ToolTextBytesMax <= 0 {
		o.ToolTextBytesMax = 64 << 10
	}
	if o.Environ == nil {
		o.Environ = os.Environ
	}
	if o.Version == "" {
		o.Version = "0.1.0"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Provider is one configured ACP agent as a Brood provider.
type Provider struct {
	agent AgentConfig
	opts  Options
}

// NewProvider validates a and returns its provider.
func NewProvider(a AgentConfig, o Options) (*Provider, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if a.Permission == PolicyAsk && o.Requests == nil {
		return nil, fmt.Errorf("ACP agent %s: permission ask needs a requests client (Options.Requests) to ask with", a.Name)
	}
	o = o.withDefaults()
	o.Metrics.Known("", nil, nil, []string{a.Name}) // its start failures count from 0
	return &Provider{agent: a, opts: o}, nil
}

// Descriptor implements provider.Provider: every capability false, no parent
// context, no global tools, remote (its run id is not the child id), and
// continuable (docs/design.md §6: a followup prompts the resident ACP session
// again; a cold resume uses session/load where the agent offers it).
func (p *Provider) Descriptor() protocol.ProviderDescriptor {
	return protocol.ProviderDescriptor{Name: p.agent.Name, Remote: true, Continuable: true}
}

// NewSession implements provider.Provider. It only validates: the child's
// workspace (the configured override, else the parent's cwd recorded in the
// child's header: absolute and enterable, never the bridge's own cwd) and,
// when the session's log already names an ACP session (a cold resume), that
// the agent could load it. The agent process starts with the first turn, so a
// startup failure is logged and settles the run `error`.
func (p *Provider) NewSession(_ context.Context, spec provider.SessionSpec) (provider.Session, error) {
	cwd := p.agent.Cwd
	if cwd == "" {
		cwd = spec.Header.Cwd
		if err := acpio.ValidateDir(cwd); err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument,
				"the ACP child of provider %s needs its parent's workspace as cwd: %v", p.agent.Name, err)
		}
	}
	prior, ok := LastACPSession(spec.Events)
	if ok && !prior.LoadSession {
		return nil, protocol.NewError(protocol.CodeNotResumable, map[string]any{"childId": spec.Header.ID,
			"reason": "its ACP agent did not advertise session/load, so its ACP session " + prior.SessionID + " cannot be restored after its process ended"})
	}
	s := newSession(p, spec, cwd)
	if ok {
		s.resume = &prior
	}
	return s, nil
}

// LastACPSession returns the last acp/session event's data in events.
func LastACPSession(events []protocol.SessionEvent) (protocol.ACPSessionData, bool) {
	return protocol.LastACPSession(events)
}
