package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// No usable shared secret ships (issue 29, item 2; docs/security.md, "No
// usable shared secret ships"): no file of deploy/ holds a credential that
// works as shipped. Passwords come from the environment (nats-server's
// $BROOD_NATS_*_PASSWORD, compose's .env, a Kubernetes Secret the operator
// creates), routes authenticate by certificates `brood route-tls` generates
// at set-up, and every sample value is empty.

// A secret finding: where, and what.
type secretFinding struct {
	file string
	line int
	what string
}

var (
	// A URL with a password in it: nats-route://user:password@host.
	urlPasswordRE = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@"'<>]+:([^@\s"'/]+)@`)
	// NAME: value or NAME=value, NAME naming a credential.
	credentialRE = regexp.MustCompile(`(?i)([A-Za-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key|private[_-]?key)[A-Za-z0-9_.-]*)["']?\s*[:=]\s*("[^"]*"|'[^']*'|[^\s,;#}\]]+)`)
	// A private key block.
	privateKeyRE = regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----`)
)

// placeholder reports whether a value is no credential: empty, taken from
// elsewhere ($VAR, ${VAR}, $(command)), a placeholder in angle brackets
// or dots, or a boolean.
func placeholder(v string) bool {
	v = strings.Trim(strings.TrimSpace(v), `"'`)
	switch {
	case v == "", strings.Contains(v, "$"), strings.Trim(v, ".…") == "":
		return true
	case strings.HasPrefix(v, "<"): // <the client password>
		return true
	case v == "true" || v == "false": // automountServiceAccountToken: false
		return true
	case strings.HasPrefix(v, "%"): // a printf verb: the value comes after
		return true
	}
	return false
}

// scanSecrets reports the usable credentials in text (of file name).
func scanSecrets(name, text string) []secretFinding {
	var out []secretFinding
	for i, line := range strings.Split(text, "\n") {
		for _, m := range urlPasswordRE.FindAllStringSubmatch(line, -1) {
			if !placeholder(m[1]) {
				out = append(out, secretFinding{name, i + 1, "a password in the URL " + m[0]})
			}
		}
		comment := strings.HasPrefix(strings.TrimSpace(line), "#")
		for _, m := range credentialRE.FindAllStringSubmatch(line, -1) {
			// In a comment, "a secret: mount your own" is prose; a
			// NAME=value there is a command to copy, and checked.
			if comment && !strings.Contains(m[0], "=") {
				continue
			}
			if !placeholder(m[2]) && !credentialReference(m[1], m[2]) {
				out = append(out, secretFinding{name, i + 1, m[1] + " = " + m[2]})
			}
		}
		if privateKeyRE.MatchString(line) {
			out = append(out, secretFinding{name, i + 1, "a private key"})
		}
	}
	return out
}

// credentialReference reports a name = value that names where a credential
// is, not the credential: a file holding it (*_FILE, *_file, a path), a
// Kubernetes Secret or its key (secretName, a value naming a password key).
func credentialReference(name, value string) bool {
	v := strings.Trim(value, `"'`)
	n := strings.ToLower(name)
	switch {
	case strings.HasSuffix(n, "_file") || strings.HasSuffix(n, "-file"):
		return true
	case strings.HasSuffix(n, "name") || strings.HasSuffix(n, "ref"): // secretName, secretKeyRef
		return true
	case strings.HasPrefix(v, "/") || strings.HasPrefix(v, "./"):
		return true
	case strings.HasSuffix(strings.ToLower(v), "-password") || strings.HasSuffix(strings.ToLower(v), "_password"):
		return true // "key: worker-spawn-password" names a Secret's key
	}
	return false
}

// deployFiles lists every file of deploy/ but the Go tests (which hold the
// tests' own passwords) and ignored files (a compose .env).
func deployFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || strings.HasSuffix(p, ".go") || filepath.Base(p) == ".env" {
			return nil
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDeployShipsNoUsableSecret scans every file of deploy/.
func TestDeployShipsNoUsableSecret(t *testing.T) {
	files := deployFiles(t)
	if len(files) < 20 {
		t.Fatalf("only %d files found under deploy/: %v", len(files), files)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range scanSecrets(f, string(data)) {
			t.Errorf("%s:%d: %s", s.file, s.line, s.what)
		}
	}
}

// TestTheSecretScannerFindsWhatShipped: the scanner finds what deploy/
// shipped before (the route password in the node configs and their route
// URLs, the Secret's sample values, a password in an env file line), and
// passes what deploy/ holds now (values from the environment, empty
// samples, references to a Secret's key or a password file).
func TestTheSecretScannerFindsWhatShipped(t *testing.T) {
	tests := []struct {
		text string
		want int
	}{
		{`  authorization {
    user: brood-route
    password: "change-me-route-secret"
  }
  routes: [
    "nats-route://brood-route:change-me-route-secret@127.0.0.1:6223"
  ]`, 2},
		{"stringData:\n  admin-password: CHANGE-ME\n  coordinator-password: CHANGE-ME", 2},
		{`#   printf 'BROOD_NATS_USER=worker-spawn\nBROOD_NATS_PASSWORD=PASSWORD\n' > /etc/brood/spawn-worker.env`, 1},
		{"BROOD_NATS_CLIENT_PASSWORD=hunter2hunter2", 1},
		{"token: abcdef0123456789", 1},
		{"-----BEGIN EC PRIVATE KEY-----", 1},
		{"# BROOD_NATS_PASSWORD=hunter2hunter2 in a comment", 1},
		{`password: $BROOD_NATS_ADMIN_PASSWORD
BROOD_NATS_PASSWORD: ${BROOD_NATS_ADMIN_PASSWORD}
BROOD_NATS_COORDINATOR_PASSWORD: ${BROOD_NATS_COORDINATOR_PASSWORD:?set it in deploy/compose/.env}
export BROOD_NATS_SYS_PASSWORD=p$(openssl rand -hex 16)
BROOD_NATS_CLIENT_PASSWORD=
  admin-password: ""
                  key: worker-spawn-password
BROOD_NATS_PASSWORD_FILE=/run/secrets/brood
    --from-literal=admin-password='...'
    "nats-route://127.0.0.1:6223"
  # Its callers file is a secret: mount your own
          secretName: brood-nats
printf '{"tokenSha256":"%s","natsPassword":"%s"}'`, 0},
	}
	for _, tt := range tests {
		if got := scanSecrets("sample", tt.text); len(got) != tt.want {
			t.Errorf("scanSecrets(%q) found %d: %+v; want %d", tt.text, len(got), got, tt.want)
		}
	}
}
