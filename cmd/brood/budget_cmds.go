package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/requestwait"
	"github.com/brood-dev/brood/pkg/protocol"
)

// budgetCmd is `brood budget CHILD [--raise tokens=+100k]` (docs/protocol.md
// §5.5, "Pause and raise"): without --raise it prints the ledgers the child
// draws on; with it, it raises the child's own budget (budget.raise) and a
// turn paused at the cap continues.
func budgetCmd(g *globals) *cobra.Command {
	var raise string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "budget CHILD [--raise tokens=+100k,...]",
		Short: "Show a child's budgets, or raise its own (a turn paused at its cap continues)",
		Long: "Without --raise: one row per budget the child draws on, root-most first (the last is its own\n" +
			"when its start named one): each LIMIT it names with its VALUE, USED (charged), RESERVED (in\n" +
			"flight) and LEFT; a deadline with its time and what is left of it; then, for a budget raised,\n" +
			"how often and by whom last.\n" +
			"With --raise: the child's own budget gets each named limit raised by that amount (tokens,\n" +
			"modelRequests, toolCalls, children; k and m suffixes; a deadline is not raised), and a\n" +
			"continuable child paused at its cap (`brood state` says paused) continues the same turn (it\n" +
			"looks for the answer at most 2 s apart, so its log shows it within about 2 s).\n" +
			"Budgets only tighten down the tree: a parent agent raises at most to what remains of its own.\n" +
			"CHILD may be a root too (its agents.open named a budget): only you, the user, raise that one.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var delta protocol.BudgetSpend
			if cmd.Flags().Changed("raise") {
				var err error
				if delta, err = protocol.ParseBudgetRaise(raise); err != nil {
					return err
				}
			}
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				if !delta.IsZero() {
					rep, err := s.cl.RaiseBudget(ctx, args[0], auth, delta)
					if err != nil {
						return err
					}
					if asJSON {
						return printJSON(s.out, rep)
					}
					printLedgers(s.out, []protocol.BudgetRecord{rep.Budget})
					if len(rep.Resumed) > 0 {
						fmt.Fprintln(s.errOut, raisedNote(rep.Resumed))
					}
					return nil
				}
				rep, err := s.cl.Budget(ctx, args[0], auth)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(s.out, rep)
				}
				if len(rep.Budgets) == 0 {
					if rep.Queued {
						fmt.Fprintf(s.errOut, "%s is queued (its start waits in its parent's queue) and will draw on no budget\n", args[0])
						return nil
					}
					fmt.Fprintf(s.errOut, "%s draws on no budget\n", args[0])
					return nil
				}
				printLedgers(s.out, rep.Budgets)
				if rep.Queued {
					fmt.Fprintln(s.errOut, queuedBudgetsNote(args[0], rep.Own))
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&raise, "raise", "", "raise the child's own budget: tokens=+100k,modelRequests=+5,toolCalls=+10,children=+2")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print budget.get's {childId, budgets, own?, queued?} (with --raise: {budget, resumed}) as JSON")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// queuedBudgetsNote is what `brood budget` of a child whose start waits
// in its parent's queue prints on stderr under the budgets it will draw
// on (own: the last is the budget its start named, not created yet).
func queuedBudgetsNote(id string, own bool) string {
	note := fmt.Sprintf("%s is queued (its start waits in its parent's queue): these are the budgets it will draw on", id)
	if own {
		note += "; its own (the last) is created, and its deadline counted, when it starts"
	}
	return note
}

// raisedNote is what a raise that answered budget pauses (their request
// ids) prints on stderr. The raise answers each pause's request; the
// paused turn goes on when it next looks at it (at most 2 s apart,
// requestwait.PollIntervalMax), so until then `brood state` still says
// paused: the note says so rather than that the turn resumed.
func raisedNote(requests []string) string {
	return fmt.Sprintf("raised; answered the budget pause of %s: %s (each goes on when it next looks, within about %s; until then brood state says paused)",
		count(len(requests), "turn"), strings.Join(requests, " "), requestwait.PollIntervalMax)
}

// printLedgers prints one row per limit each ledger names.
func printLedgers(w io.Writer, recs []protocol.BudgetRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUDGET\tLIMIT\tVALUE\tUSED\tRESERVED\tLEFT")
	for _, r := range recs {
		used, held, left := r.Charged, r.Reserved(), r.Remaining()
		for _, f := range []struct {
			name              string
			v, u, h, leftover int64
		}{
			{protocol.BudgetLimitTokens, r.Limits.Tokens, used.Tokens, held.Tokens, left.Tokens},
			{protocol.BudgetLimitModelRequests, r.Limits.ModelRequests, used.ModelRequests, held.ModelRequests, left.ModelRequests},
			{protocol.BudgetLimitToolCalls, r.Limits.ToolCalls, used.ToolCalls, held.ToolCalls, left.ToolCalls},
			{protocol.BudgetLimitChildren, r.Limits.Children, used.Children, held.Children, left.Children},
		} {
			if f.v == 0 || f.leftover == math.MaxInt64 {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", r.SessionID, f.name, f.v, f.u, f.h, f.leftover)
		}
		if r.DeadlineAt > 0 {
			fmt.Fprintf(tw, "%s\tdeadline\t%s\t\t\t%s\n", r.SessionID, time.UnixMilli(r.DeadlineAt).UTC().Format(time.RFC3339),
				max(time.Until(time.UnixMilli(r.DeadlineAt)), 0).Round(time.Second))
		}
	}
	tw.Flush()
	for _, r := range recs {
		if r.Raises > 0 {
			fmt.Fprintln(w, raisesLine(r))
		}
	}
}

// raisesLine says how often a ledger was raised (budget.raise; the
// ledger's raises) and by whom last: "01M…: raised 2 times, last by the
// user".
func raisesLine(r protocol.BudgetRecord) string {
	line := fmt.Sprintf("%s: raised %s", r.SessionID, count(r.Raises, "time"))
	if r.RaisedBy != nil {
		line += ", last by " + requestwait.AnswererName(*r.RaisedBy)
	}
	return line
}

// raiseHint is the command that raises what stops child's paused turn: for
// each budget it draws on with a limit used up, `brood budget <that
// budget's session> --raise <limit>=+N` (a raise of an ancestor's budget
// is its own: budget.raise raises the named session's); tokens=+N on the
// child's own when none is used up (a step needs more tokens than are
// left) or the ledgers cannot be read.
func raiseHint(ctx context.Context, s *session, auth protocol.Authority, child string) string {
	fallback := "brood budget " + child + " --raise tokens=+N"
	rep, err := s.cl.Budget(ctx, child, auth)
	if err != nil {
		return fallback
	}
	var hints []string
	for _, r := range rep.Budgets {
		left := r.Remaining()
		var spent []string
		for _, f := range []struct {
			name        string
			limit, left int64
		}{
			{protocol.BudgetLimitTokens, r.Limits.Tokens, left.Tokens},
			{protocol.BudgetLimitModelRequests, r.Limits.ModelRequests, left.ModelRequests},
			{protocol.BudgetLimitToolCalls, r.Limits.ToolCalls, left.ToolCalls},
			{protocol.BudgetLimitChildren, r.Limits.Children, left.Children},
		} {
			if f.limit > 0 && f.left == 0 {
				spent = append(spent, f.name+"=+N")
			}
		}
		if len(spent) > 0 {
			hints = append(hints, "brood budget "+r.SessionID+" --raise "+strings.Join(spent, ","))
		}
	}
	if len(hints) == 0 {
		return fallback
	}
	return strings.Join(hints, "; ")
}
