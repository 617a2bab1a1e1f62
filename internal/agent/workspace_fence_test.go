package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// TestTheWorkspaceIsFencedByDefault (issue 29, item 5): no workspace root
// allows no workspace; a {user} root is the session's user's directory and
// nothing else; a workspace reached through a symlink must lie in a root
// after the symlink is followed; "/" (brood dev's default) allows any.
func TestTheWorkspaceIsFencedByDefault(t *testing.T) {
	base := t.TempDir()
	wsRoot := filepath.Join(base, "workspaces")
	alice, bob := filepath.Join(wsRoot, "alice"), filepath.Join(wsRoot, "bob")
	for _, d := range []string{alice, bob} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(alice, "notes.txt"), []byte("alice's notes"), 0o644))
	must(os.WriteFile(filepath.Join(bob, "secret.txt"), []byte("bob's secret"), 0o644))
	must(os.WriteFile(filepath.Join(base, "passwd"), []byte("root:x:0:0"), 0o644))
	// A symlink inside alice's workspace to the whole disk, and one to bob's.
	must(os.Symlink("/", filepath.Join(alice, "disk")))
	must(os.Symlink(bob, filepath.Join(alice, "bob")))
	userRoot := filepath.Join(wsRoot, UserToken)

	tests := []struct {
		name  string
		roots []string
		user  string
		cwd   string
		path  string
		want  string // text the result contains
		ok    bool
	}{
		{"no root: not even a read in the workspace", nil, "alice", alice, "notes.txt", "allows no workspace", false},
		{"no root: not the password file from /", nil, "alice", "/", filepath.Join(base, "passwd"), "allows no workspace", false},
		{"the user's own workspace", []string{userRoot}, "alice", alice, "notes.txt", "alice's notes", true},
		{"a directory below the user's own", []string{userRoot}, "alice", wsRoot + "/alice/.", "notes.txt", "alice's notes", true},
		{"another user's workspace as cwd", []string{userRoot}, "alice", bob, "secret.txt", "outside this worker's workspace roots", false},
		{"another user's file by ..", []string{userRoot}, "alice", alice, "../bob/secret.txt", "outside the workspace", false},
		{"another user's file by absolute path", []string{userRoot}, "alice", alice, filepath.Join(bob, "secret.txt"), "outside the workspace", false},
		{"another user's file through a symlink", []string{userRoot}, "alice", alice, "bob/secret.txt", "outside the workspace", false},
		{"cwd / with a {user} root", []string{userRoot}, "alice", "/", filepath.Join(base, "passwd"), "outside this worker's workspace roots", false},
		{"cwd the root of every workspace", []string{userRoot}, "alice", wsRoot, "bob/secret.txt", "outside this worker's workspace roots", false},
		{"cwd a symlink to / inside the user's workspace", []string{userRoot}, "alice", filepath.Join(alice, "disk"), filepath.Join(base, "passwd")[1:], "outside this worker's workspace roots", false},
		{"cwd a symlink to another user's workspace", []string{userRoot}, "alice", filepath.Join(alice, "bob"), "secret.txt", "outside this worker's workspace roots", false},
		{"a session without a user under a {user} root", []string{userRoot}, "", alice, "notes.txt", "outside this worker's workspace roots", false},
		{"a user that is no path element", []string{userRoot}, "../bob", alice, "notes.txt", "outside this worker's workspace roots", false},
		{"a fixed root still holds every user's", []string{wsRoot}, "alice", bob, "secret.txt", "bob's secret", true},
		{"any workspace: brood dev", []string{AnyWorkspace}, "", "/", filepath.Join(base, "passwd"), "root:x:0:0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := ToolContext{Header: protocol.SessionHeader{Cwd: tt.cwd, User: tt.user}}
			args := `{"path":` + strconv.Quote(tt.path) + `}`
			r := ReadFileTool(tt.roots...).Run(context.Background(), tc, args)
			got := protocol.PlainText(r.Content)
			if r.IsError == tt.ok || !strings.Contains(got, tt.want) {
				t.Fatalf("read_file %s in %s as %q with roots %v = (error %v) %q, want error %v containing %q",
					args, tt.cwd, tt.user, tt.roots, r.IsError, got, !tt.ok, tt.want)
			}
			// list_dir is fenced by the same rule.
			l := ListDirTool(tt.roots...).Run(context.Background(), tc, `{}`)
			if tt.want == "allows no workspace" || strings.Contains(tt.want, "workspace roots") {
				if !l.IsError || !strings.Contains(protocol.PlainText(l.Content), tt.want) {
					t.Fatalf("list_dir in %s = (error %v) %q, want refused with %q", tt.cwd, l.IsError, protocol.PlainText(l.Content), tt.want)
				}
			}
		})
	}
}
