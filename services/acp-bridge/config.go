package acpbridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/acpio"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Policy is how an ACP child's permission requests (`session/request_permission`)
// are answered, chosen per agent (AgentConfig.Permission; docs/protocol.md
// §8.8, "ACP permissions"). Reject and allow are fixed answers for an
// unattended provider: nobody is asked. Ask routes each request to whoever
// may answer for the child (the user, or an ancestor agent), as a request
// for approval (docs/protocol.md §5.21, issue 33). Whatever the policy, a
// child whose tool ceiling denies any tool, and a request that arrives when
// no turn is running, are rejected without asking (fail closed,
// docs/design.md §7).
type Policy string

const (
	// PolicyReject selects the agent's reject_once option, else its
	// reject_always option, else answers `cancelled` (the default).
	PolicyReject Policy = "reject"
	// PolicyAllow selects the agent's allow_once option, else its
	// allow_always option, else answers `cancelled`.
	PolicyAllow Policy = "allow"
	// PolicyAsk opens a request for approval (requests.open, kind approval,
	// with the child's own credential; its callId the tool call's id as the
	// log records it, its tool the call's title, else its kind, its
	// arguments the call's raw input as JSON) and waits for its answer
	// (requests.get, backing off like every asking session,
	// requestwait.Await): approved selects allow_once, else allow_always;
	// denied or timed-out selects reject_once, else reject_always; when no
	// offered option fits, or the turn ends while the request waits, the
	// answer is `cancelled`. A request that cannot be opened is answered as
	// a denial. Options.Requests must be set (New sets it).
	PolicyAsk Policy = "ask"
)

// AgentConfig is one ACP agent served as a provider: `claude-code`, `codex`,
// `gemini` or Brood's own `acp-agent`. Its environment is an allowlist
// (acpio.AgentEnv; docs/security.md, "Secrets stay home"): the bridge's
// acpio.BaseEnvNames, the variables PassEnv names taken from the bridge's
// environment, and Env's values, and nothing else of the bridge's
// environment, so a credential the agent needs must be named here.
// Cwd overrides the parent's workspace as the child's cwd.
type AgentConfig struct {
	Name    string            `json:"name"`
	Command string            `json:"command"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// PassEnv names variables of the bridge's own environment the agent
	// gets with their values (a value with commas, a credential kept out of
	// the config file); one the bridge lacks is left out.
	PassEnv []string `json:"passEnv,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	// Permission answers the agent's permission requests: reject (the
	// default when empty), allow, or ask (Policy).
	Permission Policy `json:"permission,omitempty"`
}

// Validate checks the agent's configuration; a configured cwd must be an
// enterable absolute directory now (docs/upstream-behaviour.md §4, step 2).
func (a *AgentConfig) Validate() error {
	if !protocol.ValidID(a.Name) {
		return fmt.Errorf("ACP agent name %q must match ^[A-Za-z0-9_-]{1,64}$", a.Name)
	}
	if strings.TrimSpace(a.Command) == "" {
		return fmt.Errorf("ACP agent %s: command is required", a.Name)
	}
	switch a.Permission {
	case "":
		a.Permission = PolicyReject
	case PolicyReject, PolicyAllow, PolicyAsk:
	default:
		return fmt.Errorf("ACP agent %s: permission %q must be reject, allow or ask", a.Name, a.Permission)
	}
	for k := range a.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("ACP agent %s: env name %q is invalid", a.Name, k)
		}
	}
	for _, k := range a.PassEnv {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("ACP agent %s: passEnv name %q is invalid", a.Name, k)
		}
	}
	if a.Cwd != "" {
		if err := acpio.ValidateDir(a.Cwd); err != nil {
			return fmt.Errorf("ACP agent %s: cwd: %w", a.Name, err)
		}
	}
	return nil
}

// ParseAgentSpec reads the `--agent` flag: comma-separated key=value pairs
// with keys name, command, arg (repeatable, in order), env (repeatable:
// KEY=VALUE sets a value, a bare KEY passes the bridge's own variable KEY
// through, AgentConfig.PassEnv), cwd and permission (reject, the default,
// allow or ask: Policy), e.g.
//
//	name=codex,command=npx,arg=-y,arg=@zed-industries/codex-acp,env=HOME=/srv/codex,env=OPENAI_API_KEY,permission=reject
//
// A value cannot contain a comma; pass such a value through from the
// bridge's environment (env=NAME), or use a config file.
func ParseAgentSpec(spec string) (AgentConfig, error) {
	var a AgentConfig
	for _, part := range strings.Split(spec, ",") {
		key, value, ok := strings.Cut(part, "=")
		if !ok {
			return a, fmt.Errorf("--agent %q: %q is not key=value", spec, part)
		}
		switch strings.TrimSpace(key) {
		case "name":
			a.Name = value
		case "command":
			a.Command = value
		case "arg":
			a.Args = append(a.Args, value)
		case "env":
			k, v, ok := strings.Cut(value, "=")
			if !ok {
				a.PassEnv = append(a.PassEnv, value)
				continue
			}
			if a.Env == nil {
				a.Env = map[string]string{}
			}
			a.Env[k] = v
		case "cwd":
			a.Cwd = value
		case "permission":
			a.Permission = Policy(value)
		default:
			return a, fmt.Errorf("--agent %q: unknown key %q (known: name, command, arg, env, cwd, permission)", spec, key)
		}
	}
	return a, a.Validate()
}

// Duration is a time.Duration written as "60s" in a config file.
type Duration time.Duration

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"60s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// File is the bridge's config file (`brood acp-bridge --config FILE`):
//
//	{"agents": [{"name": "codex", "command": "codex-acp", "env": {"HOME": "/srv/codex"}, "passEnv": ["CODEX_API_KEY"], "permission": "allow"}],
//	 "silenceTimeout": "60s", "turnTimeout": "10m", "eofGrace": "6s", "termGrace": "3s"}
//
// Unknown fields are errors, so a typo never silently drops a setting.
type File struct {
	Agents         []AgentConfig `json:"agents"`
	SilenceTimeout Duration      `json:"silenceTimeout,omitempty"`
	TurnTimeout    Duration      `json:"turnTimeout,omitempty"`
	EOFGrace       Duration      `json:"eofGrace,omitempty"`
	TermGrace      Duration      `json:"termGrace,omitempty"`
}

// LoadFile reads and validates a config file.
func LoadFile(path string) (File, error) {
	var f File
	data, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	for i := range f.Agents {
		if err := f.Agents[i].Validate(); err != nil {
			return f, fmt.Errorf("%s: %w", path, err)
		}
	}
	return f, nil
}

// Apply copies the file's timing over o where the file sets it.
func (f File) Apply(o *Options) {
	set := func(dst *time.Duration, v Duration) {
		if v > 0 {
			*dst = time.Duration(v)
		}
	}
	set(&o.SilenceTimeout, f.SilenceTimeout)
	set(&o.TurnTimeout, f.TurnTimeout)
	set(&o.EOFGrace, f.EOFGrace)
	set(&o.TermGrace, f.TermGrace)
}
