package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"
)

// noFollow opens the last element of a path without following a symlink:
// the path was resolved already, so a symlink there now was put in since.
const noFollow = syscall.O_NOFOLLOW

// WriteFileBytesMax bounds the content of one write_file call and the size
// of a file edit_file rewrites (1 MiB); more is refused, never cut.
const WriteFileBytesMax = 1 << 20

// writeFileMode is the permission of a file write_file creates (an existing
// file keeps its own), writeDirMode that of a directory it creates.
const (
	writeFileMode = 0o644
	writeDirMode  = 0o755
)

// ApprovalTools are the tools of the built-in agents that change the
// workspace or run a program: each needs approval before it runs unless the
// session's start allowed it outright (SessionHeader.AutoApprove;
// docs/protocol.md §9.1, "Workspace tools").
var ApprovalTools = []string{"write_file", "edit_file", "run_command"}

// WriteFileTool writes a UTF-8 text file inside the session's workspace,
// creating it and its missing parent directories, replacing an existing
// file's content. Roots bound the workspace as for ListDirTool; the path
// must lie inside it before and after symlinks are followed. It needs
// approval (Tool.NeedsApproval).
func WriteFileTool(roots ...string) *Tool {
	return &Tool{
		Name: "write_file",
		Description: fmt.Sprintf("Write a UTF-8 text file inside the workspace, creating it (and missing parent directories) or replacing its whole content. "+
			"Paths are relative to the workspace root; paths outside it are refused. At most %d bytes.", WriteFileBytesMax),
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"path":{"type":"string","description":"file path relative to the workspace root"},` +
			`"content":{"type":"string","description":"the file's whole new content"}},` +
			`"required":["path","content"],"additionalProperties":false}`),
		NeedsApproval: true,
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Path    string  `json:"path"`
				Content *string `json:"content"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("write_file: %v", err)
			}
			if in.Path == "" || in.Content == nil {
				return ErrorResult("write_file: path and content are required")
			}
			if len(*in.Content) > WriteFileBytesMax {
				return ErrorResult("write_file: the content is %d bytes; the limit is %d bytes", len(*in.Content), WriteFileBytesMax)
			}
			path, err := resolveForWrite(tc.Header.Cwd, tc.Header.User, in.Path, roots)
			if err != nil {
				return ErrorResult("write_file: %v", err)
			}
			if err := writeFile(path, []byte(*in.Content)); err != nil {
				return ErrorResult("write_file: %s: %v", in.Path, err)
			}
			return TextResult(fmt.Sprintf("wrote %d bytes to %s", len(*in.Content), in.Path))
		},
	}
}

// EditFileTool replaces one exact occurrence of a string in a UTF-8 text
// file inside the session's workspace: old_string must occur exactly once
// (or, with replace_all, at least once), as in common agent harnesses; a
// missing or ambiguous match is an error result naming the count. Roots
// bound the workspace as for ListDirTool. It needs approval.
func EditFileTool(roots ...string) *Tool {
	return &Tool{
		Name: "edit_file",
		Description: "Edit a UTF-8 text file inside the workspace by exact string replacement: old_string must occur exactly once in the file " +
			"(include enough surrounding text to make it unique), unless replace_all is true. Paths outside the workspace are refused.",
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"path":{"type":"string","description":"file path relative to the workspace root"},` +
			`"old_string":{"type":"string","description":"the exact text to replace"},` +
			`"new_string":{"type":"string","description":"the text to put in its place"},` +
			`"replace_all":{"type":"boolean","description":"replace every occurrence; default false"}},` +
			`"required":["path","old_string","new_string"],"additionalProperties":false}`),
		NeedsApproval: true,
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Path       string  `json:"path"`
				OldString  string  `json:"old_string"`
				NewString  *string `json:"new_string"`
				ReplaceAll bool    `json:"replace_all"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("edit_file: %v", err)
			}
			switch {
			case in.Path == "" || in.NewString == nil:
				return ErrorResult("edit_file: path, old_string and new_string are required")
			case in.OldString == "":
				return ErrorResult("edit_file: old_string must not be empty; use write_file to create a file")
			case in.OldString == *in.NewString:
				return ErrorResult("edit_file: old_string and new_string are equal; nothing would change")
			}
			path, err := ResolveInUserWorkspace(tc.Header.Cwd, tc.Header.User, in.Path, roots...)
			if err != nil {
				return ErrorResult("edit_file: %v", err)
			}
			st, err := statKind(path)
			if err != nil {
				return ErrorResult("edit_file: %s: %v", in.Path, err)
			}
			if st.IsDir() {
				return ErrorResult("edit_file: %s is a directory", in.Path)
			}
			if st.Size() > WriteFileBytesMax {
				return ErrorResult("edit_file: %s is %d bytes; the limit is %d bytes", in.Path, st.Size(), WriteFileBytesMax)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return ErrorResult("edit_file: %s: %v", in.Path, unwrapPathError(err))
			}
			if !utf8.Valid(data) {
				return ErrorResult("edit_file: %s is not UTF-8 text", in.Path)
			}
			text := string(data)
			n := strings.Count(text, in.OldString)
			switch {
			case n == 0:
				return ErrorResult("edit_file: old_string was not found in %s; nothing changed", in.Path)
			case n > 1 && !in.ReplaceAll:
				return ErrorResult("edit_file: old_string occurs %d times in %s; give more context to make it unique, or set replace_all; nothing changed", n, in.Path)
			}
			if in.ReplaceAll {
				text = strings.ReplaceAll(text, in.OldString, *in.NewString)
			} else {
				text = strings.Replace(text, in.OldString, *in.NewString, 1)
			}
			if len(text) > WriteFileBytesMax {
				return ErrorResult("edit_file: the edited %s would be %d bytes; the limit is %d bytes; nothing changed", in.Path, len(text), WriteFileBytesMax)
			}
			if err := writeFile(path, []byte(text)); err != nil {
				return ErrorResult("edit_file: %s: %v", in.Path, err)
			}
			return TextResult(fmt.Sprintf("replaced %d occurrence(s) in %s", n, in.Path))
		},
	}
}

// writeFile replaces the content of path (resolved by resolveForWrite or
// ResolveInUserWorkspace: inside the workspace, symlinks followed). An
// existing file that is not regular (a named pipe, a device) is refused.
func writeFile(path string, data []byte) error {
	if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|noFollow, writeFileMode)
	if err != nil {
		return unwrapPathError(err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return unwrapPathError(err)
	}
	return unwrapPathError(f.Close())
}

// resolveForWrite resolves p for writing: like ResolveInUserWorkspace, but
// the file (and directories above it) may not exist yet. The nearest
// existing ancestor is resolved by the workspace rule (inside the workspace
// after symlinks are followed); the missing directories below it are
// created. An existing target is resolved by the rule itself, so a symlink
// pointing out of the workspace is refused.
func resolveForWrite(cwd, user, p string, roots []string) (string, error) {
	if len(roots) == 0 {
		return resolveInWorkspace(cwd, user, p, roots)
	}
	if cwd == "" || !filepath.IsAbs(cwd) {
		return "", errors.New("the session has no absolute workspace directory")
	}
	target := p
	if !filepath.IsAbs(target) {
		target = filepath.Join(cwd, target)
	}
	target = filepath.Clean(target)
	if !within(filepath.Clean(cwd), target) || target == filepath.Clean(cwd) {
		if target == filepath.Clean(cwd) {
			return "", fmt.Errorf("path %s is the workspace itself, not a file", p)
		}
		return "", fmt.Errorf("path %s is outside the workspace %s; only paths inside it are allowed", p, cwd)
	}
	if _, err := os.Lstat(target); err == nil {
		return resolveInWorkspace(cwd, user, target, roots)
	}
	// Walk up to the nearest existing ancestor; everything below it is
	// created, so no symlink can lie on the rest of the path.
	var missing []string
	dir := filepath.Dir(target)
	for {
		if _, err := os.Lstat(dir); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: %v", p, unwrapPathError(err))
		}
		missing = append(missing, filepath.Base(dir))
		dir = filepath.Dir(dir)
	}
	real, err := resolveInWorkspace(cwd, user, dir, roots)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(real); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s: a parent is not a directory", p)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		real = filepath.Join(real, missing[i])
		if err := os.Mkdir(real, writeDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("%s: cannot create its directory: %v", p, unwrapPathError(err))
		}
		// Made by someone else meanwhile: only a real directory will do.
		if st, err := os.Lstat(real); err != nil || !st.IsDir() {
			return "", fmt.Errorf("%s: a parent is not a directory", p)
		}
	}
	return filepath.Join(real, filepath.Base(target)), nil
}
