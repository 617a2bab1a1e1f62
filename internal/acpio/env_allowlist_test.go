package acpio

import (
	"strings"
	"testing"
)

// TestAgentEnvIsAnAllowlist (issue 29, item 6): an ACP agent gets the base
// variables, the ones its config passes through and the ones it sets, and
// nothing else of the bridge's environment whatever the names.
func TestAgentEnvIsAnAllowlist(t *testing.T) {
	parent := []string{
		"PATH=/bin", "HOME=/home/u", "LANG=C", "TZ=UTC", "TMPDIR=/tmp/u", "LC_ALL=C",
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer t", "DATABASE_URL=postgres://u:p@db/x",
		"HTTPS_PROXY=http://u:p@proxy:3128", "GITHUB_PAT=ghp_x", "SSH_AUTH_SOCK=/run/ssh.sock",
		"BROOD_NATS_URL=nats://x", "DISPLAY=:0", "URLS=nats://a,nats://b", "noequals", "=empty",
	}
	tests := []struct {
		name     string
		pass     []string
		explicit map[string]string
		want     []string
	}{
		{"nothing named: the base only", nil, nil,
			[]string{"HOME=/home/u", "LANG=C", "LC_ALL=C", "PATH=/bin", "TMPDIR=/tmp/u", "TZ=UTC"}},
		{"passed through, a value with commas, one the bridge lacks", []string{"URLS", "BROOD_NATS_URL", "ABSENT"}, nil,
			[]string{"BROOD_NATS_URL=nats://x", "HOME=/home/u", "LANG=C", "LC_ALL=C", "PATH=/bin", "TMPDIR=/tmp/u", "TZ=UTC", "URLS=nats://a,nats://b"}},
		{"set values win over the base and over passed ones", []string{"URLS"}, map[string]string{"HOME": "/srv/codex", "URLS": "x", "CODEX_API_KEY": "sk"},
			[]string{"CODEX_API_KEY=sk", "HOME=/srv/codex", "LANG=C", "LC_ALL=C", "PATH=/bin", "TMPDIR=/tmp/u", "TZ=UTC", "URLS=x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AgentEnv(parent, tt.pass, tt.explicit); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("AgentEnv = %v\nwant %v", got, tt.want)
			}
		})
	}
}

// TestRedactorHidesTheBridgesEnvironment: every value of the bridge's
// environment but the base's, URL passwords, the values of KEY=VALUE lists
// and a bearer token alone, and the config's credentials are redacted;
// short values and the base's values are not.
func TestRedactorHidesTheBridgesEnvironment(t *testing.T) {
	r := NewRedactor([]string{
		"PATH=/usr/local/bin:/usr/bin", "HOME=/home/bridge",
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer otel-tok-123,x-team=team-secret",
		"DATABASE_URL=postgres://brood:dbpass99@db:5432/brood",
		"HTTPS_PROXY=http://pu:proxypw77@proxy:3128",
		"GITHUB_PAT=ghp_abcdef", "SHORT=abc", "FLAG=1",
	}, map[string]string{"CODEX_API_KEY": "sk-explicit", "HOME": "/srv/codex"})
	tests := []struct{ in, want string }{
		{"token otel-tok-123 refused", "token [redacted] refused"},
		{"header x-team: team-secret", "header x-team: [redacted]"},
		{"connect postgres://brood:dbpass99@db:5432/brood: refused", "connect [redacted]: refused"},
		{"auth dbpass99 failed", "auth [redacted] failed"},
		{"proxy said proxypw77", "proxy said [redacted]"},
		{"pat ghp_abcdef", "pat [redacted]"},
		{"key sk-explicit", "key [redacted]"},
		{"abc 1 /home/bridge /usr/local/bin:/usr/bin /srv/codex", "abc 1 /home/bridge /usr/local/bin:/usr/bin /srv/codex"},
	}
	for _, tt := range tests {
		if got := r.Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	var none *Redactor
	if got := none.Redact("ghp_abcdef"); got != "ghp_abcdef" {
		t.Errorf("a nil Redactor changed the text: %q", got)
	}
}
