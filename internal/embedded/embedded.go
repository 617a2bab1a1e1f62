// Package embedded runs a nats-server with JetStream inside the process, for
// `brood dev` and tests. One node by default; Cluster starts several routed
// nodes on loopback.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Fsync modes (docs/design.md §4: durability depends on the server's sync
// interval; `brood dev` states which one it runs).
const (
	// FsyncInterval flushes JetStream files every SyncInterval (server default 2 min):
	// acknowledged writes can be lost on an OS crash, not on a process crash.
	FsyncInterval = "interval"
	// FsyncAlways flushes every write before acknowledging it.
	FsyncAlways = "always"
)

// DefaultReadyTimeout bounds how long Start waits for the server to accept clients.
const DefaultReadyTimeout = 10 * time.Second

// Config configures one embedded node.
type Config struct {
	// Host and Port to listen on; Port -1 picks a free port. Default 127.0.0.1:4222.
	Host string
	Port int
	// DataDir is the JetStream store directory (file storage). Required.
	DataDir string
	// Fsync is FsyncInterval (default) or FsyncAlways.
	Fsync string
	// SyncInterval overrides the server's 2-minute flush interval in FsyncInterval mode; 0 keeps it.
	SyncInterval time.Duration
	// MaxPayloadBytes is the largest message the server accepts; default 1 MiB (docs/design.md §4).
	MaxPayloadBytes int32
	// ServerName names the node; default "brood-dev".
	ServerName string
	// Cluster: name and routes for a clustered node (see Cluster).
	ClusterName string
	ClusterPort int
	Routes      []string
	// Logging turns the server's own log on (to stderr).
	Logging bool
	// Users, when given, are the only users the server accepts (tests of
	// NATS permissions); without them the server needs no authentication.
	Users []*server.User
}

// DefaultMaxPayloadBytes is the max message size of Brood deployments.
const DefaultMaxPayloadBytes = 1 << 20

// Server is a running embedded nats-server.
type Server struct {
	ns  *server.Server
	cfg Config
}

// Start starts a node and waits until it accepts clients.
func Start(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded: DataDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = 4222
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "brood-dev"
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		NoSigs:     true,
		MaxPayload: cfg.MaxPayloadBytes,
		// Leave JetStream limits to the streams, which set theirs explicitly.
		JetStreamMaxMemory: -1,
		JetStreamMaxStore:  -1,
	}
	opts.Users = cfg.Users
	switch cfg.Fsync {
	case "", FsyncInterval:
		if cfg.SyncInterval > 0 {
			opts.SyncInterval = cfg.SyncInterval
		}
	case FsyncAlways:
		opts.SyncAlways = true
	default:
		return nil, fmt.Errorf("embedded: fsync mode %q is neither %q nor %q", cfg.Fsync, FsyncInterval, FsyncAlways)
	}
	if cfg.ClusterName != "" {
		opts.Cluster.Name = cfg.ClusterName
		opts.Cluster.Host = cfg.Host
		opts.Cluster.Port = cfg.ClusterPort
		routes, err := parseRoutes(cfg.Routes)
		if err != nil {
			return nil, err
		}
		opts.Routes = routes
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	if cfg.Logging {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(DefaultReadyTimeout) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded: server not ready after %s", DefaultReadyTimeout)
	}
	return &Server{ns: ns, cfg: cfg}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Addr is the host:port clients connect to.
func (s *Server) Addr() string {
	u := s.ns.ClientURL()
	if h, p, err := net.SplitHostPort(u[len("nats://"):]); err == nil {
		return net.JoinHostPort(h, p)
	}
	return u
}

// FsyncMode describes the durability mode, for the operator.
func (s *Server) FsyncMode() string {
	if s.cfg.Fsync == FsyncAlways {
		return "fsync always (every write flushed before its acknowledgement)"
	}
	iv := s.cfg.SyncInterval
	if iv == 0 {
		iv = 2 * time.Minute
	}
	return "fsync every " + iv.String() + " (acknowledged writes survive a process crash, not an OS crash)"
}

// Server exposes the underlying nats-server (for tests that restart or inspect it).
func (s *Server) Server() *server.Server { return s.ns }

// Shutdown stops the node and waits for it to exit.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// Run serves until ctx is done, then shuts the node down. A stop through ctx
// returns nil.
func (s *Server) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() { s.ns.WaitForShutdown(); close(done) }()
	select {
	case <-ctx.Done():
		s.Shutdown()
		return nil
	case <-done:
		return errors.New("embedded: nats-server stopped")
	}
}

func parseRoutes(rs []string) ([]*url.URL, error) {
	out := make([]*url.URL, 0, len(rs))
	for _, r := range rs {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("embedded: route %q: %w", r, err)
		}
		out = append(out, u)
	}
	return out, nil
}

// FreePort returns a free TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return strconv.Atoi(p)
}

// RunConfigFile runs a node from a nats-server config file (the server's own
// format, e.g. deploy/nats/cluster/node-1.conf) until ctx ends or the server
// stops, logging as the file says (to stderr by default). It is how a node of
// the version Brood embeds runs as a process of its own (`brood nats-server`),
// which the chaos harness kills -9 and pauses.
func RunConfigFile(ctx context.Context, path string) error {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	opts.NoSigs = true
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("embedded: %w", err)
	}
	ns.ConfigureLogger()
	ns.Start()
	if !ns.ReadyForConnections(DefaultReadyTimeout) {
		ns.Shutdown()
		return fmt.Errorf("embedded: server not ready after %s", DefaultReadyTimeout)
	}
	return (&Server{ns: ns}).Run(ctx)
}
