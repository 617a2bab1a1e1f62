package main

import (
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/embedded"
)

// natsServerCmd runs one nats-server node, the version brood embeds, from a
// nats-server config file: the chaos harness's nodes (pkg/chaos), and a way
// to run the deploy/ configs without building nats-server. Ctrl-C or SIGTERM
// shuts it down.
func natsServerCmd() *cobra.Command {
	var conf string
	cmd := &cobra.Command{
		Use:    "nats-server --config FILE",
		Short:  "Run a nats-server node (the version brood embeds) from a nats-server config file",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext(cmd.Context())
			defer cancel()
			return embedded.RunConfigFile(ctx, conf)
		},
	}
	cmd.Flags().StringVarP(&conf, "config", "c", "", "nats-server config file")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
