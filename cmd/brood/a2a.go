package main

import (
	"log/slog"
	neturl "net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	a2agateway "github.com/brood-dev/brood/services/a2a-gateway"
	a2aworker "github.com/brood-dev/brood/services/a2a-worker"
)

// a2aGatewayCmd is `brood a2a-gateway`: Brood's continuable providers as A2A
// agents (docs/a2a.md). Its own NATS user (from --nats and the environment,
// as every service) only builds the Agent Cards (providers.list); each
// caller's requests go over a connection of the Brood user its bearer token
// maps to (--callers), so a caller reaches that user's trees and no other's
// (docs/security.md, "The A2A gateway").
func a2aGatewayCmd(g *globals) *cobra.Command {
	var listen, publicURL, callersFile, workspace string
	cmd := &cobra.Command{
		Use:   "a2a-gateway --callers FILE [--listen ADDR] [--public-url URL]",
		Short: "Serve the providers as Agent2Agent (A2A) agents over HTTP (JSON-RPC and HTTP+JSON)",
		Long: "Serves each continuable provider as an A2A agent: its card at\n" +
			"  <public-url>/agents/<provider>/.well-known/agent-card.json\n" +
			"and the JSON-RPC and HTTP+JSON bindings under /agents/<provider>/jsonrpc and /rest.\n" +
			"--callers FILE (JSON) maps bearer tokens, by their SHA-256, to Brood users:\n" +
			`  {"callers":[{"user":"alice","tokenSha256":"<sha256sum of the token>","natsPassword":"<alice's NATS password>"}]}` + "\n" +
			"The gateway keeps no state of its own: run as many as you like behind a load balancer (docs/a2a.md).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			callers, err := a2agateway.LoadCallers(callersFile)
			if err != nil {
				return err
			}
			nc, err := connect(g.natsURL, "brood-a2a-gateway")
			if err != nil {
				return err
			}
			defer nc.Close()
			cards, err := client.New(nc, client.Options{Prefix: g.prefix})
			if err != nil {
				return err
			}
			defer cards.Close()
			bare := urlsWithoutUser(g.natsURL)
			gw, err := a2agateway.New(a2agateway.Config{
				Listen: listen, PublicURL: publicURL, Callers: callers, Cards: cards, Prefix: g.prefix, Workspace: workspace, Logger: log,
				Dial: func(user, password string) (*nats.Conn, error) {
					opts := []nats.Option{nats.CustomInboxPrefix(protocol.UserInboxPrefix(user))}
					if password != "" {
						opts = append(opts, nats.UserInfo(user, password))
					}
					return connectWith(bare, "brood-a2a-gateway-"+user, opts...)
				},
			})
			if err != nil {
				return err
			}
			return serve(stopOnViolation{nc, gw})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8420", "HTTP address to serve A2A on")
	cmd.Flags().StringVar(&publicURL, "public-url", "", "base URL callers reach the gateway at, written into the cards (default http://<listen>)")
	cmd.Flags().StringVar(&callersFile, "callers", "", "JSON file mapping bearer tokens (SHA-256) to Brood users; a secret (it holds NATS passwords)")
	cmd.Flags().StringVar(&workspace, "workspace", "/", "absolute directory new contexts' roots name as their workspace (children work there)")
	_ = cmd.MarkFlagRequired("callers")
	natsFlag(cmd, g)
	return cmd
}

// urlsWithoutUser is a NATS URL list with any user and password removed
// (the gateway's own), for the callers' connections, which carry their own.
func urlsWithoutUser(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := neturl.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			u.User = nil
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// envA2AToken is where `brood a2a-worker` takes the remote agent's bearer
// token from: never the command line, where ps would show it.
const envA2AToken = "BROOD_A2A_TOKEN"

// a2aWorkerCmd is `brood a2a-worker`: a provider whose children are a remote
// A2A agent (services/a2a-worker, docs/a2a.md "The a2a provider").
func a2aWorkerCmd(g *globals) *cobra.Command {
	var t timing
	var sf storeFlags
	var name, card string
	cmd := &cobra.Command{
		Use:   "a2a-worker --name NAME --card URL",
		Short: "Run a worker of a provider whose children are a remote Agent2Agent (A2A) agent",
		Long: "Serves provider NAME (provisioned first: brood provision --providers ...,NAME): each child is the\n" +
			"remote A2A agent whose card is at URL (its .well-known/agent-card.json), one remote context per child,\n" +
			"one remote task per turn; a dispose of the child cancels the remote task. The remote agent's bearer\n" +
			"token, if it needs one, comes from $" + envA2AToken + ".",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			if err := t.validate(); err != nil {
				return err
			}
			if !protocol.ValidID(name) || card == "" {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--name (^[A-Za-z0-9_-]{1,64}$) and --card URL are required")
			}
			sf.providers, sf.worker = []string{name}, true
			nc, st, err := serviceConn(cmd.Context(), g, "brood-a2a-worker", sf, log)
			if err != nil {
				return err
			}
			defer nc.Close()
			h, err := a2aworker.New(a2aworker.Config{
				NC: nc, Store: st, Name: name, CardURL: card, Token: os.Getenv(envA2AToken),
				HeartbeatInterval: t.heartbeat, HostExpiry: t.hostExpiry, DrainGrace: t.drainGrace, Logger: log,
			})
			if err != nil {
				return err
			}
			return serve(stopOnViolation{nc, h})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the provider's name")
	cmd.Flags().StringVar(&card, "card", "", "the remote agent's card URL")
	t.flags(cmd)
	sf.flags(cmd)
	natsFlag(cmd, g)
	return cmd
}
