package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Limits of run_command (docs/protocol.md §9.1, "Workspace tools").
const (
	// RunCommandTimeout is how long a command runs when the call names no
	// timeout (2 minutes); RunCommandTimeoutMax is the most a call may ask
	// for (10 minutes, the default turn timeout). Past it the command's
	// whole process group is killed and the result is an error.
	RunCommandTimeout    = 2 * time.Minute
	RunCommandTimeoutMax = 10 * time.Minute
	// RunCommandOutputBytesMax bounds what a command may print, stdout and
	// stderr together (64 KiB): one byte more kills its process group and
	// the result is an error that shows none of it (nothing is cut
	// silently).
	RunCommandOutputBytesMax = 64 << 10
	// RunCommandBytesMax bounds the command line itself (16 KiB).
	RunCommandBytesMax = 16 << 10
	// runCommandWaitDelay bounds the wait for the command's output pipes
	// after it exited or was killed: a background process that keeps them
	// open must not hold the turn.
	runCommandWaitDelay = 2 * time.Second
)

// RunCommandEnv names the only variables of the worker's environment a
// command sees (an allowlist, so a secret the worker holds — NATS
// credentials, a model API key, any BROOD_* setting — never reaches it,
// whatever it is called; docs/security.md, "Workspace tools"). PATH
// defaults to RunCommandDefaultPath when the worker has none.
var RunCommandEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM"}

// RunCommandDefaultPath is the command's PATH when the worker has none.
const RunCommandDefaultPath = "/usr/local/bin:/usr/bin:/bin"

var errOutputBound = errors.New("output bound")

// RunCommandTool runs a shell command (`/bin/sh -c`) in the session's
// workspace, or a directory inside it (dir), within roots as for
// ListDirTool: in its own process group, stdin empty, the environment
// reduced to RunCommandEnv, killed (the whole group) past its timeout or
// its output bound. The workspace fence decides where it starts, not what
// it may touch: the command runs with the worker's operating-system user,
// which is why it needs approval (Tool.NeedsApproval; docs/security.md).
// A non-zero exit is an error result carrying the output and the status.
func RunCommandTool(roots ...string) *Tool {
	return &Tool{
		Name: "run_command",
		Description: fmt.Sprintf("Run a shell command (/bin/sh -c) in the workspace, or in dir inside it. stdout and stderr are returned together with the exit status. "+
			"The command is killed after timeout_seconds (default %d, at most %d) or when it prints more than %d bytes.",
			int(RunCommandTimeout/time.Second), int(RunCommandTimeoutMax/time.Second), RunCommandOutputBytesMax),
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"command":{"type":"string","description":"the shell command line"},` +
			`"dir":{"type":"string","description":"directory to run in, relative to the workspace root; default \".\""},` +
			`"timeout_seconds":{"type":"integer","minimum":1,"description":"seconds before the command is killed"}},` +
			`"required":["command"],"additionalProperties":false}`),
		NeedsApproval: true,
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Command        string  `json:"command"`
				Dir            *string `json:"dir"`
				TimeoutSeconds *int64  `json:"timeout_seconds"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("run_command: %v", err)
			}
			if strings.TrimSpace(in.Command) == "" {
				return ErrorResult("run_command: command is required")
			}
			if len(in.Command) > RunCommandBytesMax {
				return ErrorResult("run_command: the command is %d bytes; the limit is %d bytes", len(in.Command), RunCommandBytesMax)
			}
			timeout := RunCommandTimeout
			if in.TimeoutSeconds != nil {
				if *in.TimeoutSeconds < 1 || *in.TimeoutSeconds > int64(RunCommandTimeoutMax/time.Second) {
					return ErrorResult("run_command: timeout_seconds must be 1…%d", int64(RunCommandTimeoutMax/time.Second))
				}
				timeout = time.Duration(*in.TimeoutSeconds) * time.Second
			}
			rel := "."
			if in.Dir != nil && *in.Dir != "" {
				rel = *in.Dir
			}
			dir, err := ResolveInUserWorkspace(tc.Header.Cwd, tc.Header.User, rel, roots...)
			if err != nil {
				return ErrorResult("run_command: %v", err)
			}
			if st, err := statKind(dir); err != nil || !st.IsDir() {
				return ErrorResult("run_command: %s is not a directory", rel)
			}
			return runCommand(ctx, dir, in.Command, timeout)
		},
	}
}

// runCommand runs command in dir and reports how it ended.
func runCommand(ctx context.Context, dir, command string, timeout time.Duration) ToolResult {
	tctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	defer cancelTimeout()
	rctx, cancel := context.WithCancelCause(tctx)
	defer cancel(nil)
	cmd := exec.CommandContext(rctx, "/bin/sh", "-c", command)
	cmd.Dir = dir
	cmd.Env = commandEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = runCommandWaitDelay
	out := &boundedOutput{max: RunCommandOutputBytesMax, over: func() { cancel(errOutputBound) }}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return ErrorResult("run_command: cannot start the shell: %v", err)
	}
	err := cmd.Wait()
	// Whatever the command left behind in its group (a `sleep &`) goes too.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	switch {
	case errors.Is(context.Cause(rctx), errOutputBound):
		return ErrorResult("run_command: the command printed more than %d bytes, its output limit; it was killed and none of its output is shown — narrow it (pipe through head, tail or grep)", RunCommandOutputBytesMax)
	case ctx.Err() != nil:
		return ErrorResult("run_command: cancelled with the turn; the command was killed")
	case tctx.Err() != nil:
		return ErrorResult("run_command: the command ran past its timeout of %s and was killed\n%s", timeout, out.String())
	}
	text := out.String()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return TextResult(text + "\n(exit status 0)")
	case errors.As(err, &ee):
		return ToolResult{Content: protocol.Text(text + fmt.Sprintf("\n(exit status %d)", ee.ExitCode())), IsError: true}
	case errors.Is(err, exec.ErrWaitDelay):
		return TextResult(text + "\n(exit status 0; a background process kept its output open and was killed)")
	default:
		return ErrorResult("run_command: %v\n%s", err, text)
	}
}

// commandEnv is the worker's environment reduced to RunCommandEnv.
func commandEnv() []string {
	env := make([]string, 0, len(RunCommandEnv))
	hasPath := false
	for _, name := range RunCommandEnv {
		if v, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+v)
			hasPath = hasPath || name == "PATH"
		}
	}
	if !hasPath {
		env = append(env, "PATH="+RunCommandDefaultPath)
	}
	return env
}

// boundedOutput collects a command's output up to max bytes; the first
// write past it calls over once and keeps nothing more. exec.Cmd calls
// Write from one goroutine at a time when stdout and stderr are one writer.
type boundedOutput struct {
	buf  bytes.Buffer
	max  int
	over func()
	full bool
}

func (b *boundedOutput) Write(p []byte) (int, error) {
	if b.full {
		return len(p), nil
	}
	if b.buf.Len()+len(p) > b.max {
		b.full = true
		b.over()
		return len(p), nil
	}
	return b.buf.Write(p)
}

// String is the output as valid UTF-8 (bytes that are not are replaced).
func (b *boundedOutput) String() string { return strings.ToValidUTF8(b.buf.String(), "\uFFFD") }
