package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf8"
)

// ReadFileBytesMax bounds what one read_file call returns (256 KiB); a
// longer file is read in pieces with offset, and the result says how much
// is left, so nothing is cut silently.
const ReadFileBytesMax = 256 << 10

// ReadFileTool reads a text file inside the session's cwd (read-only).
// Roots bound the workspace as for ListDirTool.
func ReadFileTool(roots ...string) *Tool {
	return &Tool{
		Name:       "read_file",
		Idempotent: true, // it reads only: running it again after a host loss is safe
		Description: fmt.Sprintf("Read a UTF-8 text file inside the workspace. Paths are relative to the workspace root; paths outside it are refused. "+
			"Returns at most %d bytes from offset (default 0); the result says how many bytes remain.", ReadFileBytesMax),
		Parameters: json.RawMessage(`{"type":"object","properties":{` +
			`"path":{"type":"string","description":"file path relative to the workspace root"},` +
			`"offset":{"type":"integer","minimum":0,"description":"byte offset to start at; default 0"},` +
			`"limit":{"type":"integer","minimum":1,"description":"bytes to return at most; default and maximum 262144"}},` +
			`"required":["path"],"additionalProperties":false}`),
		Run: func(ctx context.Context, tc ToolContext, args string) ToolResult {
			var in struct {
				Path   string `json:"path"`
				Offset *int64 `json:"offset"`
				Limit  *int64 `json:"limit"`
			}
			if err := decodeArgs(args, &in); err != nil {
				return ErrorResult("read_file: %v", err)
			}
			if in.Path == "" {
				return ErrorResult("read_file: path is required")
			}
			offset, limit := int64(0), int64(ReadFileBytesMax)
			if in.Offset != nil {
				if *in.Offset < 0 {
					return ErrorResult("read_file: offset must be ≥ 0")
				}
				offset = *in.Offset
			}
			if in.Limit != nil {
				if *in.Limit < 1 {
					return ErrorResult("read_file: limit must be ≥ 1")
				}
				limit = min(*in.Limit, ReadFileBytesMax)
			}
			path, err := ResolveInUserWorkspace(tc.Header.Cwd, tc.Header.User, in.Path, roots...)
			if err != nil {
				return ErrorResult("read_file: %v", err)
			}
			if st, err := statKind(path); err != nil {
				return ErrorResult("read_file: %s: %v", in.Path, err)
			} else if st.IsDir() {
				return ErrorResult("read_file: %s is a directory; use list_dir", in.Path)
			}
			f, err := os.Open(path)
			if err != nil {
				return ErrorResult("read_file: %s: %v", in.Path, unwrapPathError(err))
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return ErrorResult("read_file: %s: %v", in.Path, unwrapPathError(err))
			}
			if st.IsDir() {
				return ErrorResult("read_file: %s is a directory; use list_dir", in.Path)
			}
			size := st.Size()
			if offset > size {
				return ErrorResult("read_file: offset %d is past the end of %s (%d bytes)", offset, in.Path, size)
			}
			buf := make([]byte, min(limit, size-offset))
			n, err := f.ReadAt(buf, offset)
			if err != nil && !errors.Is(err, io.EOF) {
				return ErrorResult("read_file: %s: %v", in.Path, err)
			}
			buf = buf[:n]
			// Cut at a rune boundary so a piece is valid text; the rest follows from the new offset.
			if int64(len(buf)) < size-offset {
				for i := 0; i < utf8.UTFMax && len(buf) > 0 && !utf8.Valid(buf); i++ {
					buf = buf[:len(buf)-1]
				}
			}
			if !utf8.Valid(buf) {
				return ErrorResult("read_file: %s is not UTF-8 text", in.Path)
			}
			out := string(buf)
			if rest := size - offset - int64(len(buf)); rest > 0 {
				out += fmt.Sprintf("\n(%d more bytes; continue with offset %d)", rest, offset+int64(len(buf)))
			}
			return TextResult(out)
		},
	}
}
