// Command brood is Brood's single binary: `brood dev` (embedded NATS and all
// services), one service per process (`brood coordinator`, `brood
// spawn-worker`), and the client verbs (docs/design.md §9).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// exitError carries a process exit status without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// globals are the flags shared by commands and where a command writes. Each
// flag is registered only on the commands that honour it, so a flag a verb
// would ignore is refused (brood dev runs its own server and takes no --nats).
type globals struct {
	natsURL  string
	allUsers bool // --all-users of the verbs that act with a user grant
	prefix   string
	logLevel string
	timeout  time.Duration
	out      io.Writer // what the command answers (stdout)
	errOut   io.Writer // diagnostics and ids for the user (stderr)
	// ctx is the command's base context: it carries the span of a client
	// verb ("brood run"), so the requests it makes join one trace.
	ctx      context.Context
	span     trace.Span
	shutdown func(context.Context) error // flushes exported spans
}

// isService reports whether cmd runs a long-lived service (its process is
// traced as brood-<name>, without a span of its own).
func isService(cmd *cobra.Command) bool {
	return cmd.GroupID == groupServices || cmd.GroupID == groupStart
}

// startTracing configures tracing from the OTEL_* environment (off unless
// asked, telemetry.SetupTracing) and opens a client verb's span.
func (g *globals) startTracing(cmd *cobra.Command) error {
	name := "brood"
	if isService(cmd) {
		name = "brood-" + cmd.Name()
	}
	_, shutdown, err := telemetry.SetupTracing(context.Background(), name)
	if err != nil {
		return err
	}
	g.shutdown = shutdown
	if !isService(cmd) {
		g.ctx, g.span = telemetry.Tracer().Start(context.Background(), "brood "+cmd.Name())
	}
	return nil
}

// stopTracing ends a client verb's span and flushes what was exported
// (bounded to 5 s).
func (g *globals) stopTracing(err error) {
	if g.span != nil {
		if err != nil {
			g.span.SetStatus(codes.Error, err.Error())
		}
		g.span.End()
	}
	if g.shutdown != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.shutdown(ctx)
	}
}

func defaultNATSURL() string {
	if u := os.Getenv("BROOD_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// natsFlag registers --nats on a command that talks to a NATS server.
func natsFlag(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVar(&g.natsURL, "nats", defaultNATSURL(), "NATS URL ($BROOD_NATS_URL when set); the user comes from $BROOD_NATS_USER with $BROOD_NATS_PASSWORD or $BROOD_NATS_PASSWORD_FILE, never from the command line")
}

// clientFlags registers the flags of a client verb: --nats and --timeout.
func clientFlags(cmd *cobra.Command, g *globals) {
	natsFlag(cmd, g)
	cmd.Flags().DurationVar(&g.timeout, "timeout", client.DefaultTimeout, "timeout of each coordinator request (the coordinator answers within it)")
}

// Command groups of `brood --help`, by what a user wants to do.
const (
	groupStart    = "start"
	groupDelegate = "delegate"
	groupObserve  = "observe"
	groupSteer    = "steer"
	groupServices = "services"
)

func init() {
	cobra.EnableCommandSorting = false // help lists verbs in the order of a session
}

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// execute runs the brood command line with args and returns the process exit
// status: 0 on success; 1 with the error's code first on the first line of
// stderr (docs/design.md §9); a verb's own status (brood run: 1 when the stop
// reason is not completed).
func execute(args []string, stdout, stderr io.Writer) int {
	return executeIn(args, nil, stdout, stderr)
}

// executeIn is execute with stdin read from in (nil: the process's stdin).
func executeIn(args []string, in io.Reader, stdout, stderr io.Writer) int {
	g := &globals{out: stdout, errOut: stderr, ctx: context.Background()}
	root := newRoot(g)
	root.SetArgs(args)
	if in != nil {
		root.SetIn(in)
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	g.stopTracing(err)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, protocol.ErrPermissionDenied) {
		err = withRole(err, cmd, g.allUsers)
	}
	if !cmd.HasParent() && protocol.CodeOf(err) == "" {
		// An error of brood itself, not of a verb: an unknown verb.
		err = protocol.Errorf(protocol.CodeInvalidArgument, "%w; `brood --help` lists the verbs", err)
	}
	if pe := protocol.CodeOf(err); pe != "" {
		fmt.Fprintln(stderr, protocol.AsError(err).Error())
	} else {
		fmt.Fprintln(stderr, "ERROR: "+err.Error())
	}
	return 1
}

// Roles (docs/security.md, deploy/README.md): the NATS user each verb runs
// as in a deployment with users.
const (
	roleAdmin       = "admin"
	roleCoordinator = "coordinator"
	roleCollector   = "collector"
	// roleWorker is a provider's worker user, worker-<provider>: it may
	// serve only that provider (docs/security.md).
	roleWorker      = "worker-<provider>"
	roleClient      = "client"
	roleTrustedHost = "trusted-host"
)

// verbRoles names the role of each verb that needs more than a client;
// every other client verb runs as a client.
var verbRoles = map[string]string{
	"provision":    roleAdmin,
	"coordinator":  roleCoordinator,
	"collector":    roleCollector,
	"spawn-worker": "worker-spawn",
	"fork-worker":  "worker-fork",
	"acp-bridge":   roleWorker,
	"acp-agent":    roleTrustedHost,
	"drain":        roleTrustedHost,
}

// roleOf is the role a verb needs (with --all-users: a trusted host's).
func roleOf(cmd *cobra.Command, allUsers bool) string {
	if r, ok := verbRoles[cmd.Name()]; ok {
		return r
	}
	if allUsers {
		return roleTrustedHost
	}
	return roleClient
}

// withRole adds to a PERMISSION_DENIED which role the verb needs.
func withRole(err error, cmd *cobra.Command, allUsers bool) error {
	pe := protocol.AsError(err)
	role := roleOf(cmd, allUsers)
	out := *pe
	out.Message = fmt.Sprintf("%s; `%s` needs a NATS user with the role %s (deploy/README.md lists the role of every verb; set $BROOD_NATS_USER and $BROOD_NATS_PASSWORD)", pe.Message, cmd.CommandPath(), role)
	out.Details = map[string]any{"role": role}
	for k, v := range pe.Details {
		out.Details[k] = v
	}
	return &out
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "brood",
		Short: "Brood: AI agents delegating work to child agents over NATS",
		Long: "Brood: AI agents delegating work to child agents over NATS.\n\n" +
			"Start with `brood dev` (embedded NATS and every service in one process), then in another\n" +
			"terminal `brood providers`, `brood run --provider spawn \"say hello\"`, `brood start ...`.",
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.prefix, "prefix", protocol.DefaultPrefix, "subject prefix of the deployment")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "", "log level: debug, info, warn, error (services default info, client verbs warn)")
	root.SetFlagErrorFunc(flagError)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		switch strings.ToLower(g.logLevel) {
		case "", "debug", "info", "warn", "error":
		default:
			return protocol.Errorf(protocol.CodeInvalidArgument, "--log-level %q must be debug, info, warn or error", g.logLevel)
		}
		return g.startTracing(cmd)
	}
	root.AddGroup(
		&cobra.Group{ID: groupStart, Title: "Run everything in one process:"},
		&cobra.Group{ID: groupDelegate, Title: "Delegate work to children:"},
		&cobra.Group{ID: groupObserve, Title: "See what children do and answered:"},
		&cobra.Group{ID: groupSteer, Title: "Steer children (stop, end, hold):"},
		&cobra.Group{ID: groupServices, Title: "Run the services separately (one per process):"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add(groupStart, devCmd(g))
	add(groupDelegate, providersCmd(g), runCmd(g), startCmd(g), followupCmd(g))
	add(groupObserve, stateCmd(g), resultCmd(g), childrenCmd(g), logCmd(g), watchCmd(g), inboxCmd(g), uiCmd(g))
	add(groupSteer, interruptCmd(g), disposeCmd(g), drainCmd(g), grantCmd(g), budgetCmd(g), requestsCmd(g), approveCmd(g), denyCmd(g), answerQuestionCmd(g))
	add(groupServices, provisionCmd(g), coordinatorCmd(g), collectorCmd(g), spawnWorkerCmd(g), forkWorkerCmd(g), acpBridgeCmd(g), acpAgentCmd(g), mcpCmd(g), a2aGatewayCmd(g), a2aWorkerCmd(g))
	root.AddCommand(natsServerCmd()) // hidden: the chaos harness's nodes
	root.AddCommand(routeTLSCmd(g))  // hidden: deploy/README.md's set-up step
	for _, c := range root.Commands() {
		if c.Args != nil {
			c.Args = argsError(c.Args)
		}
	}
	return root
}

// argsError turns a wrong number of arguments (cobra's Args checks) into
// INVALID_ARGUMENT with a hint, as flagError does for flags.
func argsError(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return protocol.Errorf(protocol.CodeInvalidArgument, "%s: %w; `%s --help` shows its usage", cmd.CommandPath(), err, cmd.CommandPath())
		}
		return nil
	}
}

// flagError turns a flag the command does not take (or a malformed value)
// into INVALID_ARGUMENT with a hint, so a flag is never silently ignored.
func flagError(cmd *cobra.Command, err error) error {
	hint := fmt.Sprintf("`%s --help` lists its flags", cmd.CommandPath())
	if cmd.Name() == "dev" && strings.Contains(err.Error(), "--nats") {
		hint = "brood dev runs its own embedded NATS server: choose its address with --listen HOST:PORT, " +
			"or run the services separately against an existing server (brood coordinator --nats URL, ...)"
	}
	return protocol.Errorf(protocol.CodeInvalidArgument, "%s: %w; %s", cmd.CommandPath(), err, hint)
}

func newLogger(level string, def slog.Level, w io.Writer) *slog.Logger {
	l := def
	switch strings.ToLower(level) {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// Where a process's NATS user and password come from, so they never appear
// on a command line (ps shows those): the environment, or a file; a user
// and password in the URL still work.
const (
	envNATSUser         = "BROOD_NATS_USER"
	envNATSPassword     = "BROOD_NATS_PASSWORD"
	envNATSPasswordFile = "BROOD_NATS_PASSWORD_FILE"
)

// natsUser is who a process connects as: $BROOD_NATS_USER with
// $BROOD_NATS_PASSWORD or the first line of $BROOD_NATS_PASSWORD_FILE (a
// mounted secret), else the user and password of the URL's first server,
// else nobody (a server without users, as brood dev's). The user names the
// connection's inbox prefix (_INBOX.<user>) and the subjects it calls the
// coordinator on (<p>.v1.user.<user>.<endpoint>), so it must be a subject
// token (^[A-Za-z0-9_-]{1,64}$); a deployment lets each user subscribe and
// call only under its own (docs/security.md).
func natsUser(url string) (user, password string, err error) {
	user, password = os.Getenv(envNATSUser), os.Getenv(envNATSPassword)
	file := os.Getenv(envNATSPasswordFile)
	switch {
	case password != "" && file != "":
		return "", "", protocol.Errorf(protocol.CodeInvalidArgument, "set $%s or $%s, not both", envNATSPassword, envNATSPasswordFile)
	case file != "":
		data, rerr := os.ReadFile(file)
		if rerr != nil {
			return "", "", protocol.Errorf(protocol.CodeInvalidArgument, "$%s: %w", envNATSPasswordFile, rerr)
		}
		password, _, _ = strings.Cut(strings.TrimRight(string(data), "\r\n"), "\n")
	}
	if user == "" && password != "" {
		return "", "", protocol.Errorf(protocol.CodeInvalidArgument, "a NATS password is set without $%s", envNATSUser)
	}
	if user == "" {
		first, _, _ := strings.Cut(url, ",")
		if u, perr := neturl.Parse(strings.TrimSpace(first)); perr == nil && u.User != nil {
			user = u.User.Username()
			password, _ = u.User.Password()
		}
	}
	if user != "" && !protocol.ValidID(user) {
		return "", "", protocol.Errorf(protocol.CodeInvalidArgument,
			"NATS user %q must match ^[A-Za-z0-9_-]{1,64}$: it names the connection's inbox prefix _INBOX.<user> and its coordinator subjects", user)
	}
	return user, password, nil
}

// connect dials NATS for a process named name as the user of natsUser,
// with that user's inbox prefix _INBOX.<user> (protocol.UserInboxPrefix):
// every reply, run notice and followed event of the process arrives under it.
func connect(url, name string) (*nats.Conn, error) {
	user, password, err := natsUser(url)
	if err != nil {
		return nil, err
	}
	var opts []nats.Option
	if user != "" {
		opts = append(opts, nats.UserInfo(user, password), nats.CustomInboxPrefix(protocol.UserInboxPrefix(user)))
	}
	return connectWith(url, name, opts...)
}

// connectWith dials NATS with explicit options (brood dev's own server
// takes none of the environment's).
func connectWith(url, name string, extra ...nats.Option) (*nats.Conn, error) {
	// nats.go prints asynchronous errors to stderr unless told otherwise; a
	// refused publish or subscription is reported by the call that made it
	// (PERMISSION_DENIED, pkg/client), so print nothing here.
	opts := append([]nats.Option{nats.Name(name), nats.Timeout(5 * time.Second),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, extra...)
	// Every process reconnects for as long as it runs: a client verb that
	// waits (run, followup --wait, log --follow, watch) rides out a broker
	// restart, bounded by its own deadline or client.Options.OutageMax, and
	// one that does not is bounded by --timeout (issue 37, item 1: with two
	// tries, a restart of `brood dev` left `brood run` waiting forever on a
	// closed connection).
	opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, connectError(url, err)
	}
	return nc, nil
}

// connectError is the catalogue error of a failed NATS dial: refused
// credentials are AUTHENTICATION_FAILED (retrying with them cannot help,
// issue 37, item 2); anything else (no server, a timeout) UNAVAILABLE.
func connectError(url string, err error) *protocol.Error {
	if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		return protocol.Errorf(protocol.CodeAuthenticationFailed, "connect to NATS at %s: %w", redactURL(url), err)
	}
	return protocol.Errorf(protocol.CodeUnavailable, "connect to NATS at %s: %w", redactURL(url), err)
}

// redactURL hides the passwords of a comma-separated NATS URL list.
func redactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := neturl.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// ctxWithSignals is the context of a client verb: base (the verb's, with
// its span) cancelled by Ctrl-C.
func ctxWithSignals(base context.Context) (context.Context, context.CancelFunc) {
	return signalContext(base)
}
