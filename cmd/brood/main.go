// Command brood is Brood's single binary: `brood dev` (embedded NATS and all
// services), one service per process (`brood coordinator`, `brood
// spawn-worker`), and the client verbs (DESIGN.md §9).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/pkg/protocol"
)

// exitError carries a process exit status without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// globals are the flags every command takes.
type globals struct {
	natsURL  string
	prefix   string
	logLevel string
	timeout  time.Duration
}

func defaultNATSURL() string {
	if u := os.Getenv("BROOD_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func main() {
	g := &globals{}
	root := &cobra.Command{
		Use:           "brood",
		Short:         "Brood: AI agents delegating work to child agents over NATS",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.natsURL, "nats", defaultNATSURL(), "NATS URL ($BROOD_NATS_URL when set)")
	root.PersistentFlags().StringVar(&g.prefix, "prefix", protocol.DefaultPrefix, "subject prefix of the deployment")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "", "log level: debug, info, warn, error (services default info, client verbs warn)")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 10*time.Second, "timeout of each coordinator request")
	root.AddCommand(
		devCmd(g), coordinatorCmd(g), spawnWorkerCmd(g), forkWorkerCmd(g), acpBridgeCmd(g), acpAgentCmd(g),
		providersCmd(g), runCmd(g), logCmd(g),
		startCmd(g), followupCmd(g), stateCmd(g), childrenCmd(g), drainCmd(g), watchCmd(g),
	)
	err := root.Execute()
	if err == nil {
		return
	}
	var ee exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	// Errors print their code first on stderr (DESIGN.md §9).
	if pe := protocol.CodeOf(err); pe != "" {
		fmt.Fprintln(os.Stderr, protocol.AsError(err).Error())
	} else {
		fmt.Fprintln(os.Stderr, "ERROR: "+err.Error())
	}
	os.Exit(1)
}

func newLogger(level string, def slog.Level, w io.Writer) *slog.Logger {
	l := def
	switch strings.ToLower(level) {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// connect dials NATS for a process named name.
func connect(url, name string, reconnect bool) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.Timeout(5 * time.Second)}
	if reconnect {
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	} else {
		opts = append(opts, nats.MaxReconnects(2))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "connect to NATS at %s: %v", url, err)
	}
	return nc, nil
}

// ctxWithSignals is the context of a client verb: cancelled by Ctrl-C.
func ctxWithSignals() (context.Context, context.CancelFunc) {
	return signalContext(context.Background())
}
