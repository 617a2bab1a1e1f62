package deploy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/model"
	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
	spawnworker "github.com/brood-dev/brood/services/spawn-worker"
)

// The workspace is fenced (issue 29, item 5; docs/security.md, "The
// workspace is fenced"): every worker the manifests of deploy/ start sets a
// --workspace-root of the session's user, and a client of the deployment
// cannot make a worker read another user's workspace or a password file.

// workerVerbs are the commands whose agents have the workspace tools.
var workerVerbs = []string{"spawn-worker", "fork-worker", "acp-agent"}

// deployedWorkspaceRootsDir is the directory the manifests keep the users'
// workspaces in.
const deployedWorkspaceRootsDir = "/srv/brood/workspaces"

var workspaceRootRE = regexp.MustCompile(`--workspace-root(?:=|",\s*"|\s+)([^"\s,\]]+)`)

// manifestWorkerCommands returns, per manifest of compose/, k8s/ and
// systemd/, the command line of every worker it starts (the verb and the
// arguments that follow it).
func manifestWorkerCommands(t *testing.T) map[string][]string {
	t.Helper()
	verbs := strings.Join(workerVerbs, "|")
	compose := regexp.MustCompile(`(?m)^\s*command:\s*(\[\s*"(?:` + verbs + `)".*\])\s*$`)
	k8sVerb := regexp.MustCompile(`^\s*-\s*(` + verbs + `)\s*$`)
	k8sArg := regexp.MustCompile(`^\s*-\s*(--\S+)\s*$`)
	unit := regexp.MustCompile(`(?m)^ExecStart=\S+\s+((?:` + verbs + `)\b.*)$`)
	out := map[string][]string{}
	for _, dir := range []string{"compose", "k8s", "systemd"} {
		files, err := filepath.Glob(filepath.Join(dir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil || strings.HasPrefix(filepath.Base(f), ".") {
				continue
			}
			switch dir {
			case "compose":
				for _, m := range compose.FindAllStringSubmatch(string(data), -1) {
					var argv []string
					if err := json.Unmarshal([]byte(m[1]), &argv); err != nil {
						t.Fatalf("%s: command %s: %v", f, m[1], err)
					}
					out[f] = append(out[f], strings.Join(argv, " "))
				}
			case "k8s":
				lines := strings.Split(string(data), "\n")
				for i, l := range lines {
					m := k8sVerb.FindStringSubmatch(l)
					if m == nil {
						continue
					}
					cmd := m[1]
					for _, a := range lines[i+1:] {
						am := k8sArg.FindStringSubmatch(a)
						if am == nil {
							break
						}
						cmd += " " + am[1]
					}
					out[f] = append(out[f], cmd)
				}
			case "systemd":
				for _, m := range unit.FindAllStringSubmatch(string(data), -1) {
					out[f] = append(out[f], m[1])
				}
			}
		}
	}
	return out
}

// TestEveryManifestFencesTheWorkspace: every worker of compose, k8s and
// systemd sets a workspace root per user under deployedWorkspaceRootsDir,
// and every way deploy/ runs Brood starts at least one worker.
func TestEveryManifestFencesTheWorkspace(t *testing.T) {
	cmds := manifestWorkerCommands(t)
	for _, dir := range []string{"compose", "k8s", "systemd"} {
		n := 0
		for f, c := range cmds {
			if strings.HasPrefix(f, dir+string(filepath.Separator)) {
				n += len(c)
			}
		}
		if n == 0 {
			t.Errorf("%s/ starts no worker (the scan found none: has the format changed?)", dir)
		}
	}
	want := deployedWorkspaceRootsDir + "/" + agent.UserToken
	for f, cs := range cmds {
		for _, c := range cs {
			m := workspaceRootRE.FindAllStringSubmatch(c, -1)
			if len(m) != 1 || m[0][1] != want {
				t.Errorf("%s: %q: workspace roots %v, want exactly --workspace-root %s", f, c, m, want)
			}
		}
	}
}

// TestForgeryWorkspace: on a node with accounts.conf's users and a spawn
// worker fenced as the manifests fence it, the client user's runs cannot
// read the trusted host's workspace (another user's) or /etc/passwd, by a
// cwd of "/" or of the other workspace, by "..", by absolute path, or
// through a symlink; each refusal is an error tool result that holds
// nothing of the file, while each user reads its own workspace.
func TestForgeryWorkspace(t *testing.T) {
	url := singleNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	subj := protocol.MustSubjects("")
	cfg := store.DefaultConfig()
	if _, err := store.Provision(ctx, connectAs(t, url, "admin", nil), subj, cfg); err != nil {
		t.Fatalf("provision as admin: %v", err)
	}
	v := &violations{}
	open := func(user string) *store.Store {
		nc := connectAs(t, url, user, v)
		st, err := store.Open(ctx, nc, subj, openConfig(nc, cfg))
		if err != nil {
			t.Fatalf("open as %s: %v", user, err)
		}
		return st
	}
	coordStore := open("coordinator")
	coord, err := coordinator.New(coordinator.Config{
		NC: coordStore.NC, Store: coordStore, HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, coord)
	<-coord.Ready()

	// The manifests' root, moved to a temporary directory.
	base := t.TempDir()
	root := strings.Replace(deployedWorkspaceRootsDir+"/"+agent.UserToken, deployedWorkspaceRootsDir, base, 1)
	mine, theirs := filepath.Join(base, "client"), filepath.Join(base, "trusted-host")
	for _, d := range []string{mine, theirs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "the other user's secret"
	for p, data := range map[string]string{filepath.Join(mine, "notes.txt"): "my notes", filepath.Join(theirs, "secret.txt"): secret} {
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, to := range map[string]string{filepath.Join(mine, "theirs"): theirs, filepath.Join(mine, "disk"): "/"} {
		if err := os.Symlink(to, link); err != nil {
			t.Fatal(err)
		}
	}
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil || !strings.Contains(string(passwd), "root:") {
		t.Skipf("no /etc/passwd with a root entry to aim at: %v", err)
	}

	workerStore := open("worker-spawn")
	w, err := spawnworker.New(spawnworker.Config{
		NC: workerStore.NC, Store: workerStore, Models: func() (model.Model, error) { return model.NewScripted(), nil },
		HeartbeatInterval: stack.Heartbeat, HostExpiry: stack.HostExpiry, DrainGrace: 2 * time.Second,
		WorkspaceRoots: []string{root}, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Background(t, w)

	newClient := func(user string) *client.Client {
		cl, err := client.New(connectAs(t, url, user, v), client.Options{AwaitFallback: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	attacker, other := newClient("client"), newClient("trusted-host")
	waitFor(t, 20*time.Second, "spawn listed", func() bool {
		r, err := attacker.Providers(ctx)
		return err == nil && r.Instances[spawnworker.DefaultName] > 0
	})

	// call runs one tool call in a child of a root of cl opened in cwd and
	// returns the call's result as the child's log holds it.
	call := func(t *testing.T, cl *client.Client, cwd, tool, args string) protocol.ToolResultData {
		t.Helper()
		r, err := cl.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: cwd})
		if err != nil {
			t.Fatalf("open a root in %s: %v", cwd, err)
		}
		defer func() { _ = r.Close(context.Background()) }()
		run, err := cl.StartRun(ctx, protocol.RunStartRequest{Parent: r.Ref(), Provider: spawnworker.DefaultName,
			Prompt: protocol.Text("call " + tool + " " + args + "\nsay done")})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := run.Result(ctx); err != nil || res.StopReason != protocol.StopCompleted {
			t.Fatalf("the run: %+v, %v", res, err)
		}
		l, err := cl.Log(ctx, protocol.LogReadRequest{SessionID: run.ChildID, Authority: r.Authority()})
		if err != nil {
			t.Fatal(err)
		}
		var d protocol.ToolResultData
		n := 0
		for _, ev := range l.Events {
			if ev.Type == protocol.EvToolResult {
				if err := ev.Decode(&d); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
		if n != 1 || d.Name != tool {
			t.Fatalf("%d tool results in the child's log, the last %+v; want one of %s", n, d, tool)
		}
		return d
	}
	path := func(p string) string { return `{"path":` + strconv.Quote(p) + `}` }

	t.Run("each user reads its own workspace", func(t *testing.T) {
		if d := call(t, attacker, mine, "read_file", path("notes.txt")); d.IsError || protocol.PlainText(d.Content) != "my notes" {
			t.Fatalf("the client's own notes: %+v", d)
		}
		if d := call(t, other, theirs, "read_file", path("secret.txt")); d.IsError || protocol.PlainText(d.Content) != secret {
			t.Fatalf("the trusted host's own secret: %+v", d)
		}
	})
	attempts := []struct {
		name, cwd, tool, args, want string
	}{
		{"a password file from cwd /", "/", "read_file", path("/etc/passwd"), "outside this worker's workspace roots"},
		{"the root directory from cwd /", "/", "list_dir", `{}`, "outside this worker's workspace roots"},
		{"another user's workspace as cwd", theirs, "read_file", path("secret.txt"), "outside this worker's workspace roots"},
		{"every user's workspaces as cwd", base, "read_file", path("trusted-host/secret.txt"), "outside this worker's workspace roots"},
		{"another user's file by ..", mine, "read_file", path("../trusted-host/secret.txt"), "outside the workspace"},
		{"another user's file by absolute path", mine, "read_file", path(filepath.Join(theirs, "secret.txt")), "outside the workspace"},
		{"another user's file through a symlink", mine, "read_file", path("theirs/secret.txt"), "outside the workspace"},
		{"a password file through a symlink", mine, "read_file", path("disk/etc/passwd"), "outside the workspace"},
		{"a password file from a symlinked cwd", filepath.Join(mine, "disk"), "read_file", path("etc/passwd"), "outside this worker's workspace roots"},
	}
	for _, a := range attempts {
		t.Run("client: "+a.name, func(t *testing.T) {
			d := call(t, attacker, a.cwd, a.tool, a.args)
			got := protocol.PlainText(d.Content)
			if !d.IsError || !strings.Contains(got, a.want) || strings.Contains(got, secret) || strings.Contains(got, "root:") {
				t.Fatalf("%s %s in %s = (error %v) %q, want refused with %q", a.tool, a.args, a.cwd, d.IsError, got, a.want)
			}
		})
	}
	if vs := v.list(); len(vs) > 0 {
		t.Fatalf("permission violations while the services ran as their users:\n%s", strings.Join(vs, "\n"))
	}
}
