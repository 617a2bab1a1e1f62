// Package mcptools gives a worker's Brood agent children the tools of MCP
// servers (docs/mcp.md, "Tool servers for children"): a worker's config
// names servers (a stdio command, or a streamable HTTP URL, each with its
// own environment or headers), the worker connects to each once with the
// official MCP Go SDK's client, and every tool a server lists joins the
// children's global tools as `<server>__<tool>`: listed in the provider
// descriptor, narrowed by the same tool filters and ceilings as the
// built-in tools, and logged as a tool call with its result like any other.
//
// Servers are per worker: started when the worker is built, shared by every
// child it hosts (a forked child, a cold-resumed one included: it lands on a
// worker with the same servers), stopped when the worker stops. A call never
// hangs a turn: it is bounded by the server's call timeout (default
// CallTimeoutDefault) and answers a tool error when it passes; a server
// that crashes or whose connection breaks answers a tool error too, and the
// next call reconnects (a stdio server is started again).
//
// Secrets: a server's Env reaches only that server's process (whose
// environment is otherwise a small allowlist of the worker's: PATH, HOME,
// ...), its Headers only its HTTP requests; neither is ever logged, and a
// server's stderr is discarded (it may print its environment). Nothing of
// them is on a command line: the worker reads them from its config file.
package mcptools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Bounds of the connection to a server and of its calls.
const (
	// CallTimeoutDefault bounds one tool call unless the server's config
	// says otherwise.
	CallTimeoutDefault = 60 * time.Second
	// ConnectTimeout bounds starting a server and listing its tools.
	ConnectTimeout = 30 * time.Second
	// TerminateGrace is how long a stopping stdio server has after its
	// stdin closed before SIGTERM (then SIGKILL after as long again).
	TerminateGrace = 2 * time.Second
	// ToolNameBytesMax bounds a prefixed tool name (what model APIs accept).
	ToolNameBytesMax = 64
	// ResultTextBytesMax bounds the text of one call's result the model sees.
	ResultTextBytesMax = 256 << 10
)

// Separator joins a server's name and its tool's: `<server>__<tool>`.
const Separator = "__"

// envAllowed are the worker's environment variables a stdio server gets
// besides its own Env.
var envAllowed = []string{"PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR"}

var serverName = regexp.MustCompile(`^[A-Za-z0-9-]{1,32}$`)

// ServerConfig is one MCP server of a worker's config (JSON, as in the
// worker's --mcp-config file; docs/mcp.md).
type ServerConfig struct {
	// Name prefixes the server's tools (^[A-Za-z0-9-]{1,32}$, unique).
	Name string `json:"name"`
	// Command (and Args, Dir) start a stdio server; Env is added to its
	// environment (secrets go here, never in Args).
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Dir     string            `json:"dir,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// URL is a streamable HTTP server's endpoint; Headers go with each of
	// its requests (e.g. Authorization).
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// CallTimeout bounds one tool call ("30s"; default CallTimeoutDefault).
	CallTimeout string `json:"callTimeout,omitempty"`
}

// File is a worker's MCP config file: {"servers": [...]}.
type File struct {
	Servers []ServerConfig `json:"servers"`
}

// LoadFile reads and checks a config file.
func LoadFile(path string) ([]ServerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := Validate(f.Servers); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f.Servers, nil
}

// Validate checks server configs: names valid and unique, one of command
// or url, a call timeout that parses.
func Validate(cfgs []ServerConfig) error {
	seen := map[string]bool{}
	for i, c := range cfgs {
		if !serverName.MatchString(c.Name) {
			return fmt.Errorf("server %d: name %q must match %s", i, c.Name, serverName)
		}
		if seen[c.Name] {
			return fmt.Errorf("server %q named twice", c.Name)
		}
		seen[c.Name] = true
		if (c.Command == "") == (c.URL == "") {
			return fmt.Errorf("server %q: give exactly one of command (stdio) or url (streamable HTTP)", c.Name)
		}
		if c.URL != "" {
			u, err := url.Parse(c.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("server %q: url must be an http(s) URL", c.Name)
			}
		}
		if c.CallTimeout != "" {
			if d, err := time.ParseDuration(c.CallTimeout); err != nil || d <= 0 {
				return fmt.Errorf("server %q: callTimeout %q must be a positive duration", c.Name, c.CallTimeout)
			}
		}
	}
	return nil
}

// Set is a worker's connected MCP servers and their tools.
type Set struct {
	servers []*server
	tools   []*agent.Tool
}

// Start connects to every server (each within ConnectTimeout) and lists its
// tools. A server that cannot be reached fails the whole start: a worker
// never serves a descriptor whose tools it cannot call.
func Start(ctx context.Context, cfgs []ServerConfig, log *slog.Logger) (*Set, error) {
	if err := Validate(cfgs); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Set{}
	names := map[string]string{}
	for _, c := range cfgs {
		sv := &server{cfg: c, log: log.With("mcpServer", c.Name), timeout: CallTimeoutDefault}
		if c.CallTimeout != "" {
			sv.timeout, _ = time.ParseDuration(c.CallTimeout)
		}
		s.servers = append(s.servers, sv)
		cctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
		tools, err := sv.listTools(cctx)
		cancel()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("MCP server %q: %w", c.Name, err)
		}
		for _, t := range tools {
			name := ToolName(c.Name, t.Name)
			if other, dup := names[name]; dup {
				s.Close()
				return nil, fmt.Errorf("MCP server %q: tools %q and %q are both %s", c.Name, other, t.Name, name)
			}
			names[name] = t.Name
			s.tools = append(s.tools, sv.tool(name, t))
		}
		sv.log.Info("MCP server connected", "tools", len(tools), "transport", sv.transportName())
	}
	return s, nil
}

// Tools are the servers' tools for an agent's registry, in config order.
func (s *Set) Tools() []*agent.Tool { return append([]*agent.Tool(nil), s.tools...) }

// Names are the prefixed tool names (for the provider descriptor).
func (s *Set) Names() []string {
	out := make([]string, len(s.tools))
	for i, t := range s.tools {
		out[i] = t.Name
	}
	return out
}

// Close disconnects every server (a stdio server's process is stopped:
// stdin closed, then SIGTERM after TerminateGrace, then SIGKILL).
func (s *Set) Close() {
	if s == nil {
		return
	}
	for _, sv := range s.servers {
		sv.close()
	}
}

// ToolName is a server's tool as the model sees it: `<server>__<tool>`,
// with any character outside [A-Za-z0-9_-] replaced by `_`, at most
// ToolNameBytesMax bytes.
func ToolName(serverName, tool string) string {
	var b strings.Builder
	b.WriteString(serverName + Separator)
	for _, r := range tool {
		if r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) > ToolNameBytesMax {
		name = name[:ToolNameBytesMax]
	}
	return name
}

// server is one configured MCP server and its current session (nil until
// connected, and again after a broken connection).
type server struct {
	cfg     ServerConfig
	log     *slog.Logger
	timeout time.Duration

	mu     sync.Mutex
	sess   *mcp.ClientSession
	closed bool
}

func (sv *server) transportName() string {
	if sv.cfg.URL != "" {
		return "streamable-http"
	}
	return "stdio"
}

func (sv *server) transport() mcp.Transport {
	if sv.cfg.URL != "" {
		hc := &http.Client{Transport: headerTransport{headers: sv.cfg.Headers, base: http.DefaultTransport}}
		return &mcp.StreamableClientTransport{Endpoint: sv.cfg.URL, HTTPClient: hc, MaxRetries: 1, DisableStandaloneSSE: true}
	}
	cmd := exec.Command(sv.cfg.Command, sv.cfg.Args...)
	cmd.Dir = sv.cfg.Dir
	cmd.Env = serverEnv(sv.cfg.Env)
	cmd.Stderr = nil // discarded: a server may print its environment
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: TerminateGrace}
}

// serverEnv is a stdio server's environment: the allowed part of the
// worker's, then the server's own.
func serverEnv(own map[string]string) []string {
	var env []string
	for _, k := range envAllowed {
		if v, ok := os.LookupEnv(k); ok {
			if _, mine := own[k]; !mine {
				env = append(env, k+"="+v)
			}
		}
	}
	for k, v := range own {
		env = append(env, k+"="+v)
	}
	return env
}

type headerTransport struct {
	headers map[string]string
	base    http.RoundTripper
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(t.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range t.headers {
			r.Header.Set(k, v)
		}
	}
	return t.base.RoundTrip(r)
}

// session returns the connected session, connecting first when there is
// none (again after a broken connection).
func (sv *server) session(ctx context.Context) (*mcp.ClientSession, error) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.closed {
		return nil, errors.New("the worker is stopping")
	}
	if sv.sess != nil {
		return sv.sess, nil
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "brood-worker", Version: "1"}, nil)
	sess, err := c.Connect(ctx, sv.transport(), nil)
	if err != nil {
		return nil, scrub(err, sv.cfg)
	}
	sv.sess = sess
	go func() {
		// A stdio server that exits ends its session: the next call starts it again.
		_ = sess.Wait()
		sv.drop(sess)
	}()
	return sess, nil
}

// drop forgets sess (closed) so the next call connects again.
func (sv *server) drop(sess *mcp.ClientSession) {
	sv.mu.Lock()
	if sv.sess == sess {
		sv.sess = nil
	}
	sv.mu.Unlock()
	_ = sess.Close()
}

func (sv *server) close() {
	sv.mu.Lock()
	sv.closed = true
	sess := sv.sess
	sv.sess = nil
	sv.mu.Unlock()
	if sess != nil {
		_ = sess.Close()
	}
}

func (sv *server) listTools(ctx context.Context) ([]*mcp.Tool, error) {
	sess, err := sv.session(ctx)
	if err != nil {
		return nil, err
	}
	var tools []*mcp.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return nil, scrub(err, sv.cfg)
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// tool is the agent tool that calls t on this server.
func (sv *server) tool(name string, t *mcp.Tool) *agent.Tool {
	params := json.RawMessage(`{"type":"object"}`)
	if t.InputSchema != nil {
		if data, err := json.Marshal(t.InputSchema); err == nil {
			params = data
		}
	}
	desc := fmt.Sprintf("[MCP server %s] %s", sv.cfg.Name, t.Description)
	remote := t.Name
	return &agent.Tool{Name: name, Description: desc, Parameters: params, Idempotent: Idempotent(t.Annotations),
		Run: func(ctx context.Context, _ agent.ToolContext, args string) agent.ToolResult {
			return sv.call(ctx, remote, args)
		}}
}

// Idempotent reports whether a server's tool may run twice with the
// effect of once, from its MCP annotations (nil: none): readOnlyHint (it
// changes nothing) or idempotentHint (a repeat with the same arguments
// changes nothing more). Such a tool's call, logged without its result
// when its host died, is run again by the host that continues the turn;
// any other gets a result saying a host loss interrupted it
// (agent.Tool.Idempotent; docs/protocol.md §8.4, "Continued after a host
// loss"). The hints are the server's word: the worker's config names the
// servers it trusts (docs/mcp.md).
func Idempotent(a *mcp.ToolAnnotations) bool {
	return a != nil && (a.ReadOnlyHint || a.IdempotentHint)
}

// call calls tool with the model's JSON arguments, within the server's call
// timeout. Every failure is a tool error the model sees; a broken
// connection is dropped, so the next call connects again.
func (sv *server) call(ctx context.Context, tool, args string) agent.ToolResult {
	var in map[string]any
	if strings.TrimSpace(args) != "" {
		if err := json.Unmarshal([]byte(args), &in); err != nil {
			return agent.ErrorResult("invalid arguments for %s (a JSON object expected): %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, sv.timeout)
	defer cancel()
	sess, err := sv.session(ctx)
	if err != nil {
		return agent.ErrorResult("MCP server %s is not reachable: %v", sv.cfg.Name, err)
	}
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: in})
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return agent.ErrorResult("MCP server %s: %s did not answer within %s", sv.cfg.Name, tool, sv.timeout)
	case ctx.Err() != nil:
		return agent.ErrorResult("MCP server %s: %s cancelled", sv.cfg.Name, tool)
	default:
		var wire *jsonrpc.Error
		if errors.As(err, &wire) {
			return agent.ErrorResult("MCP server %s: %s: %v", sv.cfg.Name, tool, scrub(err, sv.cfg))
		}
		// The connection broke (the server crashed or went away).
		sv.drop(sess)
		sv.log.Warn("MCP server call failed; reconnecting on the next call", "tool", tool, "err", scrub(err, sv.cfg))
		return agent.ErrorResult("MCP server %s failed during %s: %v", sv.cfg.Name, tool, scrub(err, sv.cfg))
	}
	out := agent.ToolResult{IsError: res.IsError}
	var text []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			text = append(text, c.Text)
		case *mcp.ImageContent:
			text = append(text, fmt.Sprintf("[image %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			text = append(text, fmt.Sprintf("[audio %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *mcp.EmbeddedResource:
			if c.Resource != nil {
				text = append(text, c.Resource.Text)
			}
		case *mcp.ResourceLink:
			text = append(text, "[resource "+c.URI+"]")
		}
	}
	if len(text) == 0 && res.StructuredContent != nil {
		if data, err := json.Marshal(res.StructuredContent); err == nil {
			text = append(text, string(data))
		}
	}
	s := strings.Join(text, "\n")
	if len(s) > ResultTextBytesMax {
		s = strings.ToValidUTF8(s[:ResultTextBytesMax], "") + "\n[truncated]"
	}
	out.Content = protocol.Text(s)
	return out
}

// scrub removes the server's secrets (its Env and Headers values) from an
// error's text, in case an error quotes them.
func scrub(err error, c ServerConfig) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, m := range []map[string]string{c.Env, c.Headers} {
		for _, v := range m {
			if len(v) >= 4 {
				msg = strings.ReplaceAll(msg, v, "[redacted]")
			}
		}
	}
	return errors.New(msg)
}
