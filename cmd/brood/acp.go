package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/acpio"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	acpagent "github.com/brood-dev/brood/services/acp-agent"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

// acpTiming are the ACP bridge's bounds on its agents.
type acpTiming struct {
	silence, turn, eofGrace, termGrace time.Duration
}

func (a *acpTiming) flags(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&a.silence, "silence-timeout", acpbridge.DefaultSilenceTimeout, "a turn whose ACP agent sends nothing for this long ends error")
	cmd.Flags().DurationVar(&a.turn, "turn-timeout", acpbridge.DefaultTurnTimeout, "bound of one ACP turn, startup included")
	cmd.Flags().DurationVar(&a.eofGrace, "eof-grace", acpio.EOFGraceDefault, "teardown: wait this long after closing the agent's stdin before SIGTERM")
	cmd.Flags().DurationVar(&a.termGrace, "term-grace", acpio.TermGraceDefault, "teardown: wait this long after SIGTERM before SIGKILL")
}

// options applies the flags that were set over the config file's timing.
func (a *acpTiming) options(cmd *cobra.Command, o *acpbridge.Options) {
	set := func(name string, dst *time.Duration, v time.Duration) {
		if cmd.Flags().Changed(name) || *dst == 0 {
			*dst = v
		}
	}
	set("silence-timeout", &o.SilenceTimeout, a.silence)
	set("turn-timeout", &o.TurnTimeout, a.turn)
	set("eof-grace", &o.EOFGrace, a.eofGrace)
	set("term-grace", &o.TermGrace, a.termGrace)
}

func acpBridgeCmd(g *globals) *cobra.Command {
	var (
		t          timing
		at         acpTiming
		sf         storeFlags
		mf         metricsFlags
		configFile string
		specs      []string
	)
	cmd := &cobra.Command{
		Use:   "acp-bridge --nats URL (--agent SPEC ... | --config FILE)",
		Short: "Run the ACP bridge: one provider per configured Agent Client Protocol agent",
		Long: "Serves each configured ACP agent (claude-code, codex, gemini, brood acp-agent, ...) as a provider.\n" +
			"--agent takes comma-separated key=value pairs: name, command, arg (repeatable), env (repeatable:\n" +
			"KEY=VALUE sets a value, a bare KEY passes the bridge's own $KEY through), cwd, permission (reject|allow|ask), e.g.\n" +
			"  --agent name=codex,command=npx,arg=-y,arg=@zed-industries/codex-acp,env=HOME=/srv/codex,env=OPENAI_API_KEY\n" +
			"permission answers the agent's permission requests: reject (the default) or allow without asking anyone,\n" +
			"or ask: a request for approval the user answers (brood requests, approve, deny) or an ancestor agent.\n" +
			"The agent's environment is an allowlist: PATH, HOME, LANG, LC_ALL, TMPDIR and TZ of the bridge, then what\n" +
			"env names, and nothing else; values of the bridge's environment are redacted from its stderr in diagnostics.\n" +
			"--config FILE holds the same as JSON (\"env\" values, \"passEnv\" names; see services/acp-bridge).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			if err := t.validate(); err != nil {
				return err
			}
			var o acpbridge.Options
			var agents []acpbridge.AgentConfig
			if configFile != "" {
				f, err := acpbridge.LoadFile(configFile)
				if err != nil {
					return protocol.Errorf(protocol.CodeInvalidArgument, "--config: %w", err)
				}
				f.Apply(&o)
				agents = append(agents, f.Agents...)
			}
			for _, s := range specs {
				a, err := acpbridge.ParseAgentSpec(s)
				if err != nil {
					return protocol.Errorf(protocol.CodeInvalidArgument, "%w", err)
				}
				agents = append(agents, a)
			}
			if len(agents) == 0 {
				return protocol.Errorf(protocol.CodeInvalidArgument, "configure at least one ACP agent with --agent or --config")
			}
			at.options(cmd, &o)
			o.Logger = log
			if err := mf.listen(); err != nil {
				return err
			}
			defer mf.close()
			for _, a := range agents {
				sf.providers = append(sf.providers, a.Name)
			}
			sf.worker = true
			nc, st, err := serviceConn(cmd.Context(), g, "brood-acp-bridge", sf, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			b, err := newACPBridge(nc, st, t, agents, o, mf.metrics(), log)
			if err != nil {
				return err
			}
			return serve(mf.actors(b)...)
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "JSON config file: {\"agents\": [...], \"silenceTimeout\": \"60s\", ...}")
	cmd.Flags().StringArrayVar(&specs, "agent", nil, "an ACP agent: name=N,command=C[,arg=A]...[,env=K=V|env=K]...[,cwd=DIR][,permission=reject|allow|ask]")
	t.flags(cmd)
	at.flags(cmd)
	sf.flags(cmd)
	mf.flags(cmd)
	natsFlag(cmd, g)
	return cmd
}

func newACPBridge(nc *nats.Conn, st *store.Store, t timing, agents []acpbridge.AgentConfig, o acpbridge.Options, m *telemetry.Metrics, log *slog.Logger) (*acpbridge.Service, error) {
	return acpbridge.New(acpbridge.Config{
		NC: nc, Store: st, Agents: agents, Options: o,
		HeartbeatInterval: t.heartbeat, HostExpiry: t.hostExpiry, DrainGrace: t.drainGrace, Logger: log, Metrics: m,
	})
}

// devACPAgents is `brood dev`'s default ACP provider: `acp`, this binary's
// own ACP agent on the dev server, so the demo needs nothing installed. The
// model settings follow the dev flags; a model key the agent needs is passed
// through by name, since an agent gets nothing of the bridge's environment
// it does not name (docs/security.md, "Secrets stay home").
func devACPAgents(url, prefix string, mf modelFlags) ([]acpbridge.AgentConfig, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"acp-agent", "--nats", url, "--prefix", prefix, "--model", mf.adapter()}
	if mf.baseURL != "" {
		args = append(args, "--model-base-url", mf.baseURL)
	}
	if mf.name != "" {
		args = append(args, "--model-name", mf.name)
	}
	for _, r := range mf.workspaceRoots {
		args = append(args, "--workspace-root", r)
	}
	var pass []string
	if mf.adapter() == "openai" {
		pass = []string{"DEEPSEEK_API_KEY", "OPENAI_API_KEY", "BROOD_MODEL_BASE_URL", "BROOD_MODEL_NAME"}
	}
	return []acpbridge.AgentConfig{{Name: "acp", Command: exe, Args: args, PassEnv: pass, Permission: acpbridge.PolicyReject}}, nil
}

func acpAgentCmd(g *globals) *cobra.Command {
	var mf modelFlags
	var subagentProvider string
	cmd := &cobra.Command{
		Use:   "acp-agent --nats URL",
		Short: "Serve a Brood agent over ACP on stdin/stdout (for editors and the ACP bridge)",
		Long: "Speaks the Agent Client Protocol on stdin/stdout; logs go to stderr. Each ACP session is a Brood\n" +
			"session (a root agent opened on the deployment), so session/load works after a restart, and a\n" +
			"lineage passed in the _meta of session/new (by the ACP bridge) keeps depth limits and tool ceilings.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelWarn, g.errOut)
			models, err := mf.factory()
			if err != nil {
				return err
			}
			limits, err := mf.limits()
			if err != nil {
				return err
			}
			nc, err := connect(g.natsURL, "brood-acp-agent")
			if err != nil {
				return err
			}
			defer nc.Close()
			cl, err := client.New(nc, client.Options{Prefix: g.prefix, Timeout: g.timeout})
			if err != nil {
				return err
			}
			defer cl.Close()
			bctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			// A user NATS refuses the streams' info (a client's) ends it at
			// once with PERMISSION_DENIED naming the trusted-host role, not
			// after the deadline.
			vctx, stop := cancelOnViolation(bctx, nc)
			// It hosts roots: their headers and logs are all it touches directly.
			st, err := store.BindLogs(vctx, nc, cl.Subjects())
			stop()
			cancel()
			if err != nil {
				return storeError(nc, "open", err)
			}
			mf.warnNoWorkspace(log)
			svc, err := acpagent.New(acpagent.Config{
				Client: cl, Store: st, Models: models.def, Limits: limits, In: os.Stdin, Out: os.Stdout, Logger: log,
				Tools: acpagent.DelegationTools(subagentProvider, mf.workspaceRoots...),
			})
			if err != nil {
				return err
			}
			return serve(svc)
		},
	}
	mf.flags(cmd)
	cmd.Flags().StringVar(&subagentProvider, "subagent-provider", "spawn", "provider the agents' subagent tool delegates to")
	clientFlags(cmd, g)
	return cmd
}
