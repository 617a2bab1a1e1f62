package main

import (
	"context"
	"fmt"
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
		Short: "List the requests for approval you may answer (pending ones; of SESSION's subtree when given)",
		Long: "A child that calls a tool needing approval (write_file, edit_file, run_command, unless its start\n" +
			"allowed it with --auto-approve) parks the call on a request until it is answered with\n" +
			"`brood approve ID` or `brood deny ID --reason …`, or its deadline passes (a denial by timeout).\n" +
			"--wait waits until at least one is pending (up to --timeout); --all lists answered ones too.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				req := protocol.RequestsListRequest{Authority: auth, All: all}
				if len(args) == 1 {
					req.Under = args[0]
				}
				l, err := s.cl.Requests(ctx, req)
				for err == nil && wait && !hasPending(l.Requests) {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(requestsWaitPoll):
					}
					l, err = s.cl.Requests(ctx, req)
				}
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, l.Requests)
				}
				tw := tabwriter.NewWriter(s.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "REQUEST\tSESSION\tSTATE\tTOOL\tARGUMENTS\tDEADLINE")
				for _, r := range l.Requests {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.SessionID, r.State, dash(r.Tool), dash(clipLabel(r.Arguments)),
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
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until at least one request is pending")
	cmd.Flags().BoolVar(&all, "all", false, "list answered and timed-out requests too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
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
			"must cover the asking child's tree (its user's, or every user's).",
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
				fmt.Fprintf(s.out, "%s %s: %s of %s in %s\n", r.ID, r.State, dash(r.Tool), dash(clipLabel(r.Arguments)), r.SessionID)
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
