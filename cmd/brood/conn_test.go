package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestNATSUserComesFromTheEnvironment: a process's NATS user and password
// come from the environment (or a password file), never its command line;
// a user in the URL still works. The user names the connection's inbox
// prefix and coordinator subjects, so it must be a subject token (issue 17).
func TestNATSUserComesFromTheEnvironment(t *testing.T) {
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte("fromFile1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, url, user, pass, passFile string
		wantUser, wantPass, err         string
	}{
		{name: "nobody", url: "nats://127.0.0.1:4222"},
		{name: "environment", url: "nats://127.0.0.1:4222", user: "client", pass: "pw1", wantUser: "client", wantPass: "pw1"},
		{name: "password file", url: "nats://127.0.0.1:4222", user: "worker", passFile: file, wantUser: "worker", wantPass: "fromFile1"},
		{name: "URL", url: "nats://worker:pw2@127.0.0.1:4222,nats://worker:pw2@127.0.0.1:4223", wantUser: "worker", wantPass: "pw2"},
		{name: "environment wins", url: "nats://worker:pw2@127.0.0.1:4222", user: "trusted-host", pass: "pw3", wantUser: "trusted-host", wantPass: "pw3"},
		{name: "both passwords", url: "nats://127.0.0.1:4222", user: "client", pass: "pw", passFile: file, err: "not both"},
		{name: "password alone", url: "nats://127.0.0.1:4222", pass: "pw", err: "without $BROOD_NATS_USER"},
		{name: "user not a token", url: "nats://127.0.0.1:4222", user: "a.b", err: "must match"},
		{name: "missing file", url: "nats://127.0.0.1:4222", user: "client", passFile: file + ".nope", err: "BROOD_NATS_PASSWORD_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envNATSUser, tc.user)
			t.Setenv(envNATSPassword, tc.pass)
			t.Setenv(envNATSPasswordFile, tc.passFile)
			user, pass, err := natsUser(tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("natsUser = %q, %v; want an error with %q", user, err, tc.err)
				}
				return
			}
			if err != nil || user != tc.wantUser || pass != tc.wantPass {
				t.Fatalf("natsUser = %q, %q, %v; want %q, %q", user, pass, err, tc.wantUser, tc.wantPass)
			}
		})
	}
}

func TestRedactURLHidesPasswords(t *testing.T) {
	got := redactURL("nats://client:secret1@127.0.0.1:4222,nats://127.0.0.1:4223")
	if strings.Contains(got, "secret1") || !strings.Contains(got, "127.0.0.1:4223") {
		t.Fatalf("redactURL = %q", got)
	}
}

// TestAWrongNATSPasswordIsAuthenticationFailed: a client verb whose NATS
// password the server refuses exits with AUTHENTICATION_FAILED (not
// retryable), never UNAVAILABLE's "retry later", and does not print the
// password; with the right password the same verb gets past the dial (here
// UNAVAILABLE: no coordinator runs) (issue 37, item 2).
func TestAWrongNATSPasswordIsAuthenticationFailed(t *testing.T) {
	s := testutil.ServerWithUsers(t, []*server.User{{Username: "client", Password: "right-pw"}})
	addr := strings.TrimPrefix(s.ClientURL(), "nats://")
	for _, tc := range []struct {
		name, password string
		want           protocol.Code
	}{
		{"a wrong password", "wrong-pw", protocol.CodeAuthenticationFailed},
		{"the right password", "right-pw", protocol.CodeUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envNATSUser, "client")
			t.Setenv(envNATSPassword, tc.password)
			t.Setenv(envNATSPasswordFile, "")
			var out, errb bytes.Buffer
			code := execute([]string{"providers", "--nats", "nats://" + addr, "--timeout", "2s"}, &out, &errb)
			if code != 1 || !strings.HasPrefix(errb.String(), string(tc.want)+": ") {
				t.Fatalf("exit %d, stderr %q; want exit 1 and %s first", code, errb.String(), tc.want)
			}
			if strings.Contains(errb.String(), tc.password) {
				t.Fatalf("stderr shows the password: %q", errb.String())
			}
			if tc.want.Retryable() != (tc.want == protocol.CodeUnavailable) {
				t.Fatalf("%s retryable %v", tc.want, tc.want.Retryable())
			}
		})
	}
}
