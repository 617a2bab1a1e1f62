package main

import (
	"strings"
	"testing"
)

// TestInboxPrefixFollowsTheUser: every process's connection gets the inbox
// prefix of its user (_INBOX.<user>), from $BROOD_NATS_USER or the URL, so
// a deployment can let each user subscribe only under its own (issue 17).
func TestInboxPrefixFollowsTheUser(t *testing.T) {
	for _, tc := range []struct {
		name, url, user, override, want, err string
	}{
		{name: "no user", url: "nats://127.0.0.1:4222", want: ""},
		{name: "env user", url: "nats://127.0.0.1:4222", user: "client", want: "_INBOX.client"},
		{name: "URL user", url: "nats://worker:pw@127.0.0.1:4222,nats://worker:pw@127.0.0.1:4223", want: "_INBOX.worker"},
		{name: "env wins over URL", url: "nats://worker:pw@127.0.0.1:4222", user: "trusted-host", want: "_INBOX.trusted-host"},
		{name: "override", url: "nats://127.0.0.1:4222", user: "client", override: "_INBOX.team.alice", want: "_INBOX.team.alice"},
		{name: "wildcard override", url: "nats://127.0.0.1:4222", override: "_INBOX.*", err: "must be a subject without wildcards"},
		{name: "user not a token", url: "nats://127.0.0.1:4222", user: "a.b", err: "cannot name its inbox prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envNATSUser, tc.user)
			t.Setenv(envNATSInboxPrefix, tc.override)
			got, err := inboxPrefix(tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("inboxPrefix = %q, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("inboxPrefix = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestNATSAuthComesFromTheEnvironment: a user and password, or a
// credentials file, from the environment, never both; a password alone is
// refused rather than silently ignored.
func TestNATSAuthComesFromTheEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name, user, pass, creds string
		opts                    int
		err                     string
	}{
		{name: "none", opts: 0},
		{name: "user and password", user: "client", pass: "pw", opts: 1},
		{name: "credentials file", creds: "/etc/brood/client.creds", opts: 1},
		{name: "both", user: "client", pass: "pw", creds: "/x.creds", err: "not both"},
		{name: "password alone", pass: "pw", err: "without $BROOD_NATS_USER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envNATSUser, tc.user)
			t.Setenv(envNATSPassword, tc.pass)
			t.Setenv(envNATSCreds, tc.creds)
			opts, err := natsAuth()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("natsAuth = %v; want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil || len(opts) != tc.opts {
				t.Fatalf("natsAuth = %d options, %v; want %d", len(opts), err, tc.opts)
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
