package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/protocol"
)

// requestsWaitPoll is how often `brood requests --wait` looks again.
const requestsWaitPoll = 500 * time.Millisecond

func requestsCmd(g *globals) *cobra.Command {
	var wait, all, asJSON bool
	cmd := &cobra.Command{
		Use:   "requests [SESSION] [--wait] [--all]",
		Short: "List the requests for approval and the questions you may answer (pending ones; of SESSION's subtree when given)",
		Long: "A child that calls a tool needing approval (write_file, edit_file, run_command, unless its start\n" +
			"allowed it with --auto-approve) parks the call on a request until it is answered with\n" +
			"`brood approve ID` or `brood deny ID --reason …`, or its deadline passes (a denial by timeout).\n" +
			"A child that calls ask parks on a question (TOOL ask, its text and [choices] as ARGUMENTS) until\n" +
			"`brood answer ID TEXT` or `brood answer ID --json FILE` answers it, or its deadline passes.\n" +
			"A continuable child at its budget's cap pauses on a request of TOOL (budget), the refusal as\n" +
			"ARGUMENTS: `brood budget CHILD --raise tokens=+N` raises it and the turn goes on; `brood deny ID`\n" +
			"ends the turn BUDGET_EXHAUSTED.\n" +
			"A request whose asking turn ended first (its run disposed, the child interrupted) is cancelled.\n" +
			"HANDLER is who it waits on: the ancestor agent told of it (after answer_request pass_up, the one\n" +
			"it was passed up to), or user; you may answer it either way.\n" +
			"--wait waits until at least one is pending, up to --timeout in all: then it exits 1 with\n" +
			"CANCELLED first on stderr and lists nothing. --all lists answered ones too.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				req := protocol.RequestsListRequest{Authority: auth, All: all}
				if len(args) == 1 {
					req.Under = args[0]
				}
				l, err := listRequests(ctx, s, req, wait, g.timeout)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, l.Requests)
				}
				tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "REQUEST\tSESSION\tSTATE\tHANDLER\tTOOL\tARGUMENTS\tDEADLINE")
				for _, r := range l.Requests {
					tool, what := requestWhat(r)
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.SessionID, r.State, requestHandler(r), tool, what,
						time.UnixMilli(r.Deadline).UTC().Format(time.RFC3339))
				}
				if len(l.Requests) == 0 {
					fmt.Fprintln(tw, "(no requests)")
				}
				if l.More {
					fmt.Fprintf(tw, "(more not listed: the limit is %d)\n", protocol.RequestsListMax)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until at least one request is pending (up to --timeout; then exit 1, CANCELLED)")
	cmd.Flags().BoolVar(&all, "all", false, "list answered, timed-out and cancelled (their turn ended) requests too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// requestWhat is what a request's TOOL and ARGUMENTS columns show: the
// call asked about, or for a question the ask tool and the question, its
// choices in brackets ([JSON] when the answer is JSON its schema accepts),
// or for a budget pause "(budget)" and whose budget and which limit:
// "budget of ID: its tokens limit of 12 tokens is reached (12 used)"
// (raise it with brood budget ID --raise).
func requestWhat(r protocol.RequestRecord) (tool, what string) {
	if r.Kind == protocol.RequestBudget {
		return "(budget)", budgetPauseWhat(r)
	}
	if r.Kind != protocol.RequestQuestion {
		return dash(r.Tool), dash(clipLabel(r.Arguments))
	}
	what = clipLabel(r.Question)
	switch {
	case len(r.Choices) > 0:
		what += " [" + clipLabel(strings.Join(r.Choices, " | ")) + "]"
	case r.AnswerSchema != "":
		what += " [JSON]"
	}
	return agentAskTool, what
}

// budgetPauseWhat is a budget pause's ARGUMENTS column: the ledger that
// refused and what its refusal said of the limit, without the ledger's id
// again or the catalogue's hint, at most budgetWhatRunesMax runes.
func budgetPauseWhat(r protocol.RequestRecord) string {
	limit := r.Exhausted
	if _, rest, ok := strings.Cut(limit, " is spent: "); ok {
		limit = rest
	} else if _, rest, ok := strings.Cut(limit, " is short: "); ok {
		limit = rest
	}
	limit, _, _ = strings.Cut(limit, "; nothing more was started")
	what := "budget of " + dash(r.BudgetOf)
	if limit = strings.TrimSpace(strings.ReplaceAll(limit, "\n", " ")); limit != "" {
		what += ": " + limit
	}
	if rs := []rune(what); len(rs) > budgetWhatRunesMax {
		what = string(rs[:budgetWhatRunesMax-1]) + "…"
	}
	return what
}

// budgetWhatRunesMax bounds a budget pause's ARGUMENTS column, in runes:
// a ledger's id (26) and a limit's words fit.
const budgetWhatRunesMax = 160

// requestHandler is what a request's HANDLER column shows: while it is
// pending, the ancestor agent told of it (after a pass_up, the one it was
// passed to), or "user" when it waits on the user; "-" once it is not.
func requestHandler(r protocol.RequestRecord) string {
	switch {
	case r.State != protocol.RequestPending:
		return "-"
	case r.Handler == "":
		return "user"
	}
	return r.Handler
}

// agentAskTool is the name of the built-in agents' ask tool.
const agentAskTool = "ask"

// listRequests lists the requests of req; with wait, until one is pending,
// looking again every requestsWaitPoll for at most timeout in all (the
// --timeout that bounds each coordinator request bounds the whole wait
// too): past it, CANCELLED saying nothing became pending.
func listRequests(ctx context.Context, s *session, req protocol.RequestsListRequest, wait bool, timeout time.Duration) (protocol.RequestsListReply, error) {
	if !wait {
		return s.cl.Requests(ctx, req)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	expired := func() error {
		return protocol.Errorf(protocol.CodeCancelled, "no request became pending within %s (--timeout); nothing was listed", timeout)
	}
	for {
		l, err := s.cl.Requests(ctx, req)
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			if err == nil && hasPending(l.Requests) {
				return l, nil
			}
			return l, expired()
		case err != nil || hasPending(l.Requests):
			return l, err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return l, expired()
			}
			return l, ctx.Err()
		case <-time.After(requestsWaitPoll):
		}
	}
}

func hasPending(rs []protocol.RequestRecord) bool {
	for _, r := range rs {
		if r.State == protocol.RequestPending {
			return true
		}
	}
	return false
}

func approveCmd(g *globals) *cobra.Command {
	return answerCmd(g, protocol.AnswerApprove, "approve ID", "Approve a pending request: the parked tool call runs and the child's turn goes on")
}

func denyCmd(g *globals) *cobra.Command {
	return answerCmd(g, protocol.AnswerDeny, "deny ID [--reason TEXT]", "Deny a pending request: the parked tool call gets the denial (and the reason) as its result")
}

// answerCmd answers a request. A request answered before (or timed out)
// is ALREADY_ANSWERED: the first answer decided it.
func answerCmd(g *globals, answer, use, short string) *cobra.Command {
	var reason string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + ".\nOnly the first answer counts: a later one is ALREADY_ANSWERED. The grant this command acts with\n" +
			"must cover the asking child's tree (its user's, or every user's).\n" +
			"A budget pause (TOOL (budget) in brood requests) is raised with `brood budget CHILD --raise`;\n" +
			"denied, its turn ends BUDGET_EXHAUSTED; approved without a raise, it reserves again and pauses\n" +
			"again unless room was made.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				r, err := s.cl.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: args[0], Authority: auth, Answer: answer, Reason: reason})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, r)
				}
				fmt.Fprintln(s.out, answeredLine(r))
				return nil
			})
		},
	}
	if answer == protocol.AnswerDeny {
		cmd.Flags().StringVar(&reason, "reason", "", "why, shown to the child (at most 4096 bytes)")
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answered record as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// answeredLine is what approve and deny print: the request, its new
// state and what it decided, the call (its tool and arguments) or, for a
// budget pause (docs/protocol.md §5.5, "Pause and raise"), what its turn
// does now: denied, it ends BUDGET_EXHAUSTED; approved, it reserves again
// with no raise (a raise is brood budget BUDGETOF --raise).
func answeredLine(r protocol.RequestRecord) string {
	if r.Kind != protocol.RequestBudget {
		return fmt.Sprintf("%s %s: %s of %s in %s", r.ID, r.State, dash(r.Tool), dash(clipLabel(r.Arguments)), r.SessionID)
	}
	then := "its turn ends BUDGET_EXHAUSTED"
	if r.State == protocol.RequestApproved {
		then = fmt.Sprintf("its turn reserves again with nothing raised, and pauses again unless room was made (raise: brood budget %s --raise tokens=+N)", dash(r.BudgetOf))
	}
	return fmt.Sprintf("%s %s: the budget pause of %s; %s", r.ID, r.State, r.SessionID, then)
}

// answerReadBytesMax bounds what `brood answer --json` reads: the
// coordinator's bound (protocol.RequestAnswerBytesMax) and one byte more,
// so a longer answer is refused rather than cut.
const answerReadBytesMax = protocol.RequestAnswerBytesMax + 1

// answerQuestionCmd answers a question a child asked with its ask tool:
// with TEXT (the words after ID, joined by spaces; one of the question's
// choices when it has some) or with the JSON of --json FILE ("-": stdin),
// which its answerSchema, when it has one, must accept. A bad answer is
// INVALID_ARGUMENT and the question stays pending; a question answered
// before (or timed out) is ALREADY_ANSWERED.
func answerQuestionCmd(g *globals) *cobra.Command {
	var jsonFile string
	cmd := &cobra.Command{
		Use:   "answer ID TEXT | answer ID --json FILE",
		Short: "Answer a pending question a child asked with its ask tool: the answer becomes the ask call's result",
		Long: "Answer a pending question: TEXT (the words after ID, joined by spaces) must be one of the question's\n" +
			"choices when it has some; --json FILE (\"-\": stdin) answers with JSON, which the question's\n" +
			"answerSchema must accept when it has one. A bad answer is INVALID_ARGUMENT and leaves the question\n" +
			"pending. Only the first answer counts: a later one is ALREADY_ANSWERED. The grant this command acts\n" +
			"with must cover the asking child's tree (its user's, or every user's).",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := protocol.RequestAnswerRequest{RequestID: args[0], Answer: protocol.AnswerAnswer}
			switch {
			case jsonFile != "" && len(args) > 1:
				return protocol.Errorf(protocol.CodeInvalidArgument, "give the answer either as TEXT or with --json FILE, not both")
			case jsonFile == "" && len(args) == 1:
				return protocol.Errorf(protocol.CodeInvalidArgument, "no answer: give TEXT after the request id, or --json FILE (\"-\": stdin)")
			case jsonFile == "":
				req.Text = strings.Join(args[1:], " ")
			default:
				var src io.Reader = cmd.InOrStdin()
				if jsonFile != "-" {
					f, err := os.Open(jsonFile)
					if err != nil {
						return protocol.Errorf(protocol.CodeInvalidArgument, "--json: %w", err)
					}
					defer f.Close()
					src = f
				}
				data, err := io.ReadAll(io.LimitReader(src, answerReadBytesMax))
				if err != nil {
					return protocol.Errorf(protocol.CodeInvalidArgument, "--json: read %s: %w", jsonFile, err)
				}
				if len(data) >= answerReadBytesMax {
					return protocol.Errorf(protocol.CodeInvalidArgument, "--json: %s is longer than an answer may be (%d bytes)", jsonFile, protocol.RequestAnswerBytesMax)
				}
				if req.JSON = strings.TrimSpace(string(data)); req.JSON == "" {
					return protocol.Errorf(protocol.CodeInvalidArgument, "--json: %s is empty", jsonFile)
				}
			}
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				req.Authority = auth
				r, err := s.cl.AnswerRequest(ctx, req)
				if err != nil {
					return err
				}
				answer := ""
				if r.Answer != nil {
					answer = r.Answer.Text + r.Answer.JSON
				}
				fmt.Fprintf(s.out, "%s %s in %s: %s\n", r.ID, r.State, r.SessionID, clipLabel(answer))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&jsonFile, "json", "", "answer with the JSON this file holds (\"-\": stdin)")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}
