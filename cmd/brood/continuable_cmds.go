package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// userAuthority mints a user grant: the CLI acts for the human user. With a
// NATS user (a deployment with users) the grant acts on the trees of the
// roots that user opened; with --all-users it acts on every session, which
// only a trusted host's user may mint (docs/security.md). Without a user
// (brood dev) it acts on every session. One grant serves a whole command.
func (s *session) userAuthority(ctx context.Context) (protocol.Authority, error) {
	if s.grant != "" {
		return protocol.Authority{Grant: s.grant}, nil
	}
	mint := s.cl.UserGrant
	if s.allUsers {
		mint = s.cl.GlobalGrant
	}
	g, err := mint(ctx)
	if err != nil {
		return protocol.Authority{}, err
	}
	s.grant = g.Grant
	return protocol.Authority{Grant: g.Grant}, nil
}

// userFlags registers --all-users on a verb that acts with a user grant.
func userFlags(cmd *cobra.Command, g *globals) {
	cmd.Flags().BoolVar(&g.allUsers, "all-users", false,
		"act with a grant over every user's sessions (trusted-host role); without it a user acts on the trees of the roots it opened")
}

// withUser is withClient for a verb that acts as the user: fn gets a user grant.
func withUser(g *globals, fn func(ctx context.Context, s *session, auth protocol.Authority) error) error {
	return withClient(g, func(ctx context.Context, s *session) error {
		auth, err := s.userAuthority(ctx)
		if err != nil {
			return err
		}
		return fn(ctx, s, auth)
	})
}

func startCmd(g *globals) *cobra.Command {
	var f childFlags
	var ps promptSource
	var label, childID string
	cmd := &cobra.Command{
		Use:   "start --provider NAME [--label L] [flags] (PROMPT | - | --prompt-file FILE)",
		Short: "Start a continuable (background) child from a root opened in the current directory; prints childId",
		Long: "Starts a continuable child and returns at once: the child works in the background, its session\n" +
			"outlives the command, and `brood followup CHILD MESSAGE` sends it more turns later, even after\n" +
			"every process restarted. `brood state CHILD` and `brood result CHILD` tell how it is doing and\n" +
			"what it answered. The root opened for the start is closed when the command ends; the child lives on.\n" +
			"The prompt is the words after the flags, or read from stdin (\"-\") or --prompt-file; it must be UTF-8.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := f.startOptions(cmd)
			if err != nil {
				return err
			}
			prompt, err := ps.read(cmd, args, "prompt")
			if err != nil {
				return err
			}
			if label == "" {
				label = firstWords(prompt, 5)
			}
			return withClient(g, func(ctx context.Context, s *session) error {
				return withRoot(ctx, s, func(root *client.Root) error {
					r, err := s.cl.StartContinuable(ctx, protocol.ContinuableStartRequest{
						Provider: f.provider, Parent: root.Ref(), Label: label, ChildID: childID, Prompt: protocol.Text(prompt),
						Options: protocol.ContinuableOptions{MaxDepth: o.MaxDepth, ToolFilter: o.ToolFilter, Persona: o.Persona, AutoApprove: o.AutoApprove, ApproveTools: o.ApproveTools,
							Model: o.Model, Limits: o.Limits, RequestTimeoutMs: o.RequestTimeoutMs, Budget: o.Budget},
					})
					if err != nil {
						return err
					}
					if f.asJSON {
						return printJSON(s.out, struct {
							protocol.ContinuableStartReply
							ParentSession string `json:"parentSession"`
						}{r, root.SessionID})
					}
					fmt.Fprintf(s.out, "childId %s\nmessageId %s\nparentSession %s\n", r.ChildID, r.MessageID, root.SessionID)
					if r.State == protocol.StateQueued {
						// The parent is at its live-children limit: the child
						// starts once one of the parent's children ends
						// (docs/protocol.md §5.5, "The start queue").
						fmt.Fprintf(s.out, "state %s\n", r.State)
					}
					return nil
				})
			})
		},
	}
	f.register(cmd, false)
	ps.register(cmd, "prompt")
	cmd.Flags().StringVar(&label, "label", "", "a short label for the child (default: the prompt's first words)")
	cmd.Flags().StringVar(&childID, "child-id", "", "reserve this child id (^[A-Za-z0-9_-]{1,64}$; an id ever used is DUPLICATE_CHILD)")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print JSON")
	clientFlags(cmd, g)
	return cmd
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	return strings.Join(f, " ")
}

func followupCmd(g *globals) *cobra.Command {
	var key, progressMode string
	var asJSON, wait bool
	var ps promptSource
	cmd := &cobra.Command{
		Use:   "followup CHILD (MESSAGE | - | --prompt-file FILE) [--wait]",
		Short: "Send a continuable child its next turn, as the user (with a user grant); prints messageId (--wait: the turn's answer)",
		Long: "Queues MESSAGE as the child's next turn. A child with no live activation is resumed on a live\n" +
			"host of its provider. While a drain holds admission closed the message is accepted and waits\n" +
			"(it runs once `brood drain --lift` reopens admission); the answer says so.\n" +
			"--wait waits for the turn that runs MESSAGE and prints its answer, as `brood result` would (the\n" +
			"messageId goes to stderr); on a terminal it shows the turn's tool calls and descendants meanwhile.\n" +
			"It exits 1 with the code first on stderr when that turn did not complete.\n" +
			"MESSAGE is the words after CHILD, or read from stdin (\"-\") or --prompt-file; it must be UTF-8.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			msg, err := ps.read(cmd, args[1:], "message")
			if err != nil {
				return err
			}
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				req := protocol.FollowupRequest{
					ChildID: args[0], Authority: auth, Message: protocol.Text(msg), IdempotencyKey: key,
				}
				if wait {
					return followupWait(ctx, s, req, progressMode, asJSON)
				}
				r, err := s.cl.Followup(ctx, req)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, r)
				}
				fmt.Fprintf(s.out, "messageId %s\n", r.MessageID)
				if r.Held != "" {
					fmt.Fprintf(s.errOut, "held: %s\n", r.Held)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&key, "idempotency-key", "", "a retry with the same key within 2 minutes is accepted once")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (--wait: {childId, state, turn, stopReason, output})")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the turn that runs the message and print its answer")
	ps.register(cmd, "message")
	progressFlag(cmd, &progressMode)
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// followupWait sends a followup and waits for the turn that claims it (the
// agent/inbox/dequeue naming its messageId), showing its progress, then
// prints that turn's answer.
func followupWait(ctx context.Context, s *session, req protocol.FollowupRequest, mode string, asJSON bool) error {
	show, err := wantProgress(mode, s)
	if err != nil {
		return err
	}
	var p *progress
	if show && !asJSON {
		if p, err = newProgress(ctx, s, req.ChildID, 0, req.Authority); err != nil {
			return err
		}
		defer p.finish()
		p.watchChild(req.ChildID)
	}
	r, err := s.cl.Followup(ctx, req)
	if err != nil {
		return err
	}
	say := func(format string, args ...any) {
		if p != nil {
			p.line(0, format, args...)
		} else if !asJSON {
			fmt.Fprintf(s.errOut, format+"\n", args...)
		}
	}
	say("messageId %s", r.MessageID)
	if r.Held != "" {
		say("held: %s (it runs once the drain is lifted)", r.Held)
	}
	res, err := waitTurn(ctx, s, req.ChildID, req.Authority, r.MessageID, p)
	if p != nil {
		p.finish()
	}
	if err != nil {
		return err
	}
	if st, err := s.cl.State(ctx, protocol.ChildRef{ChildID: req.ChildID, Authority: req.Authority}); err == nil {
		res.State = st.State
	}
	return printChildResult(s, res, asJSON)
}

// waitTurn reads the child's log until the turn that claimed messageID
// ended, and returns that turn's result. Tool calls of that turn go to p
// (when set) as they are logged.
func waitTurn(ctx context.Context, s *session, child string, auth protocol.Authority, messageID string, p *progress) (childResult, error) {
	req := protocol.LogReadRequest{SessionID: child, Authority: auth, WaitMs: 10_000}
	var turn []protocol.SessionEvent // since the last turn/start
	ours := false
	for {
		// A long poll is safe to ask again: a broker restart or the serving
		// coordinator's death goes on through whichever answers next.
		var page protocol.LogPage
		err := s.cl.Retrying(ctx, "waiting for the turn of "+messageID, func(ctx context.Context) (err error) {
			page, err = s.cl.LogPage(ctx, req)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return childResult{}, protocol.Errorf(protocol.CodeCancelled, "waiting for the turn of %s: %w", messageID, ctx.Err())
			}
			return childResult{}, err
		}
		for _, ev := range page.Events {
			switch ev.Type {
			case protocol.EvTurnStart:
				turn, ours = turn[:0], false
			case protocol.EvInboxDequeue:
				var d protocol.InboxDequeueData
				if ev.Decode(&d) == nil && d.MessageID == messageID {
					ours = true
				}
			}
			turn = append(turn, ev)
			if !ours {
				continue
			}
			if p != nil {
				p.onEvent(ev)
			}
			if ev.Type == protocol.EvTurnEnd {
				return turnResult(child, turn)
			}
		}
		req.FromSeq, req.Cursor = page.NextSeq, page.Cursor
	}
}

func stateCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "state CHILD",
		Short: "Print a continuable child's residency: running, paused, waiting, or none",
		Long: "running: an activation is working or ready for its next turn; paused: its turn waits at its\n" +
			"budget's cap for a raise (`brood budget CHILD --raise tokens=+100k`); waiting: it owns live children\n" +
			"and cannot settle yet; none: no live activation (a followup resumes it). An unknown id is\n" +
			"NOT_FOUND; a one-shot child has no residency (`brood result` tells how it ended).\n" +
			"A running turn paused to retry a model request that failed temporarily (a 429, a 5xx, a\n" +
			"connection reset) adds a line on stderr: the failed attempt, its error and the next attempt.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				st, err := s.cl.State(ctx, protocol.ChildRef{ChildID: args[0], Authority: auth})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, st)
				}
				fmt.Fprintln(s.out, st.State)
				if r := st.ModelRetry; r != nil {
					fmt.Fprintln(s.errOut, modelRetryNote(*r))
				}
				if p := st.BudgetPause; p != nil {
					fmt.Fprintf(s.errOut, "turn %d paused at its budget's cap on request %s; raise it: %s\n", p.Turn, p.RequestID, raiseHint(ctx, s, auth, st.ChildID))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {childId, state, hostId?, runId?, queued?, modelRetry?, budgetPause?} as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

func childrenCmd(g *globals) *cobra.Command {
	var descendants, asJSON bool
	cmd := &cobra.Command{
		Use:   "children [PARENT] [--descendants]",
		Short: "List a parent's children (without PARENT: every live continuable activation)",
		Long: "Rows are in creation order (createdAt, then id), a subtree in pre-order. Without PARENT the\n" +
			"list is every continuable child with a live activation, whoever its parent.\n" +
			"DEPTH counts from PARENT (its children are 1, theirs 2); without PARENT it counts from the\n" +
			"child's root (a root's children are 1). TOKENS and REQUESTS are own/subtree (model requests).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				req := protocol.ChildrenListRequest{Authority: auth, Descendants: descendants}
				if len(args) == 1 {
					req.Parent = args[0]
				}
				list, err := s.cl.Children(ctx, req)
				if err != nil {
					return err
				}
				rows := list.Rows
				for i := range rows {
					if rows[i].ParentID == "" && req.Parent != "" {
						rows[i].ParentID, rows[i].Depth = req.Parent, 1
					}
				}
				if asJSON {
					if rows == nil {
						rows = []protocol.ChildRow{}
					}
					return printJSON(s.out, rows)
				}
				tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CHILD\tKIND\tMODE\tSTATE\tPROVIDER\tLABEL\tPARENT\tDEPTH\tTOKENS\tREQUESTS")
				for _, r := range rows {
					kind, label := r.Kind, r.Label
					if r.Kind == protocol.RowDiagnostic {
						kind, label = "diagnostic", r.Reason
					}
					tokens, requests := usageCells(r.Usage)
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, kind, dash(r.Mode), dash(r.State), dash(r.Provider), dash(clipLabel(label)), dash(r.ParentID), r.Depth, tokens, requests)
				}
				if len(rows) == 0 {
					fmt.Fprintln(tw, "(no children)")
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&descendants, "descendants", false, "every descendant, in pre-order, with parent and depth")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// dash shows an absent value in a table as "-", so a column is never blank.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clipLabel keeps a table row on one line.
func clipLabel(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if r := []rune(s); len(r) > 40 {
		return string(r[:39]) + "…"
	}
	return s
}

func interruptCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "interrupt CHILD",
		Short: "Stop a continuable child's current turn; its queued messages wait for the next followup",
		Long: "Stops the child's current turn only (it ends `aborted (user)`); the activation stays, and its\n" +
			"queued messages stay parked until the next `brood followup`. A child with no live activation\n" +
			"has nothing to stop (exit 0, and it says so); an unknown id is NOT_FOUND.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				r, err := s.cl.Interrupt(ctx, protocol.InterruptRequest{ChildID: args[0], Authority: auth})
				if err != nil {
					return err
				}
				if !r.Interrupted {
					// Say why: an unknown id or a one-shot child is an error.
					if _, err := s.cl.State(ctx, protocol.ChildRef{ChildID: args[0], Authority: auth}); err != nil {
						return err
					}
				}
				if asJSON {
					return printJSON(s.out, r)
				}
				if r.Interrupted {
					fmt.Fprintf(s.out, "interrupted %s: its turn stops; queued messages wait for the next followup\n", args[0])
				} else {
					fmt.Fprintf(s.out, "%s has no live activation: nothing to interrupt\n", args[0])
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {childId, interrupted} as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

func disposeCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "dispose ID",
		Short: "End a child: a one-shot run settles aborted; a continuable child's activation (and its subtree's) ends",
		Long: "ID is a one-shot run (or child) id: the run is cancelled and settles `aborted` with its partial\n" +
			"output, printed like `brood run` prints a result. Or ID is a continuable child: its activation and\n" +
			"those of its descendants end, child first (their turns end `aborted (disposed)`); the session stays,\n" +
			"and a later followup resumes it. Messages already queued are never dropped: a child that has some\n" +
			"is resumed to run them (hold them with `brood drain --parent PARENT` first). Idempotent.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				id := args[0]
				st, err := s.cl.Dispose(ctx, protocol.RunRef{RunID: id, Grant: auth.Grant})
				if err == nil {
					return printRunStatus(s, st, asJSON, false)
				}
				// Not a one-shot run: a continuable child. A grant over every
				// session learns NOT_FOUND; a user's grant is told
				// UNAUTHORIZED for a run id it does not know (authority
				// before existence), which a child id of its own tree is.
				if !errors.Is(err, protocol.ErrNotFound) && (s.allUsers || !errors.Is(err, protocol.ErrUnauthorized)) {
					return err
				}
				r, err := s.cl.Drain(ctx, protocol.DrainRequest{Authority: auth, Children: []string{id}})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, struct {
						ChildID string `json:"childId"`
						protocol.DrainReply
					}{id, r})
				}
				if len(r.Disposed) == 0 {
					fmt.Fprintf(s.out, "%s has no live activation: nothing to dispose\n", id)
					return nil
				}
				fmt.Fprintf(s.out, "disposed %s, child first:\n", plural(len(r.Disposed), "activation"))
				for _, d := range r.Disposed {
					fmt.Fprintln(s.out, d)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: the run's status, or {childId, disposed}")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// printRunStatus prints a one-shot run's status like `brood run` prints its
// result. judge: a settled run that did not complete exits 1 with its code
// (brood result); otherwise how it ended goes to stderr (brood dispose, whose
// success is the run's end).
func printRunStatus(s *session, st protocol.RunStatus, asJSON, judge bool) error {
	if asJSON {
		if err := printJSON(s.out, st); err != nil {
			return err
		}
	}
	if st.Result == nil {
		if !asJSON {
			fmt.Fprintf(s.errOut, "run %s (child %s) is %s\n", st.RunID, st.ChildID, st.State)
		}
		return nil
	}
	if !judge {
		if !asJSON {
			if text := protocol.PlainText(st.Result.Output); text != "" {
				fmt.Fprintln(s.out, text)
			}
			fmt.Fprintf(s.errOut, "run %s (child %s) settled: stopReason %s%s\n", st.RunID, st.ChildID, st.Result.StopReason, settledWhy(*st.Result))
		}
		return nil
	}
	return printResult(s, "run "+st.RunID, *st.Result, asJSON)
}

// settledWhy is what a settled run's status line adds to its stop reason:
// its code and diagnostic when it has a code (" (CANCELLED): the child was
// never started: …" for a start disposed in its parent's queue), else
// nothing.
func settledWhy(res protocol.SubagentResult) string {
	if res.ErrorCode == "" {
		return ""
	}
	if res.Diagnostic == "" {
		return " (" + string(res.ErrorCode) + ")"
	}
	return " (" + string(res.ErrorCode) + "): " + res.Diagnostic
}

// printResult prints a result's output (and structured value) unless asJSON,
// then its usage line on stderr, and returns exit status 1 with a last
// stderr line that starts with the code when the stop reason is not
// completed.
func printResult(s *session, what string, res protocol.SubagentResult, asJSON bool) error {
	if !asJSON {
		if text := protocol.PlainText(res.Output); text != "" {
			fmt.Fprintln(s.out, text)
			// The output rule skips an empty last message (issue 14): say so.
			if f := res.OutputFrom; f != nil && !f.Last {
				fmt.Fprintf(s.errOut, "note: the output above is the child's message of turn %d, step %d; its last message was empty\n", f.Turn, f.Step)
			}
		}
		if res.Structured != nil {
			if err := printJSONLine(s.out, res.Structured); err != nil {
				return err
			}
		}
		// After the output and its notes, before the code: the last line
		// of stderr of a run that did not complete starts with its code
		// (README: "otherwise the last line of stderr starts with the code").
		if line := usageLine(res.Usage); line != "" {
			fmt.Fprintln(s.errOut, line)
		}
	}
	if res.StopReason == protocol.StopCompleted {
		return nil
	}
	code := string(res.ErrorCode)
	if code == "" {
		code = strings.ToUpper(strings.ReplaceAll(string(res.StopReason), "-", "_"))
	}
	msg := fmt.Sprintf("%s: %s ended with stopReason %s", code, what, res.StopReason)
	if res.Diagnostic != "" {
		msg += ": " + res.Diagnostic
	}
	fmt.Fprintln(s.errOut, msg)
	return exitError{1}
}

func grantCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "grant [--all-users]",
		Short: "Mint a user grant (authority.user) for acting on children by hand, e.g. with nats req",
		Long: "Prints a user grant: a token that acts for the human user on continuable children (followup,\n" +
			"state, interrupt, drain, children.list), one-shot runs (runs.await, runs.dispose) and the reads.\n" +
			"Put it in a request as {\"authority\": {\"grant\": \"...\"}} (runs: {\"grant\": \"...\"}). With a\n" +
			"NATS user it acts on the trees of the roots that user opened; --all-users mints one over every\n" +
			"session, which only a trusted host's user may (docs/security.md). It expires after 24 hours by default.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				mint := s.cl.UserGrant
				if s.allUsers {
					mint = s.cl.GlobalGrant
				}
				r, err := mint(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, r)
				}
				scope := "every user's sessions"
				if r.User != "" {
					scope = "the trees of the roots user " + r.User + " opened"
				}
				fmt.Fprintf(s.out, "grant %s\nexpiresAt %s\nscope %s\n", r.Grant, time.UnixMilli(r.ExpiresAt).UTC().Format(time.RFC3339), scope)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {grant, expiresAt, user?} as JSON (expiresAt in epoch ms; user: the grant's scope)")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// plural is "1 activation", "2 activations".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func drainCmd(g *globals) *cobra.Command {
	var parents []string
	var lift, list, asJSON bool
	cmd := &cobra.Command{
		Use:   "drain [--parent ID ...] | --lift [--parent ID ...] | --list",
		Short: "Close admission and end continuable activations child-first; --lift reopens, --list shows drains",
		Long: "Without --parent: every activation, and admission to continuable children stays closed until\n" +
			"`brood drain --lift`. With --parent: the descendants of each parent (closed while that parent\n" +
			"stays live, or until lifted). Sessions stay, and no accepted message is dropped: queued messages,\n" +
			"and followups sent meanwhile, wait and run once admission reopens. New children are refused\n" +
			"(DRAINING). Turns ended by a drain are logged `aborted (drain)`.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Every drain, its lift and the list act on the whole
			// deployment: they need a grant over every session (the
			// trusted-host role), with or without --all-users.
			g.allUsers = true
			if list && (lift || len(parents) > 0) {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--list takes no other flag")
			}
			s, done, err := openClient(g)
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			auth, err := s.userAuthority(ctx)
			if err != nil {
				return err
			}
			if list {
				r, err := s.cl.Drains(ctx, protocol.DrainsListRequest{Authority: auth})
				if err != nil {
					return err
				}
				return printDrains(s, r, asJSON)
			}
			r, err := s.cl.Drain(ctx, protocol.DrainRequest{Authority: auth, Parents: parents, Lift: lift})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(s.out, r)
			}
			if lift {
				fmt.Fprintln(s.out, "drain lifted: admission is open again; queued messages run now")
				return nil
			}
			fmt.Fprintf(s.out, "drained %s; admission stays closed until `brood drain --lift`\n", plural(len(r.Disposed), "activation"))
			for _, id := range r.Disposed {
				fmt.Fprintln(s.out, id)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&parents, "parent", nil, "drain only the descendants of this parent (repeatable)")
	cmd.Flags().BoolVar(&lift, "lift", false, "reopen admission closed by an earlier drain (of the same --parent scope, or global)")
	cmd.Flags().BoolVar(&list, "list", false, "list the drains holding admission closed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

func printDrains(s *session, r protocol.DrainsListReply, asJSON bool) error {
	if asJSON {
		return printJSON(s.out, r)
	}
	tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tSINCE\tHOLDS")
	for _, d := range r.Drains {
		since := "-"
		if d.CreatedAt > 0 {
			since = time.UnixMilli(d.CreatedAt).UTC().Format(time.RFC3339)
		}
		scope := "every activation"
		if d.Root != "" {
			scope = "descendants of " + d.Root
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", scope, since, d.Holds)
	}
	if len(r.Drains) == 0 {
		fmt.Fprintln(tw, "(no drains: admission is open)")
	}
	return tw.Flush()
}

func watchCmd(g *globals) *cobra.Command {
	var asJSON bool
	var count int
	var mode string
	cmd := &cobra.Command{
		Use:   "watch [PARENT]",
		Short: "Draw the live tree of a parent's subtree (every root without PARENT); piped, print each lifecycle event; Ctrl-C stops",
		Long: "On a terminal, draws the live delegation tree (each session with provider, state, stop reason and\n" +
			"duration; the last 24 hours, then live) and redraws it in place as lifecycle events arrive; a child\n" +
			"paused at its budget's cap is drawn paused (its pending budget requests are listed every 2 s). Piped\n" +
			"(or with --json, --count N or --tree never) it prints one line per event from now on, indented by depth.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				root := ""
				if len(args) == 1 {
					root = args[0]
				}
				if count < 0 {
					return protocol.Errorf(protocol.CodeInvalidArgument, "--count must not be negative")
				}
				draw := false
				switch mode {
				case treeAlways:
					draw = true
				case treeAuto, "":
					draw = isTerminal(s.out) && count == 0
				case treeNever:
				default:
					return protocol.Errorf(protocol.CodeInvalidArgument, "--tree %q must be auto, always or never", mode)
				}
				if draw && !asJSON {
					auth, err := s.userAuthority(ctx)
					if err != nil {
						return err
					}
					return watchTree(ctx, s, root, auth)
				}
				return watch(ctx, s, root, asJSON, count)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as a JSON line")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many events (0: until Ctrl-C)")
	cmd.Flags().StringVar(&mode, "tree", treeAuto, "draw the tree: auto (on a terminal), always, never (one line per event)")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// watch follows lifecycle events from now on through the coordinator
// (events.follow, as the user): the subtree of root, or every parent when
// root is "". A child seen starting under a watched parent is indented below
// it, so grandchildren show as a tree.
func watch(ctx context.Context, s *session, root string, asJSON bool, count int) error {
	auth, err := s.userAuthority(ctx)
	if err != nil {
		return err
	}
	f, err := s.cl.Follow(ctx, protocol.EventsFollowRequest{Parent: root, Descendants: root != "", Authority: auth})
	if err != nil {
		return err
	}
	defer f.Close()
	depth := map[string]int{}
	if root != "" {
		depth[root] = 0
		fmt.Fprintf(s.errOut, "watching the subtree of %s (Ctrl-C stops)\n", root)
	} else {
		fmt.Fprintln(s.errOut, "watching every parent (Ctrl-C stops)")
	}
	for seen := 0; count == 0 || seen < count; seen++ {
		ev, err := f.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		d := depth[ev.ParentSession]
		if ev.Type == protocol.LifecycleStart {
			depth[ev.ID] = d + 1
		}
		if asJSON {
			_ = printJSONLine(s.out, ev)
			continue
		}
		line := fmt.Sprintf("%s%s %s %s (%s, run %s)", strings.Repeat("  ", d), time.UnixMilli(ev.Time).UTC().Format("15:04:05.000"),
			ev.Type, ev.ID, ev.Provider, ev.RunID)
		if ev.Type == protocol.LifecycleEnd {
			line += " → " + string(ev.StopReason)
			if ev.ErrorCode != "" {
				line += " " + string(ev.ErrorCode)
			}
			if t := protocol.PlainText(ev.LastAssistantMessage); t != "" {
				line += ": " + clip(t)
			}
		}
		if root == "" && d == 0 {
			line += " [parent " + ev.ParentSession + "]"
		}
		fmt.Fprintln(s.out, line)
	}
	return nil
}

func printJSONLine(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func inboxCmd(g *globals) *cobra.Command {
	var ack, asJSON bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "inbox SESSION [--wait D] [--ack]",
		Short: "Show a root's inbox: the settlement notices and reports of its background children",
		Long: "Prints every pending item of a session's inbox, oldest first: the settlement notices and reports\n" +
			"that a root's continuable children sent it while it was live (a root's client reads them;\n" +
			"nothing else consumes them). --wait waits up to that long (at most 60s) for a first item;\n" +
			"--ack deletes the items shown (a root's inbox only: a child's items are claimed by its own\n" +
			"activation). It reads through the coordinator, as the user (with a user grant).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				items, err := readInbox(ctx, s, args[0], auth, wait)
				if err != nil {
					return err
				}
				if asJSON {
					if err := printJSON(s.out, items); err != nil {
						return err
					}
				} else {
					printInbox(s.out, items)
				}
				if !ack || len(items) == 0 {
					return nil
				}
				for start := 0; start < len(items); start += protocol.InboxAckSeqsMax {
					end := min(start+protocol.InboxAckSeqsMax, len(items))
					seqs := make([]protocol.Seq, 0, end-start)
					for _, it := range items[start:end] {
						seqs = append(seqs, it.Seq)
					}
					if _, err := s.cl.Ack(ctx, protocol.InboxAckRequest{SessionID: args[0], Authority: auth, Seqs: seqs}); err != nil {
						return err
					}
				}
				fmt.Fprintf(s.errOut, "acknowledged %s\n", plural(len(items), "item"))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&ack, "ack", false, "delete the items shown from the inbox (a root's inbox only)")
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for an item when the inbox is empty (at most 60s)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the items as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// readInbox reads every pending item of a session's inbox, page by page.
func readInbox(ctx context.Context, s *session, id string, auth protocol.Authority, wait time.Duration) ([]protocol.InboxItem, error) {
	items := []protocol.InboxItem{}
	req := protocol.InboxReadRequest{SessionID: id, Authority: auth, WaitMs: wait.Milliseconds()}
	for {
		page, err := s.cl.Inbox(ctx, req)
		if err != nil {
			return nil, err
		}
		items = append(items, page.Items...)
		if !page.More || len(page.Items) == 0 {
			return items, nil
		}
		req.AfterSeq, req.WaitMs = page.Items[len(page.Items)-1].Seq, 0
	}
}

func printInbox(w io.Writer, items []protocol.InboxItem) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tMESSAGE\tKIND\tFROM\tDELIVERY\tTEXT")
	for _, it := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", it.Seq, it.MessageID, it.Source.Kind, dash(it.Source.SenderSessionID), it.Delivery, clip(protocol.AllText(it.Content)))
	}
	if len(items) == 0 {
		fmt.Fprintln(tw, "(inbox empty)")
	}
	_ = tw.Flush()
}

// modelRetryNote is brood state's line for a turn paused on a model retry:
// "paused: model attempt 2 of turn 1 step 3 failed (HTTP 429 ...); next
// attempt at 15:04:05".
func modelRetryNote(r protocol.ModelRetryData) string {
	next := time.UnixMilli(r.NextAt).Format(time.TimeOnly)
	return fmt.Sprintf("paused: model attempt %d of turn %d step %d failed (%s); next attempt at %s", r.Attempt, r.Turn, r.Step, r.Diagnostic, next)
}
