package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/routetls"
	"github.com/brood-dev/brood/pkg/protocol"
)

// routeTLSCmd generates the route CA and the node certificates a
// deployment's nats-server nodes authenticate their routes with (mutual
// TLS), the set-up step of deploy/README.md: no route secret ships in
// deploy/ (docs/security.md, "No usable shared secret ships"). Hidden, like
// nats-server: it is a step of deploy/'s set-up, not of using Brood.
func routeTLSCmd(g *globals) *cobra.Command {
	var (
		dir   string
		nodes []string
		hosts []string
		keep  bool
	)
	cmd := &cobra.Command{
		Use:   "route-tls --dir DIR --node NAME... [--host HOST]...",
		Short: "Generate the route CA and node certificates of a nats-server cluster (deploy/README.md)",
		Long: "Writes DIR/ca.pem, DIR/ca-key.pem and, per --node, DIR/NAME.pem and DIR/NAME-key.pem: a certificate\n" +
			"naming NAME and every --host, for both ends of a route. Keys are 0600. A DIR that already holds ca.pem\n" +
			"is refused (--keep: left as it is when every file is there).",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--dir is required")
			}
			if err := routetls.Generate(dir, nodes, hosts, keep); err != nil {
				return protocol.Errorf(protocol.CodeInvalidArgument, "route-tls: %w", err)
			}
			fmt.Fprintf(g.out, "route TLS for %d nodes in %s\n", len(nodes), dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write the CA and the node certificates to")
	cmd.Flags().StringArrayVar(&nodes, "node", nil, "a node's name (repeatable): its certificate's name and file names")
	cmd.Flags().StringArrayVar(&hosts, "host", nil, "another name or IP address every node certificate holds (repeatable), e.g. 127.0.0.1")
	cmd.Flags().BoolVar(&keep, "keep", false, "leave a complete existing set as it is instead of refusing")
	return cmd
}
