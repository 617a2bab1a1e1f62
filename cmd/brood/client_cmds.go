package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// session is a client verb's connection and client, and where it writes.
type session struct {
	cl       *client.Client
	allUsers bool // --all-users: mint a grant over every session
	log      *slog.Logger
	out      io.Writer
	errOut   io.Writer
	grant    string // the user grant minted for this command, once asked for
	ctx      context.Context
}

func openClient(g *globals) (*session, func(), error) {
	log := newLogger(g.logLevel, slog.LevelWarn, g.errOut)
	nc, err := connect(g.natsURL, "brood-cli")
	if err != nil {
		return nil, nil, err
	}
	cl, err := client.New(nc, client.Options{Prefix: g.prefix, Timeout: g.timeout})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return &session{cl: cl, allUsers: g.allUsers, log: log, out: g.out, errOut: g.errOut, ctx: g.ctx}, func() { cl.Close(); nc.Close() }, nil
}

// withClient runs a client verb: a connection and client for its duration,
// and a context cancelled by Ctrl-C.
func withClient(g *globals, fn func(ctx context.Context, s *session) error) error {
	s, done, err := openClient(g)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := ctxWithSignals(g.ctx)
	defer cancel()
	return fn(ctx, s)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func providersCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "providers",
		Short: "List the live providers and their capabilities",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				r, err := s.cl.Providers(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, r)
				}
				tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PROVIDER\tINSTANCES\tOUTPUT-SCHEMA\tDEPTH-LIMIT\tTOOL-FILTER\tPERSONA\tINHERITS-CONTEXT\tCONTINUABLE\tTOOLS\tAPPROVE-TOOLS\tMODEL")
				for _, d := range r.Providers {
					c := d.Capabilities
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, r.Instances[d.Name],
						yes(c.OutputSchema), yes(c.DepthLimit), yes(c.ToolFilter), yes(c.Persona),
						yes(d.InheritsParentContext), yes(d.Continuable), orDash(strings.Join(d.Tools, ",")), orDash(strings.Join(d.ApproveTools, ",")), models(d.Models))
				}
				if len(r.Providers) == 0 {
					fmt.Fprintln(tw, "(no live providers)")
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	clientFlags(cmd, g)
	return cmd
}

// models is a descriptor's models as `brood providers` shows them:
// adapter/id, the default first; "-" when the provider names none.
func models(ms []protocol.ModelInfo) string {
	if len(ms) == 0 {
		return "-"
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return strings.Join(out, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// childFlags are the composition flags shared by `brood run` and `brood
// start`: depth cap, tool filter and persona (and, for run, --schema).
type childFlags struct {
	provider   string
	asJSON     bool
	schema     string
	maxDepth   int64
	allowTools string
	denyTools  string
	persona    string
	// autoApprove is --auto-approve: tools needing approval the child runs
	// without asking (docs/protocol.md §5.5).
	autoApprove string
	// approveTools is --approve-tools: more tools the child and its tree
	// ask approval for before each call (docs/protocol.md §5.5).
	approveTools string
	progress     string // --progress of run
	// model and the turn limits the child may be narrowed to
	// (docs/protocol.md §5.5, "Model and turn limits").
	model                                string
	turnTimeout                          time.Duration
	stepsPerTurnMax, toolCallsPerStepMax int64
	// requestTimeout is --request-timeout: how long each request of the
	// child's tree waits for an answer (docs/protocol.md §5.21).
	requestTimeout time.Duration
	// budget is --budget: the child's budget (protocol.ParseBudget;
	// docs/protocol.md §5.5, "Budgets").
	budget string
}

// register adds the flags to cmd; withSchema adds --schema (one-shot only:
// structured output is a result contract, a continuable child has none).
func (f *childFlags) register(cmd *cobra.Command, withSchema bool) {
	cmd.Flags().StringVar(&f.provider, "provider", "", "provider name (see brood providers)")
	if withSchema {
		cmd.Flags().StringVar(&f.schema, "schema", "", "JSON Schema file: the child must return structured output matching it")
	}
	cmd.Flags().Int64Var(&f.maxDepth, "max-depth", 0, "absolute delegation depth cap for the child (0 refuses any child)")
	cmd.Flags().StringVar(&f.allowTools, "allow-tools", "", "comma-separated tools the child may use (\"\" hides every tool)")
	cmd.Flags().StringVar(&f.denyTools, "deny-tools", "", "comma-separated tools the child may not use")
	cmd.Flags().StringVar(&f.autoApprove, "auto-approve", "", "comma-separated tools needing approval (write_file, edit_file, run_command) the child may run without asking")
	cmd.Flags().StringVar(&f.approveTools, "approve-tools", "", "comma-separated tools the child and everything it delegates must ask approval for before each call (adds to write_file, edit_file, run_command)")
	cmd.Flags().StringVar(&f.persona, "persona", "", "the child's persona, a template with {{provider}}, {{model}}, {{cwd}}")
	cmd.Flags().StringVar(&f.model, "model", "", "the model the child runs on, among those its provider offers (adapter/id or id; see brood providers)")
	cmd.Flags().DurationVar(&f.turnTimeout, "turn-timeout", 0, "a shorter turn time limit for the child (never above its worker's)")
	cmd.Flags().Int64Var(&f.stepsPerTurnMax, "steps-per-turn-max", 0, "fewer model calls per turn for the child (never above its worker's)")
	cmd.Flags().Int64Var(&f.toolCallsPerStepMax, "tool-calls-per-step-max", 0, "fewer tool calls per model answer for the child (never above its worker's)")
	cmd.Flags().DurationVar(&f.requestTimeout, "request-timeout", 0, "how long each approval or question of the child's tree waits for an answer before it times out as a denial (at most 24h; default 5m)")
	cmd.Flags().StringVar(&f.budget, "budget", "", "a budget for the child and its whole subtree: tokens=200k,modelRequests=50,toolCalls=100,children=20,deadline=15m (any of them)")
}

// startOptions builds the start options from the flags the user set; an
// unset flag sends nothing, so capability checks see only what was asked.
func (f *childFlags) startOptions(cmd *cobra.Command) (protocol.StartOptions, error) {
	var o protocol.StartOptions
	fl := cmd.Flags()
	if f.provider == "" {
		return o, protocol.Errorf(protocol.CodeInvalidArgument, "--provider is required (`brood providers` lists them)")
	}
	if fl.Changed("schema") {
		data, err := os.ReadFile(f.schema)
		if err != nil {
			return o, protocol.Errorf(protocol.CodeInvalidArgument, "--schema: %w", err)
		}
		v, err := sessionlog.DecodeJSONValue(string(data))
		if err != nil {
			return o, protocol.Errorf(protocol.CodeInvalidArgument, "--schema %s is not JSON: %w", f.schema, err)
		}
		o.OutputSchema = v
	}
	if fl.Changed("max-depth") {
		o.MaxDepth = f.maxDepth
	}
	if fl.Changed("allow-tools") || fl.Changed("deny-tools") {
		o.ToolFilter = &protocol.ToolFilter{}
		if fl.Changed("allow-tools") {
			o.ToolFilter.Allow = splitList(f.allowTools)
		}
		if fl.Changed("deny-tools") {
			o.ToolFilter.Deny = splitList(f.denyTools)
		}
	}
	if fl.Changed("auto-approve") {
		o.AutoApprove = splitList(f.autoApprove)
	}
	if fl.Changed("approve-tools") {
		o.ApproveTools = splitList(f.approveTools)
	}
	if fl.Changed("persona") {
		p := f.persona
		o.Persona = &p
	}
	if fl.Changed("model") {
		o.Model = f.model
	}
	var l protocol.TurnLimits
	for _, x := range []struct {
		flag string
		v    int64
		dst  *int64
	}{
		{"turn-timeout", f.turnTimeout.Milliseconds(), &l.TurnTimeoutMs},
		{"steps-per-turn-max", f.stepsPerTurnMax, &l.StepsPerTurnMax},
		{"tool-calls-per-step-max", f.toolCallsPerStepMax, &l.ToolCallsPerStepMax},
	} {
		if !fl.Changed(x.flag) {
			continue
		}
		if x.v <= 0 {
			if x.flag == "turn-timeout" {
				// Carried in whole milliseconds: 1ns is positive, and still 0.
				return o, protocol.Errorf(protocol.CodeInvalidArgument, "--turn-timeout must be at least 1ms (got %s)", f.turnTimeout)
			}
			return o, protocol.Errorf(protocol.CodeInvalidArgument, "--%s must be positive", x.flag)
		}
		*x.dst = x.v
	}
	if !l.IsZero() {
		o.Limits = &l
	}
	if fl.Changed("request-timeout") {
		if f.requestTimeout < time.Millisecond {
			return o, protocol.Errorf(protocol.CodeInvalidArgument, "--request-timeout must be at least 1ms, not %s", f.requestTimeout)
		}
		o.RequestTimeoutMs = f.requestTimeout.Milliseconds()
	}
	if fl.Changed("budget") {
		b, err := protocol.ParseBudget(f.budget)
		if err != nil {
			return o, err
		}
		o.Budget = &b
	}
	return o, nil
}

// splitList splits a comma-separated flag; "" is an empty (present) list.
func splitList(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func runCmd(g *globals) *cobra.Command {
	var f childFlags
	var ps promptSource
	cmd := &cobra.Command{
		Use:   "run --provider NAME [flags] (PROMPT | - | --prompt-file FILE)",
		Short: "Run a one-shot child from a root opened in the current directory; prints its output",
		Long: "Opens a root agent in the current directory, starts a one-shot child on the provider, waits for\n" +
			"its result and prints the output on stdout (--json: runId, childId and the whole result). The\n" +
			"child's id goes to stderr as soon as it started, for `brood log CHILD` in another terminal.\n" +
			"Exits 0 only when the stop reason is completed. Ctrl-C disposes the child.\n" +
			"The prompt is the words after the flags, or read from stdin (\"-\") or --prompt-file; it must be UTF-8.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := f.startOptions(cmd)
			if err != nil {
				return err
			}
			prompt, err := ps.read(cmd, args, "prompt")
			if err != nil {
				return err
			}
			s, done, err := openClient(g)
			if err != nil {
				return err
			}
			defer done()
			return runOnce(s, f, opts, prompt)
		},
	}
	f.register(cmd, true)
	ps.register(cmd, "prompt")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print runId, childId and the whole result as JSON")
	progressFlag(cmd, &f.progress)
	clientFlags(cmd, g)
	return cmd
}

// withRoot opens a root agent in the current directory for fn and closes it
// afterwards (its one-shot runs are disposed with it; continuable children
// live on).
func withRoot(ctx context.Context, s *session, fn func(root *client.Root) error) error {
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := s.cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: cwd})
	if err != nil {
		return err
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = root.Close(cctx)
	}()
	return fn(root)
}

func runOnce(s *session, f childFlags, opts protocol.StartOptions, prompt string) error {
	ctx, cancel := ctxWithSignals(s.ctx)
	defer cancel()
	return withRoot(ctx, s, func(root *client.Root) error { return runIn(ctx, s, root, f, opts, prompt) })
}

func runIn(ctx context.Context, s *session, root *client.Root, f childFlags, opts protocol.StartOptions, prompt string) error {
	show, err := wantProgress(f.progress, s)
	if err != nil {
		return err
	}
	ref := root.Ref()
	auth := protocol.Authority{Parent: &ref} // the root reads its own subtree
	var p *progress
	if show && !f.asJSON {
		if p, err = newProgress(ctx, s, root.SessionID, 1, auth); err != nil {
			return err
		}
		defer p.finish()
	}
	run, err := s.cl.StartRun(ctx, protocol.RunStartRequest{Provider: f.provider, Parent: ref, Prompt: protocol.Text(prompt), Options: opts})
	if err != nil {
		return err
	}
	if p != nil {
		p.followLog(run.ChildID, auth, nil)
	}
	if !f.asJSON {
		// stdout stays the output; the id is for `brood log` meanwhile.
		line := "child " + run.ChildID
		if run.RunID != run.ChildID {
			line += " (run " + run.RunID + ")"
		}
		if p != nil {
			p.line(0, "%s", line)
		} else {
			fmt.Fprintln(s.errOut, line)
		}
	}
	res, err := run.Result(ctx)
	if p != nil {
		p.finish() // the result goes on a clean line
	}
	if err != nil && !errors.Is(err, protocol.ErrCancelled) {
		// The deployment stayed out of reach past client.Options.OutageMax:
		// the run goes on without this command (issue 37, item 1).
		fmt.Fprintf(s.errOut, "lost the deployment while waiting; `brood result %s` tells how the run ended\n", run.ChildID)
		return err
	}
	if err != nil {
		// Interrupted: dispose the child, then report how it ended.
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		st, derr := run.Dispose(dctx)
		if derr != nil || st.Result == nil {
			return err
		}
		res = *st.Result
	}
	if f.asJSON {
		if err := printJSON(s.out, struct {
			RunID         string                  `json:"runId"`
			ChildID       string                  `json:"childId"`
			ParentSession string                  `json:"parentSession"`
			Result        protocol.SubagentResult `json:"result"`
		}{run.RunID, run.ChildID, root.SessionID, res}); err != nil {
			return err
		}
	}
	return printResult(s, "run "+run.RunID, res, f.asJSON)
}

func logCmd(g *globals) *cobra.Command {
	var asJSON, follow bool
	cmd := &cobra.Command{
		Use:   "log SESSION [--follow]",
		Short: "Print a session's header, then every event of its log in order (--follow: and new ones live)",
		Long: "Prints the session's header and every event of its log. With --follow it goes on printing each\n" +
			"event as it is logged, until the session's agent is done: a one-shot child's turn ended, or a\n" +
			"continuable child has no turn open in its log, no live activation and nothing queued (a root's\n" +
			"log: until Ctrl-C).\n" +
			"--json prints {header, events}; with --follow, one JSON object per line: {\"header\":…} first,\n" +
			"then each event. It reads through the coordinator, as the user (with a user grant).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				if follow {
					return followLog(ctx, s, args[0], auth, asJSON)
				}
				l, err := s.cl.Log(ctx, protocol.LogReadRequest{SessionID: args[0], Authority: auth})
				if err != nil {
					return err
				}
				h, events := l.Header, l.Events
				if asJSON {
					if events == nil {
						events = []protocol.SessionEvent{}
					}
					return printJSON(s.out, struct {
						Header protocol.SessionHeader  `json:"header"`
						Events []protocol.SessionEvent `json:"events"`
					}{h, events})
				}
				printHeader(s.out, h)
				for _, ev := range events {
					fmt.Fprintln(s.out, formatEvent(ev, h))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {header, events} as JSON (--follow: JSON lines)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "go on printing events as they are logged, until the session's agent is done")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}
