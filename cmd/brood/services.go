package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/run"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/mcptools"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/worker"
	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
	"github.com/brood-dev/brood/services/collector"
	"github.com/brood-dev/brood/services/coordinator"
	forkworker "github.com/brood-dev/brood/services/fork-worker"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
	"github.com/brood-dev/brood/services/webui"
)

// actor is a long-lived component: Run until ctx is done, nil on a drain.
type actor interface {
	Run(ctx context.Context) error
}

// serve runs actors in one oklog/run group with a signal handler; Ctrl-C or
// SIGTERM drains every actor and is not an error.
func serve(actors ...actor) error {
	var g run.Group
	for _, a := range actors {
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return a.Run(ctx) }, func(error) { cancel() })
	}
	g.Add(run.SignalHandler(context.Background(), os.Interrupt, syscall.SIGTERM))
	err := g.Run()
	var se *run.SignalError
	if errors.As(err, &se) {
		return nil
	}
	return err
}

// metricsFlags is --metrics ADDR of every service: Prometheus metrics of
// the process on http://ADDR/metrics (internal/telemetry lists them).
type metricsFlags struct {
	addr string
	m    *telemetry.Metrics
	srv  *telemetry.MetricsServer
}

func (f *metricsFlags) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "metrics", "", "serve Prometheus metrics on http://ADDR/metrics (host:port; off when empty)")
}

// listen starts listening when --metrics was given, so a busy address fails
// the command before anything else starts; metrics() is nil otherwise.
func (f *metricsFlags) listen() error {
	if f.addr == "" {
		return nil
	}
	f.m = telemetry.NewMetrics(buildinfo.Version)
	srv, err := telemetry.ListenMetrics(f.addr, f.m)
	if err != nil {
		return err
	}
	f.srv = srv
	return nil
}

func (f *metricsFlags) metrics() *telemetry.Metrics { return f.m }

// close releases the listener (after serve, or when start-up failed).
func (f *metricsFlags) close() {
	if f.srv != nil {
		f.srv.Close()
	}
}

// actors is the metrics server as an actor of the process's run group.
func (f *metricsFlags) actors(others ...actor) []actor {
	if f.srv == nil {
		return others
	}
	return append(others, f.srv)
}

// timing holds the liveness settings shared by services.
type timing struct {
	heartbeat  time.Duration
	hostExpiry time.Duration
	drainGrace time.Duration
	rootLease  time.Duration
}

func (t *timing) flags(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&t.heartbeat, "heartbeat", protocol.DefaultHeartbeatInterval, "heartbeat interval of this process in brood_hosts")
	cmd.Flags().DurationVar(&t.hostExpiry, "host-expiry", protocol.DefaultHostExpiry, "a host whose heartbeat is older than this is dead")
	cmd.Flags().DurationVar(&t.drainGrace, "drain-grace", worker.DefaultDrainGrace, "how long a stopping worker lets in-flight turns finish")
	cmd.Flags().DurationVar(&t.rootLease, "root-lease", coordinator.DefaultRootLease, "lease of a root agent between renewals (coordinator)")
}

// modelFlags configure in-process agents: their model, and the directories
// their workspaces may lie in.
type modelFlags struct {
	// mustName: a worker outside brood dev (spawn-worker, fork-worker)
	// has no default model: the scripted one must be asked for.
	mustName       bool
	kind           string
	baseURL        string
	name           string
	workspaceRoots []string
	// The turn limits of the agents (docs/protocol.md §10), shown in the
	// descriptor; a start may only tighten them.
	turnTimeout                          time.Duration
	stepsPerTurnMax, toolCallsPerStepMax int
}

// limits are the agents' turn limits from the flags: each must be positive.
func (m *modelFlags) limits() (agent.Limits, error) {
	if m.turnTimeout <= 0 || m.stepsPerTurnMax <= 0 || m.toolCallsPerStepMax <= 0 {
		return agent.Limits{}, protocol.Errorf(protocol.CodeInvalidArgument, "--turn-timeout, --steps-per-turn-max and --tool-calls-per-step-max must be positive")
	}
	return agent.Limits{TurnTimeout: m.turnTimeout, StepsPerTurnMax: m.stepsPerTurnMax, ToolCallsPerStepMax: m.toolCallsPerStepMax}, nil
}

func (m *modelFlags) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&m.kind, "model", "", "model adapter of the agents: scripted, or openai (any OpenAI-compatible endpoint; key from $DEEPSEEK_API_KEY or $OPENAI_API_KEY); default $"+envModel+", else openai when $"+model.EnvModelName+" or $"+model.EnvModelBaseURL+" is set, else scripted (brood dev, acp-agent) or none: a worker refuses to start without a model named")
	cmd.Flags().StringVar(&m.baseURL, "model-base-url", "", "openai adapter: base URL (default $BROOD_MODEL_BASE_URL, else https://api.deepseek.com)")
	cmd.Flags().StringVar(&m.name, "model-name", "", "model id, or several comma-separated (the first the default; a start chooses with its model option): openai adapter default $BROOD_MODEL_NAME, else deepseek-chat; scripted adapter default scripted")
	cmd.Flags().DurationVar(&m.turnTimeout, "turn-timeout", time.Duration(protocol.DefaultTurnTimeoutMs)*time.Millisecond, "most time one agent turn may take (a start may ask for less)")
	cmd.Flags().IntVar(&m.stepsPerTurnMax, "steps-per-turn-max", int(protocol.DefaultStepsPerTurnMax), "most model calls (steps) one agent turn may make (a start may ask for fewer)")
	cmd.Flags().IntVar(&m.toolCallsPerStepMax, "tool-calls-per-step-max", int(protocol.DefaultToolCallsPerStepMax), "most tool calls one model answer may ask for (a start may ask for fewer)")
	cmd.Flags().StringSliceVar(&m.workspaceRoots, "workspace-root", nil,
		"only sessions whose cwd lies in one of these directories may use the workspace tools (repeatable; {user} stands for the session's user; / allows any; default: none)")
}

// warnNoWorkspace says at start, once, that the workspace tools refuse
// every session: no --workspace-root allows no workspace (docs/security.md,
// "The workspace is fenced").
func (m *modelFlags) warnNoWorkspace(log *slog.Logger) {
	if len(m.workspaceRoots) == 0 {
		log.Warn("no --workspace-root: list_dir and read_file refuse every session; pass e.g. --workspace-root /srv/brood/workspaces/{user}")
	}
}

// envModel names the model adapter when --model is not given (issue 37,
// item 3: the deploy/ files said the BROOD_MODEL_* variables choose the
// model, yet without --model openai a worker served the scripted one).
const envModel = "BROOD_MODEL"

// adapter is the model adapter chosen: --model, else $BROOD_MODEL, else
// openai when an OpenAI-compatible endpoint or model is named in the
// environment ($BROOD_MODEL_NAME, $BROOD_MODEL_BASE_URL), else scripted;
// "" for a worker that must name its model (mustName) and named none.
func (m *modelFlags) adapter() string {
	if m.kind != "" {
		return m.kind
	}
	if v := os.Getenv(envModel); v != "" {
		return v
	}
	if os.Getenv(model.EnvModelName) != "" || os.Getenv(model.EnvModelBaseURL) != "" {
		return "openai"
	}
	if m.mustName {
		return ""
	}
	return "scripted"
}

// modelSet is what a worker's model flags give: the default model, the
// others it offers, and the descriptor's list of them (the default first,
// docs/protocol.md §9.1).
type modelSet struct {
	def    worker.ModelFactory
	choose worker.ModelChooser
	infos  []protocol.ModelInfo
}

// modelList is "adapter/id, …", the default first.
func modelList(infos []protocol.ModelInfo) string {
	names := make([]string, len(infos))
	for i, m := range infos {
		names[i] = m.String()
	}
	return strings.Join(names, ", ")
}

// modelIDs splits --model-name (or $BROOD_MODEL_NAME): one model id, or
// several comma-separated, the first the default (issue 37, item 3: a start
// may choose among them with its `model` option).
func modelIDs(list string) ([]string, error) {
	var ids []string
	for _, id := range strings.Split(list, ",") {
		id = strings.TrimSpace(id)
		if id == "" || slices.Contains(ids, id) {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "--model-name %q: give model ids separated by commas, each once", list)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// factory returns the models of new agents and what they are (the
// descriptor's models, docs/protocol.md §9.1). The openai adapter is built
// once per model id and shared (it is safe for concurrent use); nothing is
// called unless it is selected and a key is configured.
func (m *modelFlags) factory() (modelSet, error) {
	byID := map[protocol.ModelInfo]model.Model{}
	set := func(models []model.Model) modelSet {
		var s modelSet
		for _, x := range models {
			info := protocol.ModelInfo{Adapter: x.Provider(), ID: x.Name()}
			byID[info] = x
			s.infos = append(s.infos, info)
		}
		def := models[0]
		s.def = func() (model.Model, error) { return def, nil }
		s.choose = func(info protocol.ModelInfo) (model.Model, error) {
			if x, ok := byID[info]; ok {
				return x, nil
			}
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "model %s is not offered by this worker", info)
		}
		return s
	}
	switch kind := m.adapter(); kind {
	case "":
		return modelSet{}, protocol.Errorf(protocol.CodeInvalidArgument,
			"no model named: a worker outside `brood dev` does not fall back to the scripted model (issue 37); pass --model openai "+
				"(or set $%s or $%s; key from $%s or $%s), or --model scripted (or $%s=scripted) to run the scripted model on purpose",
			model.EnvModelName, model.EnvModelBaseURL, model.EnvDeepSeekKey, model.EnvOpenAIKey, envModel)
	case "scripted":
		// The scripted model answers the same under any id; --model-name
		// names several, so a start can choose among them (tests, demos).
		if m.name == "" {
			return set([]model.Model{model.NewScripted()}), nil
		}
		ids, err := modelIDs(m.name)
		if err != nil {
			return modelSet{}, err
		}
		var models []model.Model
		for _, id := range ids {
			models = append(models, model.NewScriptedID(id))
		}
		return set(models), nil
	case "openai":
		cfg := model.OpenAIConfigFromEnv()
		if m.baseURL != "" {
			cfg.BaseURL = m.baseURL
		}
		if m.name != "" {
			cfg.Model = m.name
		}
		ids, err := modelIDs(cfg.Model)
		if err != nil {
			return modelSet{}, err
		}
		var models []model.Model
		for _, id := range ids {
			c := cfg
			c.Model = id
			om, err := model.NewOpenAI(c)
			if err != nil {
				return modelSet{}, protocol.Errorf(protocol.CodeInvalidArgument, "--model openai: %w", err)
			}
			models = append(models, om)
		}
		return set(models), nil
	default:
		return modelSet{}, protocol.Errorf(protocol.CodeInvalidArgument, "unknown model adapter %q (known: scripted, openai; from --model or $%s)", kind, envModel)
	}
}

// mcpFlags are the in-process workers' tool flags: --mcp-config FILE, MCP
// servers whose tools their children get (internal/mcptools, docs/mcp.md;
// secrets, a server's env and headers, live in the file, never on the
// command line), and --approve-tools, the tools every child of the
// provider asks approval for before each call (the descriptor's
// approveTools, docs/protocol.md §9.1).
type mcpFlags struct{ file, approve string }

func (f *mcpFlags) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.file, "mcp-config", "", `JSON file of MCP servers whose tools the children get as <server>__<tool>: {"servers": [{"name", "command", "args", "env"} | {"name", "url", "headers"}, ...]} (docs/mcp.md)`)
	cmd.Flags().StringVar(&f.approve, "approve-tools", "", "comma-separated tools (the provider's, MCP tools included) every child asks approval for before each call, whatever its start says")
}

// described is desc with the --approve-tools given (the host checks the
// names against its tools).
func (f *mcpFlags) described(desc protocol.ProviderDescriptor) protocol.ProviderDescriptor {
	desc.ApproveTools = splitList(f.approve)
	return desc
}

func (f *mcpFlags) servers() ([]mcptools.ServerConfig, error) {
	if f.file == "" {
		return nil, nil
	}
	s, err := mcptools.LoadFile(f.file)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "--mcp-config: %w", err)
	}
	return s, nil
}

// storeFlags are what a service checks Brood's streams and buckets against.
type storeFlags struct {
	replicas int
	// providers are the providers the service serves, whose log and inbox
	// streams it needs (store.Config.Providers): set by the service, not a
	// flag (a worker its own, a coordinator or collector none).
	providers []string
	// worker: the service reads and writes no root's log or inbox
	// (store.Config.SkipRoots).
	worker bool
	// jsDomain is the JetStream domain of the hub (store.Config.JSDomain):
	// --js-domain, default $BROOD_JS_DOMAIN.
	jsDomain string
}

// envJSDomain is the default of --js-domain.
const envJSDomain = "BROOD_JS_DOMAIN"

func (s *storeFlags) flags(cmd *cobra.Command) {
	cmd.Flags().IntVar(&s.replicas, "replicas", 0, "replicas the streams and buckets must have (0: whatever brood provision gave them); the service only checks, it never changes them")
	cmd.Flags().StringVar(&s.jsDomain, "js-domain", os.Getenv(envJSDomain), "JetStream domain of the hub whose streams Brood runs on, when the service connects through a leaf node that runs JetStream of its own (a site; deploy/README.md \"Sites\"); empty: the connection's own JetStream (default $"+envJSDomain+")")
}

// serviceConn connects a service process (reconnecting forever) and opens
// Brood's streams and buckets, waiting while they are not provisioned
// (openStore); close the connection when done.
func serviceConn(ctx context.Context, g *globals, name string, sf storeFlags, log *slog.Logger) (*nats.Conn, *store.Store, error) {
	nc, err := connect(g.natsURL, name)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := signalContext(ctx)
	defer cancel()
	st, err := openStore(sctx, nc, g.prefix, sf, log)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, st, nil
}

// coordinatorLimits are the coordinator's admission limits (docs/design.md §4).
// The per-user quotas are docs/security.md's.
type coordinatorLimits struct {
	liveChildrenMax       int
	startQueueMax         int
	userOpenRootsMax      int
	userRequestsPerSecond float64
	userRequestsBurst     int
	// requestTimeout: how long a request for approval or a question waits
	// for its answer before it is timed-out, a denial (docs/protocol.md §5.21).
	requestTimeout time.Duration
	// continueWaitMax and takeoversMax bound the continuation of a one-shot
	// run whose host died (docs/protocol.md §8.4, "Continued after a host
	// loss").
	continueWaitMax time.Duration
	takeoversMax    int
}

func (l *coordinatorLimits) flags(cmd *cobra.Command) {
	cmd.Flags().IntVar(&l.liveChildrenMax, "live-children-max", 64, "most live children one parent may have (a start beyond, one-shot or continuable, waits in the parent's start queue)")
	cmd.Flags().IntVar(&l.startQueueMax, "start-queue-max", protocol.DefaultStartQueueMax, "most starts (one-shot and continuable) that may wait in one parent's start queue while it is at --live-children-max (LIMIT_EXCEEDED beyond); -1: no queue, a start at the limit is refused")
	cmd.Flags().IntVar(&l.userOpenRootsMax, "user-open-roots-max", coordinator.DefaultUserOpenRootsMax, "most roots one NATS user may hold open (LIMIT_EXCEEDED beyond)")
	cmd.Flags().Float64Var(&l.userRequestsPerSecond, "user-requests-per-second", coordinator.DefaultUserRequestsPerSecond, "requests per second one NATS user may send to this replica, on average (LIMIT_EXCEEDED beyond)")
	cmd.Flags().IntVar(&l.userRequestsBurst, "user-requests-burst", coordinator.DefaultUserRequestsBurst, "requests one NATS user may send to this replica at once, above its rate")
	cmd.Flags().DurationVar(&l.requestTimeout, "request-timeout", protocol.RequestTimeout, "how long a child's request for approval or question waits for its answer before it times out (a denial), unless its tree's start set its own (at most 24h)")
	cmd.Flags().DurationVar(&l.continueWaitMax, "continue-wait-max", coordinator.DefaultContinueWaitMax, "how long a one-shot run whose host died waits for another instance to continue its turn before it ends HOST_LOST (negative: never continued)")
	cmd.Flags().IntVar(&l.takeoversMax, "takeovers-max", coordinator.DefaultTakeoversMax, "most takeovers one run is continued through; the next host loss ends it HOST_LOST")
}

func (l coordinatorLimits) validate() error {
	if l.liveChildrenMax <= 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--live-children-max must be positive")
	}
	if l.startQueueMax == 0 || l.startQueueMax < -1 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--start-queue-max must be positive, or -1 for no queue")
	}
	if l.userOpenRootsMax <= 0 || l.userRequestsPerSecond <= 0 || l.userRequestsBurst <= 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--user-open-roots-max, --user-requests-per-second and --user-requests-burst must be positive")
	}
	if l.takeoversMax <= 0 || l.continueWaitMax == 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--takeovers-max must be positive and --continue-wait-max not zero (negative: runs are never continued)")
	}
	if l.requestTimeout < time.Millisecond || l.requestTimeout.Milliseconds() > protocol.RequestTimeoutMsMax {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--request-timeout must be at least 1ms and at most %s, not %s", time.Duration(protocol.RequestTimeoutMsMax)*time.Millisecond, l.requestTimeout)
	}
	return nil
}

func newCoordinator(nc *nats.Conn, st *store.Store, t timing, l coordinatorLimits, m *telemetry.Metrics, log *slog.Logger) (*coordinator.Coordinator, error) {
	return coordinator.New(coordinator.Config{
		NC: nc, Store: st, HeartbeatInterval: t.heartbeat, HostExpiry: t.hostExpiry, RootLease: t.rootLease,
		LiveChildrenMax: l.liveChildrenMax, StartQueueMax: l.startQueueMax, UserOpenRootsMax: l.userOpenRootsMax,
		UserRequestsPerSecond: l.userRequestsPerSecond, UserRequestsBurst: l.userRequestsBurst, RequestTimeout: l.requestTimeout,
		ContinueWaitMax: l.continueWaitMax, TakeoversMax: l.takeoversMax,
		Logger: log, Metrics: m,
	})
}

// newInProcessWorker builds the worker of an in-process provider (spawn, fork).
func newInProcessWorker(nc *nats.Conn, st *store.Store, t timing, models modelSet, limits agent.Limits, roots []string, servers []mcptools.ServerConfig, m *telemetry.Metrics, log *slog.Logger, desc protocol.ProviderDescriptor) (*worker.Host, error) {
	desc.Models = models.infos
	return worker.NewInProcessHost(worker.InProcessConfig{
		NC: nc, Store: st, Models: models.def, ModelFor: models.choose, Limits: limits, HeartbeatInterval: t.heartbeat, HostExpiry: t.hostExpiry,
		DrainGrace: t.drainGrace, WorkspaceRoots: roots, Logger: log, Metrics: m, MCPServers: servers,
	}, desc)
}

// validate refuses timings that would break liveness judgement.
func (t timing) validate() error {
	switch {
	case t.heartbeat <= 0:
		return protocol.Errorf(protocol.CodeInvalidArgument, "--heartbeat must be positive")
	case t.hostExpiry <= t.heartbeat:
		return protocol.Errorf(protocol.CodeInvalidArgument, "--host-expiry (%s) must be longer than --heartbeat (%s)", t.hostExpiry, t.heartbeat)
	case t.drainGrace < 0:
		return protocol.Errorf(protocol.CodeInvalidArgument, "--drain-grace must not be negative")
	case t.rootLease <= 0:
		return protocol.Errorf(protocol.CodeInvalidArgument, "--root-lease must be positive")
	}
	return nil
}

func coordinatorCmd(g *globals) *cobra.Command {
	var t timing
	var sf storeFlags
	var lim coordinatorLimits
	var mf metricsFlags
	cmd := &cobra.Command{
		Use:   "coordinator",
		Short: "Run a coordinator replica (provider registry, authority, runs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			if err := t.validate(); err != nil {
				return err
			}
			if err := lim.validate(); err != nil {
				return err
			}
			if err := mf.listen(); err != nil {
				return err
			}
			defer mf.close()
			nc, st, err := serviceConn(cmd.Context(), g, "brood-coordinator", sf, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			c, err := newCoordinator(nc, st, t, lim, mf.metrics(), log)
			if err != nil {
				return err
			}
			return serve(mf.actors(c)...)
		},
	}
	t.flags(cmd)
	sf.flags(cmd)
	mf.flags(cmd)
	natsFlag(cmd, g)
	lim.flags(cmd)
	return cmd
}

// collectorFlags configure the collector (services/collector).
type collectorFlags struct {
	retention time.Duration
	interval  time.Duration
}

func (f *collectorFlags) flags(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.retention, "retention", collector.DefaultRetention, "a closed root's tree is removed once idle this long (its last write: the close, a header, a log record)")
	cmd.Flags().DurationVar(&f.interval, "interval", collector.DefaultInterval, "time between sweeps")
}

func (f collectorFlags) validate() error {
	if f.retention <= 0 || f.interval <= 0 {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--retention and --interval must be positive")
	}
	return nil
}

func (f collectorFlags) collector(st *store.Store, log *slog.Logger) (*collector.Collector, error) {
	return collector.New(collector.Config{Store: st, Retention: f.retention, Interval: f.interval, Logger: log})
}

// stopOnViolation runs an actor on nc and ends it with PERMISSION_DENIED
// as soon as the server refuses nc's user a publish or subscription (a
// refused JetStream request would otherwise only time out).
type stopOnViolation struct {
	nc *nats.Conn
	a  actor
}

func (s stopOnViolation) Run(ctx context.Context) error {
	vctx, stop := cancelOnViolation(ctx, s.nc)
	defer stop()
	err := s.a.Run(vctx)
	if pv := context.Cause(vctx); errors.Is(pv, nats.ErrPermissionViolation) {
		return protocol.Errorf(protocol.CodePermissionDenied, "%w", pv)
	}
	return err
}

func collectorCmd(g *globals) *cobra.Command {
	var sf storeFlags
	var cf collectorFlags
	var mf metricsFlags
	cmd := &cobra.Command{
		Use:   "collector",
		Short: "Run the collector: remove closed roots' trees once idle for the retention",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			if err := cf.validate(); err != nil {
				return err
			}
			// --metrics as every service has it (deploy/k8s and compose
			// scrape each pod; issue 37, item 8): the process's own series.
			if err := mf.listen(); err != nil {
				return err
			}
			defer mf.close()
			nc, st, err := serviceConn(cmd.Context(), g, "brood-collector", sf, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			c, err := cf.collector(st, log)
			if err != nil {
				return err
			}
			return serve(mf.actors(stopOnViolation{nc, c})...)
		},
	}
	sf.flags(cmd)
	cf.flags(cmd)
	mf.flags(cmd)
	natsFlag(cmd, g)
	return cmd
}

func spawnWorkerCmd(g *globals) *cobra.Command {
	return inProcessWorkerCmd(g, "spawn-worker", "Run a worker of the spawn provider (fresh children)", spawnworker.Descriptor(spawnworker.DefaultName))
}

func forkWorkerCmd(g *globals) *cobra.Command {
	return inProcessWorkerCmd(g, "fork-worker", "Run a worker of the fork provider (children seeded with the parent's completed turns)", forkworker.Descriptor(forkworker.DefaultName))
}

func inProcessWorkerCmd(g *globals, use, short string, desc protocol.ProviderDescriptor) *cobra.Command {
	var t timing
	mf := modelFlags{mustName: true}
	var mcpf mcpFlags
	var sf storeFlags
	var met metricsFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			if err := t.validate(); err != nil {
				return err
			}
			models, err := mf.factory()
			if err != nil {
				return err
			}
			limits, err := mf.limits()
			if err != nil {
				return err
			}
			servers, err := mcpf.servers()
			if err != nil {
				return err
			}
			if err := met.listen(); err != nil {
				return err
			}
			defer met.close()
			sf.providers, sf.worker = []string{desc.Name}, true
			nc, st, err := serviceConn(cmd.Context(), g, "brood-"+use, sf, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			mf.warnNoWorkspace(log)
			w, err := newInProcessWorker(nc, st, t, models, limits, mf.workspaceRoots, servers, met.metrics(), log, mcpf.described(desc))
			if err != nil {
				return err
			}
			return serve(met.actors(w)...)
		},
	}
	t.flags(cmd)
	mf.flags(cmd)
	mcpf.flags(cmd)
	sf.flags(cmd)
	met.flags(cmd)
	natsFlag(cmd, g)
	return cmd
}

func devCmd(g *globals) *cobra.Command {
	var (
		t      timing
		lim    coordinatorLimits
		mf     modelFlags
		mcpf   mcpFlags
		data   string
		listen string
		fsync  string
		met    metricsFlags
		ui     uiFlags
		cf     collectorFlags
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an embedded NATS server with JetStream, a coordinator and every provider in one process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			if err := t.validate(); err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			if err := lim.validate(); err != nil {
				return err
			}
			if fsync != embedded.FsyncInterval && fsync != embedded.FsyncAlways {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--fsync %q must be interval or always", fsync)
			}
			if !cmd.Flags().Changed("workspace-root") {
				mf.workspaceRoots = []string{agent.AnyWorkspace}
			}
			models, err := mf.factory()
			if err != nil {
				return err
			}
			limits, err := mf.limits()
			if err != nil {
				return err
			}
			servers, err := mcpf.servers()
			if err != nil {
				return err
			}
			host, port, err := splitListen(listen)
			if err != nil {
				return err
			}
			dir, err := filepath.Abs(data)
			if err != nil {
				return err
			}
			unlock, err := lockDataDir(dir)
			if err != nil {
				return err
			}
			defer unlock()
			if err := checkListen(host, port); err != nil {
				return err
			}
			if err := met.listen(); err != nil {
				return err
			}
			defer met.close()
			ns, err := embedded.Start(embedded.Config{Host: host, Port: port, DataDir: filepath.Join(dir, "jetstream"), Fsync: fsync})
			if err != nil {
				return protocol.Errorf(protocol.CodeUnavailable, "%w", err)
			}
			defer ns.Shutdown()
			nc, err := connectWith(ns.ClientURL(), "brood-dev")
			if err != nil {
				return err
			}
			defer nc.Close()
			// brood dev is its own admin: it provisions R1 streams and buckets.
			subj, err := protocol.NewSubjects(g.prefix)
			if err != nil {
				return protocol.Errorf(protocol.CodeInvalidArgument, "%w", err)
			}
			if err := provision(cmd.Context(), nc, subj, store.DefaultConfig(), provisionRetryMax, log); err != nil {
				return err
			}
			st, err := openStore(cmd.Context(), nc, g.prefix, storeFlags{replicas: 1, providers: store.DefaultProviders}, log)
			if err != nil {
				return err
			}
			c, err := newCoordinator(nc, st, t, lim, met.metrics(), log)
			if err != nil {
				return err
			}
			spawnDesc, forkDesc := spawnworker.Descriptor(spawnworker.DefaultName), forkworker.Descriptor(forkworker.DefaultName)
			spawn, err := newInProcessWorker(nc, st, t, models, limits, mf.workspaceRoots, servers, met.metrics(), log, mcpf.described(spawnDesc))
			if err != nil {
				return err
			}
			fork, err := newInProcessWorker(nc, st, t, models, limits, mf.workspaceRoots, servers, met.metrics(), log, mcpf.described(forkDesc))
			if err != nil {
				return err
			}
			acpAgents, err := devACPAgents(ns.ClientURL(), g.prefix, mf)
			if err != nil {
				return err
			}
			bridge, err := newACPBridge(nc, st, t, acpAgents, acpbridge.Options{Logger: log}, met.metrics(), log)
			if err != nil {
				return err
			}
			gc, err := cf.collector(st, log)
			if err != nil {
				return err
			}
			actors := met.actors(c, spawn, fork, bridge, gc)
			var web *webui.Server
			if ui.listen != "" {
				w, done, err := ui.newWebUI(nc, g.prefix, log)
				if err != nil {
					return err
				}
				defer done()
				web, actors = w, append(actors, w)
			}
			fmt.Fprintf(g.out, "brood dev: NATS client URL %s\n", ns.ClientURL())
			fmt.Fprintf(g.out, "brood dev: data in %s; JetStream %s\n", dir, ns.FsyncMode())
			if web != nil {
				fmt.Fprintf(g.out, "brood dev: web view on %s\n", web.URL())
			}
			fmt.Fprintf(g.out, "brood dev: providers spawn, fork, acp; model %s; Ctrl-C drains and exits\n", modelList(models.infos))
			if met.srv != nil {
				fmt.Fprintf(g.out, "brood dev: metrics on http://%s/metrics\n", met.srv.Addr())
			}
			err = serve(actors...)
			_ = nc.Drain()
			if err == nil {
				fmt.Fprintln(g.out, "brood dev: drained and stopped")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&data, "data", "./.brood", "directory of JetStream's file storage")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:4222", "host:port the embedded NATS server listens on (port 0 picks one)")
	cmd.Flags().StringVar(&fsync, "fsync", embedded.FsyncInterval, "JetStream flush mode: interval (server default, 2 min) or always")
	ui.flags(cmd, "ui", "", "also serve the web view on host:port (e.g. "+DefaultUIListen+"; off when empty); beyond loopback it needs --access-token")
	t.flags(cmd)
	lim.flags(cmd)
	cf.flags(cmd)
	mf.flags(cmd)
	// brood dev is one user's own deployment, its workers running as that
	// user: any workspace, unless narrowed (docs/security.md).
	root := cmd.Flags().Lookup("workspace-root")
	root.DefValue = "[" + agent.AnyWorkspace + "]"
	root.Usage = strings.Replace(root.Usage, "; default: none", "", 1)
	mcpf.flags(cmd)
	met.flags(cmd)
	return cmd
}

func splitListen(s string) (string, int, error) {
	host, portStr, err := netSplit(s)
	if err != nil {
		return "", 0, protocol.Errorf(protocol.CodeInvalidArgument, "--listen %q: %w", s, err)
	}
	var port int
	if _, err := fmt.Sscanf(portStr, "%d", &port); err != nil || port < 0 || port > 65535 {
		return "", 0, protocol.Errorf(protocol.CodeInvalidArgument, "--listen %q: bad port", s)
	}
	if port == 0 {
		port = -1 // nats-server: pick a free port
	}
	return host, port, nil
}

// lockDataDir takes an exclusive lock on the data directory: two embedded
// servers on one JetStream store would corrupt it.
func lockDataDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "--data %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "brood.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "--data %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory %s is in use by another brood dev; stop it or choose another --data", dir)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// checkListen fails fast, naming the address, when the port is taken.
func checkListen(host string, port int) error {
	if port <= 0 {
		return nil
	}
	addr := netJoin(host, port)
	l, err := netListen(addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w; stop what uses it or choose another --listen (port 0 picks a free one)", addr, err)
	}
	return l.Close()
}
