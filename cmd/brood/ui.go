package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/services/webui"
)

// DefaultUIListen is where `brood ui` listens unless told otherwise.
const DefaultUIListen = "127.0.0.1:8377"

// uiFlags configure a web view (brood ui, brood dev --ui).
type uiFlags struct {
	listen string
	grant  string
	token  string
}

func (f *uiFlags) flags(cmd *cobra.Command, listenFlag, listenDefault, listenHelp string) {
	cmd.Flags().StringVar(&f.listen, listenFlag, listenDefault, listenHelp)
	cmd.Flags().StringVar(&f.token, "access-token", "",
		"token every request must carry (Authorization: Bearer, or open /?token=TOKEN once); required beyond loopback (default $BROOD_UI_TOKEN)")
}

// newWebUI builds the web view on nc: it reads through the coordinator with
// the given user grant, or one it mints.
func (f *uiFlags) newWebUI(nc *nats.Conn, prefix string, log *slog.Logger) (*webui.Server, func(), error) {
	token := f.token
	if token == "" {
		token = os.Getenv("BROOD_UI_TOKEN")
	}
	cl, err := client.New(nc, client.Options{Prefix: prefix})
	if err != nil {
		return nil, nil, err
	}
	srv, err := webui.New(webui.Config{Client: cl, Listen: f.listen, Grant: f.grant, AccessToken: token, Logger: log})
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return srv, cl.Close, nil
}

func uiCmd(g *globals) *cobra.Command {
	var f uiFlags
	cmd := &cobra.Command{
		Use:   "ui [--listen HOST:PORT]",
		Short: "Serve the web view: the live delegation tree and each session's conversation",
		Long: "Serves a web page with the live tree of roots and their descendants (provider, state, stop\n" +
			"reason, duration) and any session's log as a conversation that follows live turns. It reads\n" +
			"through the coordinator with a user grant (--grant, else one it mints: its NATS user must be\n" +
			"allowed authority.user). On loopback (the default) it answers loopback names only; any other\n" +
			"address needs --access-token.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(g.logLevel, slog.LevelInfo, g.errOut)
			nc, err := connect(g.natsURL, "brood-ui")
			if err != nil {
				return err
			}
			defer nc.Close()
			srv, done, err := f.newWebUI(nc, g.prefix, log)
			if err != nil {
				return err
			}
			defer done()
			fmt.Fprintf(g.out, "brood ui: %s (Ctrl-C stops)\n", srv.URL())
			return serve(srv)
		},
	}
	f.flags(cmd, "listen", DefaultUIListen, "host:port of the web view (port 0 picks one); beyond loopback it needs --access-token")
	cmd.Flags().StringVar(&f.grant, "grant", "", "user grant to read with (default: mint one with authority.user)")
	natsFlag(cmd, g)
	return cmd
}
