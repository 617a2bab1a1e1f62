package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// session is a client verb's connection and client.
type session struct {
	cl  *client.Client
	log *slog.Logger
}

func openClient(g *globals) (*session, func(), error) {
	log := newLogger(g.logLevel, slog.LevelWarn, os.Stderr)
	nc, err := connect(g.natsURL, "brood-cli", false)
	if err != nil {
		return nil, nil, err
	}
	cl, err := client.New(nc, client.Options{Prefix: g.prefix, Timeout: g.timeout})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return &session{cl: cl, log: log}, func() { cl.Close(); nc.Close() }, nil
}

// withClient runs a client verb: a connection and client for its duration,
// and a context cancelled by Ctrl-C.
func withClient(g *globals, fn func(ctx context.Context, s *session) error) error {
	s, done, err := openClient(g)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := ctxWithSignals()
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
					return printJSON(os.Stdout, r)
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PROVIDER\tINSTANCES\tOUTPUT-SCHEMA\tDEPTH-LIMIT\tTOOL-FILTER\tPERSONA\tINHERITS-CONTEXT\tCONTINUABLE\tTOOLS")
				for _, d := range r.Providers {
					c := d.Capabilities
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, r.Instances[d.Name],
						yes(c.OutputSchema), yes(c.DepthLimit), yes(c.ToolFilter), yes(c.Persona),
						yes(d.InheritsParentContext), yes(d.Continuable), strings.Join(d.Tools, ","))
				}
				if len(r.Providers) == 0 {
					fmt.Fprintln(tw, "(no live providers)")
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// runFlags are `brood run`'s options.
type runFlags struct {
	provider   string
	asJSON     bool
	schema     string
	maxDepth   int64
	allowTools string
	denyTools  string
	persona    string
}

// startOptions builds the start options from the flags the user set; an
// unset flag sends nothing, so capability checks see only what was asked.
func (f *runFlags) startOptions(cmd *cobra.Command) (protocol.StartOptions, error) {
	var o protocol.StartOptions
	fl := cmd.Flags()
	if fl.Changed("schema") {
		data, err := os.ReadFile(f.schema)
		if err != nil {
			return o, protocol.Errorf(protocol.CodeInvalidArgument, "--schema: %v", err)
		}
		v, err := agent.DecodeJSONValue(string(data))
		if err != nil {
			return o, protocol.Errorf(protocol.CodeInvalidArgument, "--schema %s is not JSON: %v", f.schema, err)
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
	if fl.Changed("persona") {
		p := f.persona
		o.Persona = &p
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
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run --provider NAME [flags] PROMPT",
		Short: "Run a one-shot child from a root opened in the current directory; prints its output",
		Long: "Opens a root agent in the current directory, starts a one-shot child on the provider, waits for\n" +
			"its result and prints the output (--json: runId, childId and the whole result). Exits 0 only\n" +
			"when the stop reason is completed. Ctrl-C disposes the child.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.provider == "" {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--provider is required")
			}
			opts, err := f.startOptions(cmd)
			if err != nil {
				return err
			}
			s, done, err := openClient(g)
			if err != nil {
				return err
			}
			defer done()
			return runOnce(s, f, opts, strings.Join(args, " "))
		},
	}
	cmd.Flags().StringVar(&f.provider, "provider", "", "provider name (see brood providers)")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print runId, childId and the whole result as JSON")
	cmd.Flags().StringVar(&f.schema, "schema", "", "JSON Schema file: the child must return structured output matching it")
	cmd.Flags().Int64Var(&f.maxDepth, "max-depth", 0, "absolute delegation depth cap for the child (0 refuses any child)")
	cmd.Flags().StringVar(&f.allowTools, "allow-tools", "", "comma-separated tools the child may use (\"\" hides every tool)")
	cmd.Flags().StringVar(&f.denyTools, "deny-tools", "", "comma-separated tools the child may not use")
	cmd.Flags().StringVar(&f.persona, "persona", "", "the child's persona, a template with {{provider}}, {{model}}, {{cwd}}")
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
	root, err := s.cl.OpenRoot(ctx, cwd)
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

func runOnce(s *session, f runFlags, opts protocol.StartOptions, prompt string) error {
	ctx, cancel := ctxWithSignals()
	defer cancel()
	return withRoot(ctx, s, func(root *client.Root) error { return runIn(ctx, s, root, f, opts, prompt) })
}

func runIn(ctx context.Context, s *session, root *client.Root, f runFlags, opts protocol.StartOptions, prompt string) error {
	run, err := s.cl.StartRun(ctx, root.Ref(), f.provider, protocol.Text(prompt), opts)
	if err != nil {
		return err
	}
	res, err := run.Result(ctx)
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
		if err := printJSON(os.Stdout, struct {
			RunID         string                  `json:"runId"`
			ChildID       string                  `json:"childId"`
			ParentSession string                  `json:"parentSession"`
			Result        protocol.SubagentResult `json:"result"`
		}{run.RunID, run.ChildID, root.SessionID, res}); err != nil {
			return err
		}
	} else {
		if text := protocol.PlainText(res.Output); text != "" {
			fmt.Println(text)
		}
		if res.Structured != nil {
			if err := json.NewEncoder(os.Stdout).Encode(res.Structured); err != nil {
				return err
			}
		}
	}
	if res.StopReason != protocol.StopCompleted {
		code := string(res.ErrorCode)
		if code == "" {
			code = strings.ToUpper(strings.ReplaceAll(string(res.StopReason), "-", "_"))
		}
		msg := fmt.Sprintf("%s: run %s ended with stopReason %s", code, run.RunID, res.StopReason)
		if res.Diagnostic != "" {
			msg += ": " + res.Diagnostic
		}
		fmt.Fprintln(os.Stderr, msg)
		return exitError{1}
	}
	return nil
}

func logCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "log SESSION",
		Short: "Print a session's header, then every event of its log in order",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				h, events, err := s.cl.Log(ctx, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					if events == nil {
						events = []protocol.SessionEvent{}
					}
					return printJSON(os.Stdout, struct {
						Header protocol.SessionHeader  `json:"header"`
						Events []protocol.SessionEvent `json:"events"`
					}{h, events})
				}
				printHeader(os.Stdout, h)
				for _, ev := range events {
					fmt.Fprintln(os.Stdout, formatEvent(ev, h))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {header, events} as JSON")
	return cmd
}
