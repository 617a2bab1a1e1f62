package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// userAuthority mints a user grant: the CLI acts for the human user, as a
// trusted host (only hosts allowed to call authority.user can).
func (s *session) userAuthority(ctx context.Context) (protocol.Authority, error) {
	g, err := s.cl.UserGrant(ctx)
	if err != nil {
		return protocol.Authority{}, err
	}
	return protocol.Authority{Grant: g.Grant}, nil
}

func startCmd(g *globals) *cobra.Command {
	var provider, label, childID string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "start --provider NAME [--label L] PROMPT",
		Short: "Start a continuable child from a root opened in the current directory; prints childId and messageId",
		Long: "Starts a continuable child: its session outlives the command, and `brood followup CHILD MESSAGE`\n" +
			"sends it more turns later, even after every process restarted. The root opened for the start is\n" +
			"closed when the command ends; the child lives on.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if provider == "" {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--provider is required")
			}
			return withClient(g, func(ctx context.Context, s *session) error {
				return withRoot(ctx, s, func(root *client.Root) error {
					if label == "" {
						label = firstWords(strings.Join(args, " "), 5)
					}
					r, err := s.cl.StartContinuable(ctx, protocol.ContinuableStartRequest{
						Provider: provider, Parent: root.Ref(), Label: label, ChildID: childID, Prompt: protocol.Text(strings.Join(args, " ")),
					})
					if err != nil {
						return err
					}
					if asJSON {
						return printJSON(os.Stdout, struct {
							protocol.ContinuableStartReply
							ParentSession string `json:"parentSession"`
						}{r, root.SessionID})
					}
					fmt.Printf("childId %s\nmessageId %s\nparentSession %s\n", r.ChildID, r.MessageID, root.SessionID)
					return nil
				})
			})
		},
	}
	cmd.Flags().StringVar(&provider, "provider", "", "provider name (see brood providers)")
	cmd.Flags().StringVar(&label, "label", "", "a short label for the child (default: the prompt's first words)")
	cmd.Flags().StringVar(&childID, "child-id", "", "reserve this child id (^[A-Za-z0-9_-]{1,64}$; an id ever used is DUPLICATE_CHILD)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
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
	var key string
	cmd := &cobra.Command{
		Use:   "followup CHILD MESSAGE",
		Short: "Send a continuable child its next turn, as the user (with a user grant); prints messageId",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				auth, err := s.userAuthority(ctx)
				if err != nil {
					return err
				}
				mid, err := s.cl.Followup(ctx, protocol.FollowupRequest{
					ChildID: args[0], Authority: auth, Message: protocol.Text(strings.Join(args[1:], " ")), IdempotencyKey: key,
				})
				if err != nil {
					return err
				}
				fmt.Printf("messageId %s\n", mid)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&key, "idempotency-key", "", "a retry with the same key within 2 minutes is accepted once")
	return cmd
}

func stateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "state CHILD",
		Short: "Print a continuable child's residency: running, waiting, or none",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				auth, err := s.userAuthority(ctx)
				if err != nil {
					return err
				}
				st, err := s.cl.State(ctx, args[0], auth)
				if err != nil {
					return err
				}
				fmt.Println(st.State)
				return nil
			})
		},
	}
}

func childrenCmd(g *globals) *cobra.Command {
	var descendants, asJSON bool
	cmd := &cobra.Command{
		Use:   "children [PARENT] [--descendants]",
		Short: "List a parent's children (without PARENT: the live continuable activations)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				var rows []protocol.ChildRow
				var err error
				if len(args) == 0 {
					rows, err = liveActivations(ctx, s)
				} else {
					var auth protocol.Authority
					if auth, err = s.userAuthority(ctx); err != nil {
						return err
					}
					rows, err = s.cl.Children(ctx, protocol.ChildrenListRequest{Parent: args[0], Authority: auth, Descendants: descendants})
					for i := range rows {
						if rows[i].ParentID == "" {
							rows[i].ParentID, rows[i].Depth = args[0], 1
						}
					}
				}
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(os.Stdout, rows)
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CHILD\tKIND\tMODE\tACTIVITY\tPROVIDER\tLABEL\tPARENT\tDEPTH")
				for _, r := range rows {
					kind, label := r.Kind, r.Label
					if r.Kind == protocol.RowDiagnostic {
						kind, label = "diagnostic", r.Reason
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", r.ID, kind, r.Mode, r.Activity, r.Provider, label, r.ParentID, r.Depth)
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
	return cmd
}

// liveActivations lists resident continuable activations from the leases.
func liveActivations(ctx context.Context, s *session) ([]protocol.ChildRow, error) {
	js, err := jetstream.New(s.cl.Conn())
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, s.cl.Subjects().BucketAgents())
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "bucket %s: %v", s.cl.Subjects().BucketAgents(), err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "list leases: %v", err)
	}
	var rows []protocol.ChildRow
	for key := range lister.Keys() {
		if strings.Contains(key, ".") {
			continue
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		var rec protocol.AgentRecord
		if protocol.Unmarshal(protocol.Msgpack, e.Value(), &rec) != nil || rec.Kind != protocol.AgentContinuable {
			continue
		}
		rows = append(rows, protocol.ChildRow{Kind: protocol.RowChild, ID: rec.SessionID, Mode: protocol.ModeContinuable,
			Activity: protocol.ActivityRunning, Provider: rec.Provider, ParentID: rec.ParentSession, Depth: len(rec.Ancestry)})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	return rows, nil
}

func drainCmd(g *globals) *cobra.Command {
	var parents []string
	var lift bool
	cmd := &cobra.Command{
		Use:   "drain [--parent ID ...]",
		Short: "Dispose continuable activations child-first (all, or the descendants of the given parents); sessions and queued messages stay",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			r, err := s.cl.Drain(ctx, protocol.DrainRequest{Authority: auth, Parents: parents, Lift: lift})
			if err != nil {
				return err
			}
			if lift {
				fmt.Println("drain lifted: admission is open again; queued messages run now")
				return nil
			}
			fmt.Printf("drained %d activations; admission stays closed until `brood drain --lift`\n", len(r.Disposed))
			for _, id := range r.Disposed {
				fmt.Println(id)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&parents, "parent", nil, "drain only the descendants of this parent (repeatable)")
	cmd.Flags().BoolVar(&lift, "lift", false, "reopen admission closed by an earlier drain (of the same --parent scope, or global)")
	return cmd
}

func watchCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "watch [PARENT]",
		Short: "Print live lifecycle events (subagent/start, subagent/end) of a parent's subtree, as a tree; Ctrl-C stops",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(g, func(ctx context.Context, s *session) error {
				root := ""
				if len(args) == 1 {
					root = args[0]
				}
				return watch(ctx, s, root, asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as a JSON line")
	return cmd
}

// watch follows BROOD_EVENTS from now on with an ordered consumer and keeps
// the subtree under root (every parent when root is ""): a child seen
// starting under a watched parent is watched too, so grandchildren show.
func watch(ctx context.Context, s *session, root string, asJSON bool) error {
	js, err := jetstream.New(s.cl.Conn())
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, s.cl.Subjects().StreamEvents())
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "stream %s: %v", s.cl.Subjects().StreamEvents(), err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.cl.Subjects().EventsAll("*")}, DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "watch: %v", err)
	}
	depth := map[string]int{}
	if root != "" {
		depth[root] = 0
		fmt.Printf("watching the subtree of %s (Ctrl-C stops)\n", root)
	} else {
		fmt.Println("watching every parent (Ctrl-C stops)")
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); it.Stop() }()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var ev protocol.LifecycleEvent
		if protocol.Unmarshal(protocol.Msgpack, m.Data(), &ev) != nil {
			continue
		}
		d, watched := depth[ev.ParentSession]
		if root != "" && !watched {
			continue
		}
		if ev.Type == protocol.LifecycleStart {
			depth[ev.ID] = d + 1
		}
		if asJSON {
			_ = printJSONLine(ev)
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
		fmt.Println(line)
	}
}

func printJSONLine(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
