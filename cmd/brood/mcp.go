package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	mcpserver "github.com/brood-dev/brood/services/mcp-server"
)

// mcpCmd is `brood mcp`: an MCP server whose tools let an MCP host's model
// delegate to the fleet (services/mcp-server, docs/mcp.md). It runs as a
// Brood client (role client).
func mcpCmd(g *globals) *cobra.Command {
	var listen, cwd string
	cmd := &cobra.Command{
		Use:   "mcp [--listen HOST:PORT] [--cwd DIR]",
		Short: "Serve MCP (stdio, or streamable HTTP with --listen): tools for an MCP host to delegate to the fleet",
		Long: "An MCP server for a host such as Claude Code or VS Code (docs/mcp.md): tools providers, delegate,\n" +
			"followup, state, result, children, interrupt and dispose act on the fleet as the NATS user of\n" +
			"$BROOD_NATS_USER (the client role is enough). Over stdio by default (the host starts `brood mcp`);\n" +
			"with --listen it serves streamable HTTP at http://HOST:PORT/mcp and prints that URL on stdout; every HTTP\n" +
			"caller acts as that user, so without $BROOD_MCP_TOKEN it listens on loopback only and answers loopback\n" +
			"Host names only, and with it every request needs Authorization: Bearer $BROOD_MCP_TOKEN.\n" +
			"Delegations start from one root agent opened in --cwd (default: the current directory).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelWarn, g.errOut)
			if cwd == "" {
				wd, err := os.Getwd()
				if err != nil {
					return err
				}
				cwd = wd
			}
			abs, err := filepath.Abs(cwd)
			if err != nil {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--cwd: %w", err)
			}
			nc, err := connect(g.natsURL, "brood-mcp")
			if err != nil {
				return err
			}
			defer nc.Close()
			cl, err := client.New(nc, client.Options{Prefix: g.prefix, Timeout: g.timeout})
			if err != nil {
				return err
			}
			defer cl.Close()
			// The token comes from the environment only, never a flag,
			// so that it stays out of `ps`.
			cfg := mcpserver.Config{Client: cl, Cwd: abs, Listen: listen, AccessToken: os.Getenv("BROOD_MCP_TOKEN"),
				Version: buildinfo.Version, Logger: log}
			if listen == "" {
				cfg.In, cfg.Out = os.Stdin, os.Stdout
			}
			srv, err := mcpserver.New(cfg)
			if err != nil {
				return err
			}
			if listen != "" {
				go func() {
					<-srv.Ready()
					if a := srv.Addr(); a != nil {
						fmt.Fprintf(g.out, "MCP URL http://%s/mcp\n", a)
					}
				}()
			}
			return serve(srv)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "serve streamable HTTP on HOST:PORT (port 0 picks one; the URL is printed) instead of stdio")
	cmd.Flags().StringVar(&cwd, "cwd", "", "workspace of the root agent delegations start from (default: the current directory)")
	clientFlags(cmd, g)
	return cmd
}
