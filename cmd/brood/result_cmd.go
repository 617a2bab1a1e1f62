package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// childResult is what `brood result` reports about a continuable child: its
// last finished turn (sessions.result) and its residency now.
type childResult struct {
	protocol.SessionResultReply
	State string `json:"state"`
}

// resultWaitPoll is how often `brood result --wait` asks whether a
// continuable child went idle.
const resultWaitPoll = 200 * time.Millisecond

func resultCmd(g *globals) *cobra.Command {
	var asJSON, wait bool
	cmd := &cobra.Command{
		Use:   "result ID [--wait]",
		Short: "Print what a child answered: a one-shot run's result, or a continuable child's last finished turn",
		Long: "For a one-shot run (or child) id: its result, as `brood run` prints it (--wait waits until it\n" +
			"settles). For a continuable child: the answer of its last finished turn, with the turn and how it\n" +
			"ended on stderr (--wait first waits until it has no live activation and nothing queued: it ran\n" +
			"what it was sent; a drain holds queued messages until it is lifted).\n" +
			"Exits 1 with the code first on stderr when that run or turn did not complete.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withUser(g, func(ctx context.Context, s *session, auth protocol.Authority) error {
				id := args[0]
				ref := protocol.RunRef{RunID: id, Grant: auth.Grant}
				for {
					if wait {
						ref.WaitMs = 30_000
					}
					st, err := s.cl.Await(ctx, ref)
					if err == nil {
						if wait && st.State != protocol.RunSettled {
							continue
						}
						return printRunStatus(s, st, asJSON, true)
					}
					// No such run, or (a grant of one user) none it may see:
					// a continuable child's id names no run.
					if !errors.Is(err, protocol.ErrNotFound) && !errors.Is(err, protocol.ErrUnauthorized) {
						return err
					}
					break
				}
				// Not a one-shot run: a continuable child, or the child of a
				// one-shot run on a remote provider (an ACP run: its run id is
				// not its child id), which has no activation state.
				st, err := s.cl.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
				if errors.Is(err, protocol.ErrInvalidArgument) {
					if done, rerr := oneShotChildResult(ctx, s, id, auth, wait, asJSON); done {
						return rerr
					}
					return err
				}
				for wait && err == nil && (st.State != protocol.StateNone || st.Queued > 0) {
					select {
					case <-ctx.Done():
						return protocol.Errorf(protocol.CodeCancelled, "waiting for %s: %w", id, ctx.Err())
					case <-time.After(resultWaitPoll):
					}
					st, err = s.cl.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
				}
				if err != nil {
					return err
				}
				res, err := s.cl.SessionResult(ctx, protocol.SessionResultRequest{SessionID: id, Authority: auth})
				if err != nil {
					return err
				}
				r := childResult{SessionResultReply: res, State: st.State}
				return printChildResult(s, r, asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: a run's status, or {childId, state, turn, stopReason, output}")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the run settled, or the continuable child went idle")
	clientFlags(cmd, g)
	userFlags(cmd, g)
	return cmd
}

// oneShotChildResult prints what a one-shot child answered, read from its
// log (sessions.result) by its child id, which a remote provider's run does
// not share with its run id (issue 37, item 8: `brood result` of an ACP
// run's child recommended running that same command). --wait polls until
// its turn ended.
// done is false when id is no one-shot child (sessions.result's mode says
// so): the caller reports its own error then.
func oneShotChildResult(ctx context.Context, s *session, id string, auth protocol.Authority, wait, asJSON bool) (done bool, err error) {
	for {
		res, err := s.cl.SessionResult(ctx, protocol.SessionResultRequest{SessionID: id, Authority: auth})
		if err != nil || res.Mode != protocol.ModeOneShot {
			return false, nil
		}
		if res.Finished || !wait {
			return true, printChildResult(s, childResult{SessionResultReply: res, State: protocol.ModeOneShot}, asJSON)
		}
		select {
		case <-ctx.Done():
			return true, protocol.Errorf(protocol.CodeCancelled, "waiting for %s: %w", id, ctx.Err())
		case <-time.After(resultWaitPoll):
		}
	}
}

// turnResult is the result of one finished turn: its events from
// turn/start to turn/end.
func turnResult(id string, turn []protocol.SessionEvent) (childResult, error) {
	r, err := sessionlog.TurnResult(id, turn)
	return childResult{SessionResultReply: r}, err
}

func printChildResult(s *session, r childResult, asJSON bool) error {
	if asJSON {
		if err := printJSON(s.out, r); err != nil {
			return err
		}
	}
	if !r.Finished {
		if !asJSON {
			fmt.Fprintf(s.errOut, "%s has not finished a turn yet (state %s)\n", r.SessionID, r.State)
		}
		return nil
	}
	if !asJSON {
		fmt.Fprintf(s.errOut, "%s: turn %d %s (state %s)\n", r.SessionID, r.Turn, r.StopReason, r.State)
	}
	return printResult(s, fmt.Sprintf("turn %d of %s", r.Turn, r.SessionID),
		protocol.SubagentResult{Output: r.Output, StopReason: r.StopReason, Diagnostic: r.Diagnostic, ErrorCode: r.ErrorCode, Structured: r.Structured, Usage: r.Usage}, asJSON)
}
