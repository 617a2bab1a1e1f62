package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
)

// ListDirEntriesMax bounds how many entries list_dir returns; the rest are
// counted, never dropped silently.
const ListDirEntriesMax = 1000

// ListDirTool lists a directory inside the session's cwd (read-only). Roots
// are the only directories a session's workspace may lie in (a worker's
// --workspace-root; see ResolveInWorkspace): none allows no workspace at
// all, AnyWorkspace allows any absolute directory, and a root naming
// UserToken is that directory of the session's user. A root opened with cwd
// "/" must not turn the workspace tools into a reader of the worker's whole
// disk (docs/security.md, "The workspace is fenced").
func ListDirTool(roots ...string) *Tool {
	return &Tool{
		Name:        "list_dir",
		Idempotent:  true, // it reads only: running it again after a host loss is safe
		Description: "List the entries of a directory inside the workspace. Directories end with '/', symbolic links with '@'. Paths are relative to the workspace root; paths outside it are refused.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string","description":"directory relative to the workspace root; default \".\""}},"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Path *string `json:"path"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("list_dir: %v", err)
			}
			p := "."
			if in.Path != nil && *in.Path != "" {
				p = *in.Path
			}
			dir, err := ResolveInUserWorkspace(tc.Header.Cwd, tc.Header.User, p, roots...)
			if err != nil {
				return ErrorResult("list_dir: %v", err)
			}
			if st, err := statKind(dir); err != nil || !st.IsDir() {
				if err == nil {
					err = errors.New("not a directory")
				}
				return ErrorResult("list_dir: %s: %v", p, err)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				return ErrorResult("list_dir: cannot read %s: %v", p, unwrapPathError(err))
			}
			names := make([]string, 0, len(entries))
			for _, e := range entries {
				n := e.Name()
				switch {
				case e.IsDir():
					n += "/"
				case e.Type()&os.ModeSymlink != 0:
					n += "@"
				}
				names = append(names, n)
			}
			sort.Strings(names)
			more := 0
			if len(names) > ListDirEntriesMax {
				more = len(names) - ListDirEntriesMax
				names = names[:ListDirEntriesMax]
			}
			out := strings.Join(names, "\n")
			if len(names) == 0 {
				out = "(empty directory)"
			}
			if more > 0 {
				out += fmt.Sprintf("\n(%d more entries not listed: the limit is %d)", more, ListDirEntriesMax)
			}
			return TextResult(out)
		},
	}
}

// AnyWorkspace is the root that allows any absolute workspace directory
// (`--workspace-root /`): `brood dev`'s default, where the worker runs as
// the only user it serves.
const AnyWorkspace = "/"

// UserToken in a workspace root stands for the session's user
// (SessionHeader.User, the NATS user whose root the session's tree hangs
// from): a worker started with --workspace-root /srv/brood/workspaces/{user}
// gives user alice /srv/brood/workspaces/alice and nothing else.
const UserToken = "{user}"

// ResolveInWorkspace resolves p (relative to cwd, or absolute) and returns it
// if it lies inside cwd after following symlinks; anything else is refused.
// The workspace itself, cwd, must lie in one of roots, both as written and
// after its symlinks are followed (a symlink inside a root pointing at "/"
// is no workspace); no roots allows no workspace (fail closed:
// docs/security.md, "The workspace is fenced"). A root holding UserToken is
// the root with the session's user in its place; a session without a user,
// or with one that is no single path element, gets no workspace from it.
// A path outside the workspace is refused before the file system is asked,
// so the answer never tells whether it exists.
func ResolveInWorkspace(cwd, p string, roots ...string) (string, error) {
	return resolveInWorkspace(cwd, "", p, roots)
}

// ResolveInUserWorkspace is ResolveInWorkspace for a session of user (the
// value UserToken stands for in roots).
func ResolveInUserWorkspace(cwd, user, p string, roots ...string) (string, error) {
	return resolveInWorkspace(cwd, user, p, roots)
}

func resolveInWorkspace(cwd, user, p string, roots []string) (string, error) {
	if len(roots) == 0 {
		return "", errors.New("this worker allows no workspace (it was started without --workspace-root)")
	}
	if cwd == "" || !filepath.IsAbs(cwd) {
		return "", errors.New("the session has no absolute workspace directory")
	}
	cwd = filepath.Clean(cwd)
	mine := userRoots(roots, user)
	if !inRoots(cwd, mine) {
		return "", fmt.Errorf("the workspace %s is outside this worker's workspace roots for this session", cwd)
	}
	target := p
	if !filepath.IsAbs(target) {
		target = filepath.Join(cwd, target)
	}
	target = filepath.Clean(target)
	if !within(cwd, target) {
		return "", fmt.Errorf("path %s is outside the workspace %s; only paths inside it are allowed", p, cwd)
	}
	root, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return "", fmt.Errorf("workspace %s is not accessible: %v", cwd, unwrapPathError(err))
	}
	if !inRealRoots(root, mine) {
		return "", fmt.Errorf("the workspace %s is outside this worker's workspace roots for this session", cwd)
	}
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		// A path that does not exist cannot escape; report it plainly.
		return "", fmt.Errorf("%s: %v", p, unwrapPathError(err))
	}
	if !within(root, real) {
		return "", fmt.Errorf("path %s is outside the workspace %s; only paths inside it are allowed", p, cwd)
	}
	return real, nil
}

// userRoots returns roots with UserToken replaced by user; a root holding
// UserToken is dropped when user is empty or no single path element.
func userRoots(roots []string, user string) []string {
	out := make([]string, 0, len(roots))
	for _, r := range roots {
		if strings.Contains(r, UserToken) {
			if user == "" || user == "." || user == ".." || strings.ContainsAny(user, `/\`) || strings.ContainsFunc(user, unicode.IsControl) {
				continue
			}
			r = strings.ReplaceAll(r, UserToken, user)
		}
		out = append(out, filepath.Clean(r))
	}
	return out
}

// within reports whether path lies in dir (both clean and absolute).
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func inRoots(cwd string, roots []string) bool {
	for _, r := range roots {
		if within(r, cwd) {
			return true
		}
	}
	return false
}

// inRealRoots reports whether real (a path with its symlinks followed) lies
// in one of roots with their symlinks followed; a root that does not exist
// holds nothing.
func inRealRoots(real string, roots []string) bool {
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err == nil && within(rr, real) {
			return true
		}
	}
	return false
}

// statKind refuses what a read-only tool must not open: anything that is not
// a regular file or a directory (a named pipe would block the turn forever).
func statKind(path string) (os.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, unwrapPathError(err)
	}
	if !st.Mode().IsRegular() && !st.IsDir() {
		return nil, fmt.Errorf("not a regular file or directory (%s)", st.Mode().Type())
	}
	return st, nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// decodeArgs decodes a tool's JSON arguments strictly: unknown fields and
// trailing data are errors, and "" counts as {}.
func decodeArgs(args string, v any) error {
	if strings.TrimSpace(args) == "" {
		args = "{}"
	}
	d := json.NewDecoder(strings.NewReader(args))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("invalid arguments: %w", err)
	}
	if d.More() {
		return errors.New("invalid arguments: trailing data after the JSON object")
	}
	return nil
}
