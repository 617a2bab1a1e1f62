// Package acpio is the stdio plumbing of ACP agent processes (docs/design.md §6;
// docs/upstream-behaviour.md §4): an allowlisted environment, a process group that
// teardown signals reach grandchildren through, the EOF → SIGTERM → SIGKILL
// ladder, a bounded tail of stderr, and a filter in front of the ACP SDK's
// reader that forwards only JSON-object lines.
package acpio

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
)

// secretName matches environment names that carry credentials
// (docs/upstream-behaviour.md §4, step 4).
var secretName = regexp.MustCompile(`(?i)KEY|PASSWORD|SECRET|TOKEN`)

// IsSecretName reports whether an environment name looks like a credential.
func IsSecretName(name string) bool { return secretName.MatchString(name) }

// BaseEnvNames are the variables of the bridge's environment every ACP agent
// gets without naming them: what a program needs to find its tools, its home
// and its locale, and nothing that carries a credential (docs/security.md,
// "Secrets stay home"). An agent's config overrides any of them by naming
// it with a value.
var BaseEnvNames = []string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ"}

// AgentEnv returns the environment of an ACP agent, an allowlist: the
// BaseEnvNames of parent (the bridge's environment, KEY=VALUE entries), then
// the variables pass names, taken from parent (absent there: absent), then
// explicit layered on top. Nothing else of parent reaches the agent, whatever
// its name: not OTEL_EXPORTER_OTLP_HEADERS, DATABASE_URL, a proxy's URL,
// GITHUB_PAT, SSH_AUTH_SOCK, nor Brood's own settings. The result is sorted.
func AgentEnv(parent []string, pass []string, explicit map[string]string) []string {
	have := envMap(parent)
	env := map[string]string{}
	for _, name := range BaseEnvNames {
		if v, ok := have[name]; ok {
			env[name] = v
		}
	}
	for _, name := range pass {
		if v, ok := have[name]; ok {
			env[name] = v
		}
	}
	for name, value := range explicit {
		env[name] = value
	}
	out := make([]string, 0, len(env))
	for name, value := range env {
		out = append(out, name+"="+value)
	}
	sort.Strings(out)
	return out
}

func envMap(kvs []string) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		if name, value, ok := strings.Cut(kv, "="); ok && name != "" {
			m[name] = value
		}
	}
	return m
}

// RedactBytesMin is the shortest value a Redactor replaces: shorter ones
// ("1", "true", "C") would mangle the text without hiding anything.
const RedactBytesMin = 6

// Redactor replaces, in text an ACP agent wrote (its stderr, its error
// messages), every value it must not show: each value of the bridge's
// environment (but the BaseEnvNames', which every agent has anyway), the
// password of each URL among them, each value of a comma-separated
// KEY=VALUE list among them (OTEL_EXPORTER_OTLP_HEADERS), and each value the
// agent's config sets under a credential-like name; all of at least
// RedactBytesMin bytes, longest first.
type Redactor struct{ values []string }

// NewRedactor builds the Redactor of an agent started from parent (the
// bridge's environment) with explicit (its config's values).
func NewRedactor(parent []string, explicit map[string]string) *Redactor {
	seen := map[string]bool{}
	var vals []string
	add := func(v string) {
		v = strings.TrimSpace(v)
		if len(v) >= RedactBytesMin && !seen[v] {
			seen[v] = true
			vals = append(vals, v)
		}
	}
	base := map[string]bool{}
	for _, n := range BaseEnvNames {
		base[n] = true
	}
	for name, v := range envMap(parent) {
		if base[name] {
			continue
		}
		add(v)
		for _, part := range strings.Split(v, ",") {
			if u, err := url.Parse(strings.TrimSpace(part)); err == nil && u.User != nil {
				if pw, ok := u.User.Password(); ok {
					add(pw)
				}
			}
			if _, pv, ok := strings.Cut(part, "="); ok {
				add(pv)
				// "authorization=Bearer TOKEN": the token alone, too.
				if _, tok, ok := strings.Cut(strings.TrimSpace(pv), " "); ok {
					add(tok)
				}
			}
		}
	}
	for name, v := range explicit {
		if IsSecretName(name) {
			add(v)
		}
	}
	sort.Slice(vals, func(i, j int) bool { return len(vals[i]) > len(vals[j]) })
	return &Redactor{values: vals}
}

// Redact returns s with every value of r replaced by "[redacted]". A nil
// Redactor replaces nothing.
func (r *Redactor) Redact(s string) string {
	if r == nil {
		return s
	}
	for _, v := range r.values {
		s = strings.ReplaceAll(s, v, "[redacted]")
	}
	return s
}

// ValidateDir checks that dir can be an ACP agent's workspace: an absolute
// path naming a directory this process may enter (execute permission;
// docs/upstream-behaviour.md §8, item 15: "is a directory" is not enough).
func ValidateDir(dir string) error {
	if dir == "" {
		return fmt.Errorf("no workspace directory is known")
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("workspace %q is not an absolute path", dir)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("workspace %q: %v", dir, unwrapPath(err))
	}
	if !fi.IsDir() {
		return fmt.Errorf("workspace %q is not a directory", dir)
	}
	const xOK = 1 // access(2) X_OK: search permission on a directory
	if err := syscall.Access(dir, xOK); err != nil {
		return fmt.Errorf("workspace %q cannot be entered: %w", dir, err)
	}
	return nil
}

func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
