package integration

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestServicesStartedTogetherWaitForTheAdminStep is issue 17's operator
// case: two coordinators and a worker started at once on a fresh server do
// not provision (and so cannot race each other); each waits, saying that
// `brood provision` is missing, and serves once the admin ran it. Then a
// stream changed behind their back is refused at the next start, never
// rewritten.
func TestServicesStartedTogetherWaitForTheAdminStep(t *testing.T) {
	srv := testutil.Server(t)
	url := srv.ClientURL()
	timing := []string{"--log-level", "info", "--heartbeat", stack.Heartbeat.String(), "--host-expiry", stack.HostExpiry.String()}
	procs := []*proc{
		startProc(t, append([]string{"coordinator", "--nats", url}, timing...)...),
		startProc(t, append([]string{"coordinator", "--nats", url}, timing...)...),
		startProc(t, append([]string{"spawn-worker", "--nats", url, "--model", "scripted"}, timing...)...),
	}
	for _, p := range procs {
		p.waitStderr(t, "waiting for Brood's streams and buckets: run `brood provision --replicas N --providers P,...` as the admin user", 20*time.Second)
	}
	js, err := jetstream.New(testutil.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if names := streamNames(ctx, t, js); len(names) != 0 {
		t.Fatalf("services created streams themselves: %v", names)
	}

	out, err := exec.Command(broodBin, "provision", "--replicas", "1", "--providers", "spawn", "--nats", url).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "provisioned Brood's streams and buckets with 1 replicas for providers spawn") {
		t.Fatalf("brood provision: %v: %s", err, out)
	}
	procs[0].waitStderr(t, "coordinator serving", 20*time.Second)
	procs[1].waitStderr(t, "coordinator serving", 20*time.Second)
	procs[2].waitStderr(t, "host serving", 20*time.Second)
	// A provider that was not provisioned: its worker waits, naming its
	// log and inbox streams, until the admin step names it too.
	fork := startProc(t, append([]string{"fork-worker", "--nats", url, "--model", "scripted"}, timing...)...)
	fork.waitStderr(t, "BROOD_LOG_fork, BROOD_INBOX_fork not found", 20*time.Second)
	if out, err := exec.Command(broodBin, "provision", "--replicas", "1", "--providers", "spawn,fork", "--nats", url).CombinedOutput(); err != nil {
		t.Fatalf("brood provision with the fork provider added: %v: %s", err, out)
	}
	fork.waitStderr(t, "host serving", 20*time.Second)
	run := exec.Command(broodBin, "run", "--nats", url, "--provider", "spawn", "say ok")
	if out, err := run.Output(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("brood run: %v: %s", err, out)
	}
	if out, err := exec.Command(broodBin, "provision", "--check", "--replicas", "1", "--providers", "spawn,fork", "--nats", url).CombinedOutput(); err != nil {
		t.Fatalf("brood provision --check after provisioning: %v: %s", err, out)
	}

	// Someone changes BROOD_LOG_root: a service starting now refuses it, naming
	// the difference, and leaves it as it is; --check lists it too.
	str, err := js.Stream(ctx, "BROOD_LOG_root")
	if err != nil {
		t.Fatal(err)
	}
	changed := str.CachedInfo().Config
	changed.MaxMsgsPerSubject = 1
	if _, err := js.UpdateStream(ctx, changed); err != nil {
		t.Fatal(err)
	}
	late := exec.Command(broodBin, append([]string{"coordinator", "--nats", url}, timing...)...)
	out, err = late.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "BROOD_LOG_root: max_msgs_per_subject 1, want -1") {
		t.Fatalf("a coordinator on a changed stream: %v: %s", err, out)
	}
	if info, err := str.Info(ctx); err != nil || info.Config.MaxMsgsPerSubject != 1 {
		t.Fatalf("the coordinator rewrote BROOD_LOG_root: %v, %v", info.Config.MaxMsgsPerSubject, err)
	}
	out, err = exec.Command(broodBin, "provision", "--check", "--replicas", "1", "--providers", "spawn,fork", "--nats", url).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "max_msgs_per_subject 1, want -1") || !strings.HasPrefix(string(out), string(protocol.CodeUnavailable)) {
		t.Fatalf("brood provision --check on a changed stream: %v: %s", err, out)
	}
	// The admin step puts it right.
	if out, err := exec.Command(broodBin, "provision", "--replicas", "1", "--providers", "spawn,fork", "--nats", url).CombinedOutput(); err != nil {
		t.Fatalf("brood provision: %v: %s", err, out)
	}
	if info, err := str.Info(ctx); err != nil || info.Config.MaxMsgsPerSubject != -1 {
		t.Fatalf("provision did not restore BROOD_LOG_root: %v, %v", info.Config.MaxMsgsPerSubject, err)
	}
}

func streamNames(ctx context.Context, t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var names []string
	l := js.StreamNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}
