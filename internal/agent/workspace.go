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
)

// ListDirEntriesMax bounds how many entries list_dir returns; the rest are
// counted, never dropped silently.
const ListDirEntriesMax = 1000

// ListDirTool lists a directory inside the session's cwd (read-only).
func ListDirTool() *Tool {
	return &Tool{
		Name:        "list_dir",
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
			dir, err := ResolveInWorkspace(tc.Header.Cwd, p)
			if err != nil {
				return ErrorResult("list_dir: %v", err)
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

// ResolveInWorkspace resolves p (relative to cwd, or absolute) and returns it
// if it lies inside cwd after following symlinks; anything else is refused.
func ResolveInWorkspace(cwd, p string) (string, error) {
	if cwd == "" || !filepath.IsAbs(cwd) {
		return "", errors.New("the session has no absolute workspace directory")
	}
	root, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return "", fmt.Errorf("workspace %s is not accessible: %v", cwd, unwrapPathError(err))
	}
	target := p
	if !filepath.IsAbs(target) {
		target = filepath.Join(cwd, target)
	}
	target = filepath.Clean(target)
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		// A path that does not exist cannot escape; report it plainly.
		return "", fmt.Errorf("%s: %v", p, unwrapPathError(err))
	}
	rel, err := filepath.Rel(root, real)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("path %s is outside the workspace %s; only paths inside it are allowed", p, cwd)
	}
	return real, nil
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
		return fmt.Errorf("invalid arguments: %v", err)
	}
	if d.More() {
		return errors.New("invalid arguments: trailing data after the JSON object")
	}
	return nil
}
