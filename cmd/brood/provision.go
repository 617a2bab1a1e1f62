package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// provisionRetryMax bounds how long `brood provision` retries a JetStream
// that is not ready yet (a fresh cluster electing its meta leader answers
// "no suitable peers for placement" for a few seconds).
const provisionRetryMax = 60 * time.Second

// storeOpenWait is the pause between a service's checks while the streams
// are not provisioned (or JetStream is not ready); storeOpenLogEvery is how
// often it says so in its log.
const (
	storeOpenWait     = time.Second
	storeOpenLogEvery = 15 * time.Second
)

func provisionCmd(g *globals) *cobra.Command {
	var replicas int
	var check bool
	var timeout time.Duration
	var providers []string
	cmd := &cobra.Command{
		Use:   "provision [--replicas N] [--providers P,...] [--check]",
		Short: "Create or update Brood's streams and buckets (the admin step before the services start)",
		Long: "Creates Brood's streams and buckets, or updates them to Brood's settings, with N replicas (1 on\n" +
			"one server, 3 on a cluster). Run it once per deployment, and again after an upgrade or to change\n" +
			"the replicas, as a NATS user allowed to create and update streams (the admin user of\n" +
			"deploy/nats/cluster/accounts.conf). The services never create or change a stream: they check the\n" +
			"configuration when they start, wait while it is missing, and refuse to run on a wrong one.\n" +
			"Each provider has its own log and inbox streams (BROOD_LOG_<p>, BROOD_INBOX_<p>; roots' are\n" +
			"BROOD_LOG_root, BROOD_INBOX_root): --providers names every provider of the deployment, and a new\n" +
			"provider is provisioned (run this again with it added) before its workers start.\n" +
			"--check only compares and lists every difference (exit 1 when there is one).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if replicas < 1 || replicas > 5 {
				return protocol.Errorf(protocol.CodeInvalidArgument, "--replicas %d must be between 1 and 5", replicas)
			}
			if err := store.CheckProviders(providers); err != nil {
				return fmt.Errorf("--providers: %w", err)
			}
			subj, err := protocol.NewSubjects(g.prefix)
			if err != nil {
				return protocol.Errorf(protocol.CodeInvalidArgument, "%w", err)
			}
			nc, err := connect(g.natsURL, "brood-provision")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := ctxWithSignals(g.ctx)
			defer cancel()
			cfg := store.DefaultConfig()
			cfg.Replicas = replicas
			cfg.Providers = providers
			if check {
				cctx, ccancel := context.WithTimeout(ctx, timeout)
				defer ccancel()
				if _, err := store.Open(cctx, nc, subj, cfg); err != nil {
					return storeError(nc, "check", err)
				}
				fmt.Fprintf(g.out, "Brood's streams and buckets are provisioned as this deployment needs them (%d replicas; providers %s)\n", replicas, strings.Join(providers, ","))
				return nil
			}
			if err := provision(ctx, nc, subj, cfg, timeout, newLogger(g.logLevel, slog.LevelInfo, g.errOut)); err != nil {
				return err
			}
			fmt.Fprintf(g.out, "provisioned Brood's streams and buckets with %d replicas for providers %s\n", replicas, strings.Join(providers, ","))
			return nil
		},
	}
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas of every stream and bucket (1 on one server, 3 on a cluster)")
	cmd.Flags().StringSliceVar(&providers, "providers", slices.Clone(store.DefaultProviders), "every provider of the deployment (each gets its log and inbox streams; the roots' are always made)")
	cmd.Flags().BoolVar(&check, "check", false, "only check the configuration and list the differences")
	cmd.Flags().DurationVar(&timeout, "timeout", provisionRetryMax, "how long to retry while JetStream is not ready")
	natsFlag(cmd, g)
	return cmd
}

// provision runs store.Provision, retrying within timeout while JetStream
// is not ready (a fresh cluster electing leaders, no placement yet).
func provision(ctx context.Context, nc *nats.Conn, subj protocol.Subjects, cfg store.Config, timeout time.Duration, log *slog.Logger) error {
	ctx, stop := cancelOnViolation(ctx, nc)
	defer stop()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(pctx, 10*time.Second)
		_, err := store.Provision(actx, nc, subj, cfg)
		acancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, store.ErrMaxPayload) || permissionViolation(nc) != nil || pctx.Err() != nil {
			return storeError(nc, "provision", err)
		}
		log.Info("JetStream not ready for provisioning; retrying", "err", err)
		select {
		case <-pctx.Done():
			return storeError(nc, "provision", err)
		case <-time.After(storeOpenWait):
		}
	}
}

// openStore binds a service's streams and buckets and checks their
// configuration (store.Open); it never creates or changes one. While they
// are not provisioned, or JetStream does not answer, it waits and checks
// again (saying so in the log every storeOpenLogEvery), until ctx is done.
// A wrong configuration, a too small max_payload or a NATS user without
// the rights to read them end the service with the reason.
func openStore(ctx context.Context, nc *nats.Conn, prefix string, sf storeFlags, log *slog.Logger) (*store.Store, error) {
	subj, err := protocol.NewSubjects(prefix)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%w", err)
	}
	cfg := store.DefaultConfig()
	cfg.Replicas = sf.replicas
	cfg.Providers, cfg.SkipRoots, cfg.JSDomain = sf.providers, sf.worker, sf.jsDomain
	if err := store.CheckProviders(cfg.Providers); err != nil {
		return nil, err
	}
	if err := store.CheckDomain(cfg.JSDomain); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "--js-domain: %w", err)
	}
	ctx, stop := cancelOnViolation(ctx, nc)
	defer stop()
	var logged time.Time
	for {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := store.Open(octx, nc, subj, cfg)
		cancel()
		if err == nil {
			return st, nil
		}
		if errors.Is(err, store.ErrMisconfigured) || errors.Is(err, store.ErrMaxPayload) || permissionViolation(nc) != nil {
			return nil, storeError(nc, "open", err)
		}
		if time.Since(logged) >= storeOpenLogEvery {
			log.Warn("waiting for Brood's streams and buckets: run `brood provision --replicas N --providers P,...` as the admin user (docs/security.md); checking again every second", "err", err)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			if permissionViolation(nc) != nil {
				return nil, storeError(nc, "open", err)
			}
			return nil, protocol.Errorf(protocol.CodeUnavailable, "stopped while waiting for Brood's streams and buckets: %w", err)
		case <-time.After(storeOpenWait):
		}
	}
}

// storeError explains a failed provisioning or check: a permission the
// connection's user lacks (the role it needs), or the store's reason.
func storeError(nc *nats.Conn, what string, err error) error {
	if pv := permissionViolation(nc); pv != nil {
		// The verb's role is named once, by main (withRole).
		return protocol.Errorf(protocol.CodePermissionDenied, "%s Brood's streams and buckets: %w", what, pv)
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "store: ") {
		msg = strings.TrimPrefix(msg, "store: ")
	}
	return protocol.Errorf(protocol.CodeUnavailable, "%s Brood's streams and buckets: %s", what, msg).WithCause(err)
}

// permissionViolation returns the last permissions violation the server
// reported on nc, or nil.
func permissionViolation(nc *nats.Conn) error {
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return err
	}
	return nil
}

// cancelOnViolation returns ctx cancelled as soon as the server refuses nc's
// user a publish or subscription: a JetStream request it refused would
// otherwise wait out its deadline (nats.go reports the refusal only to the
// connection's error handler). Call stop when done.
func cancelOnViolation(ctx context.Context, nc *nats.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			cancel(err)
		}
		if prev != nil {
			prev(c, sub, err)
		}
	})
	return ctx, func() {
		nc.SetErrorHandler(prev)
		cancel(nil)
	}
}
