// Package acpio is the stdio plumbing of ACP agent processes (docs/design.md §6;
// docs/upstream-behaviour.md §4): a scrubbed environment, a process group that
// teardown signals reach grandchildren through, the EOF → SIGTERM → SIGKILL
// ladder, a bounded tail of stderr, and a filter in front of the ACP SDK's
// reader that forwards only JSON-object lines.
package acpio

import (
	"fmt"
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

// ScrubbedPrefix is dropped from the child's environment like upstream's
// DSH_*: a Brood process's own settings are no business of an ACP agent.
const ScrubbedPrefix = "BROOD_"

// IsSecretName reports whether an environment name looks like a credential.
func IsSecretName(name string) bool { return secretName.MatchString(name) }

// ScrubEnv returns the environment of an ACP agent: parent (KEY=VALUE
// entries) without the names matching KEY, PASSWORD, SECRET or TOKEN (any
// case) and without BROOD_* names, then explicit layered on top. Explicit
// entries survive whatever their names (a provider that needs a credential
// sets it in its configuration). The result is sorted by name.
func ScrubEnv(parent []string, explicit map[string]string) []string {
	env := map[string]string{}
	for _, kv := range parent {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" || IsSecretName(name) || strings.HasPrefix(strings.ToUpper(name), ScrubbedPrefix) {
			continue
		}
		env[name] = value
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

// SecretValues returns the values of explicit entries whose names look like
// credentials, so diagnostics built from the agent's stderr can redact them.
// Values shorter than 4 bytes are skipped (redacting them would mangle text).
func SecretValues(explicit map[string]string) []string {
	var out []string
	for name, value := range explicit {
		if IsSecretName(name) && len(value) >= 4 {
			out = append(out, value)
		}
	}
	return out
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
