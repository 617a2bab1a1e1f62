package integration

import (
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
	acpbridge "github.com/brood-dev/brood/services/acp-bridge"
)

// Secrets stay home (issue 29, item 6; docs/security.md, "Secrets stay
// home"): an ACP agent started by the bridge sees only PATH, HOME, LANG,
// LC_ALL, TMPDIR and TZ of the bridge's environment and the variables its
// config names; and a run's diagnostic carries a bounded end of the agent's
// stderr with every value of the bridge's environment redacted.

// bridgeEnviron is a bridge's environment holding the credentials of
// issue 29's item 6, and a value with commas (issue 37, item 8).
func bridgeEnviron() []string {
	return []string{
		"PATH=" + os.Getenv("PATH"), "HOME=/home/bridge", "LANG=C.UTF-8",
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer otel-ambient-token",
		"DATABASE_URL=postgres://brood:db-ambient-pw@db:5432/brood",
		"HTTPS_PROXY=http://proxyuser:proxy-ambient-pw@proxy:3128",
		"GITHUB_PAT=ghp_ambientPersonalToken",
		"SSH_AUTH_SOCK=/run/user/1000/ssh-agent.socket",
		"BROOD_NATS_PASSWORD=nats-ambient-pw",
		"AWS_SECRET_ACCESS_KEY=aws-ambient-secret",
		"PASSED_URLS=nats://a:4222,nats://b:4222",
		"PASSED_TOKEN=passed-through-token",
	}
}

func TestACPAgentSeesOnlyTheEnvironmentItsConfigNames(t *testing.T) {
	fake := fakeAgent(t)
	o := acpTestOptions(t)
	o.Environ = bridgeEnviron
	spec, err := acpbridge.ParseAgentSpec("name=fake-env,command=" + fake + ",env=MY_API_TOKEN=explicit-token,env=PASSED_URLS,env=PASSED_TOKEN,env=NOT_IN_THE_BRIDGE")
	if err != nil {
		t.Fatal(err)
	}
	s := acpStack(t, o, spec)
	root := s.Root(t.TempDir())

	t.Run("the agent's environment", func(t *testing.T) {
		_, res, _ := runFor(t, s, root.Ref(), "fake-env", "env", 30*time.Second)
		if res.StopReason != protocol.StopCompleted {
			t.Fatalf("result %+v", res)
		}
		got := strings.Split(protocol.PlainText(res.Output), "\n")
		want := []string{
			"HOME=/home/bridge", "LANG=C.UTF-8", "MY_API_TOKEN=explicit-token", "PATH=" + os.Getenv("PATH"),
			"PASSED_TOKEN=passed-through-token", "PASSED_URLS=nats://a:4222,nats://b:4222",
		}
		sort.Strings(want)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("the agent's environment:\n%s\nwant exactly:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})

	t.Run("its stderr in a diagnostic", func(t *testing.T) {
		// leak writes 8 KiB of filler, then its environment and the
		// bridge's ambient secrets it guessed, to stderr, and exits.
		_, res, _ := runFor(t, s, root.Ref(), "fake-env", "leak "+strings.Join([]string{
			"otel-ambient-token", "db-ambient-pw", "proxy-ambient-pw", "ghp_ambientPersonalToken", "nats-ambient-pw", "aws-ambient-secret",
		}, " "), 30*time.Second)
		d := res.Diagnostic
		if res.StopReason != protocol.StopError || !strings.Contains(d, "the end of its stderr: ") {
			t.Fatalf("result %s, diagnostic %q; want error with the end of its stderr", res.StopReason, d)
		}
		tail := d[strings.Index(d, "the end of its stderr: ")+len("the end of its stderr: "):]
		if len(tail) > acpbridge.StderrDiagnosticBytesMax {
			t.Errorf("the stderr in the diagnostic is %d bytes, over %d", len(tail), acpbridge.StderrDiagnosticBytesMax)
		}
		for _, secret := range []string{"explicit-token", "passed-through-token", "otel-ambient-token", "db-ambient-pw",
			"proxy-ambient-pw", "ghp_ambientPersonalToken", "nats-ambient-pw", "aws-ambient-secret", "nats://a:4222,nats://b:4222"} {
			if strings.Contains(d, secret) {
				t.Errorf("the diagnostic shows %q: %s", secret, d)
			}
		}
		for _, want := range []string{"MY_API_TOKEN=[redacted]", "PASSED_TOKEN=[redacted]", "guessed [redacted]", "LANG=C.UTF-8"} {
			if !strings.Contains(d, want) {
				t.Errorf("the diagnostic lacks %q: %s", want, d)
			}
		}
	})
}
