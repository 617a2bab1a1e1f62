package acpio

import (
	"bytes"
	"encoding/json"
	"io"
)

// LineBytesMaxDefault bounds one line of an agent's stdout. It stays below
// the ACP Go SDK's own scanner limit (10 MiB), whose overflow would close the
// connection; a longer line is dropped and reported instead.
const LineBytesMaxDefault = 8 << 20

// Drop describes a stdout line the filter did not forward.
type Drop struct {
	// Oversize: the line grew past the limit, its length without the
	// newline ("\n" or "\r\n") over maxLineBytes (a lost protocol message,
	// so the caller should end the turn). It is reported the moment the
	// limit is crossed, before the line ends (an agent may never end it);
	// the rest of the line is then read and discarded without another
	// report. Otherwise the line was not a JSON object.
	Oversize bool
	// Bytes is, for a line that is not a JSON object, the length of its
	// text with surrounding white space trimmed; for an oversize line, what
	// had arrived when the limit was crossed (more than the limit).
	Bytes int
}

// LineFilter reads an ACP agent's stdout and yields only the lines that are
// JSON objects, each whole and newline-terminated, to the SDK's reader: stray
// text (a banner, a debug print) never reaches the JSON-RPC decoder, and no
// line is ever split or truncated. Lines up to the limit pass however long
// (64 KiB is no boundary); a forwarded line is the agent's line with
// surrounding white space trimmed, so it is never longer than the limit. The
// filter holds at most the limit plus one read of the agent's output. Not
// safe for concurrent use (one reader).
type LineFilter struct {
	r       io.Reader
	max     int
	onLine  func()
	onDrop  func(Drop)
	buf     []byte // bytes read and not yet consumed: the start of the next line
	chunk   []byte // read buffer
	pending []byte
	err     error
}

// NewLineFilter filters r. onLine is called for every forwarded line (the
// agent's liveness signal), onDrop for every dropped one; either may be nil.
// maxLineBytes ≤ 0 takes LineBytesMaxDefault.
func NewLineFilter(r io.Reader, maxLineBytes int, onLine func(), onDrop func(Drop)) *LineFilter {
	if maxLineBytes <= 0 {
		maxLineBytes = LineBytesMaxDefault
	}
	if onLine == nil {
		onLine = func() {}
	}
	if onDrop == nil {
		onDrop = func(Drop) {}
	}
	return &LineFilter{r: r, max: maxLineBytes, onLine: onLine, onDrop: onDrop, chunk: make([]byte, 64<<10)}
}

// Read implements io.Reader. The agent's read error (io.EOF at its exit)
// is returned once every line read before it was forwarded or dropped, also
// when the error came with the last bytes.
func (f *LineFilter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if f.err != nil && len(f.buf) == 0 {
			return 0, f.err
		}
		f.next()
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// next reads one line and either queues it for Read or reports its drop. It
// reads what is available rather than whole buffers, so a line that crosses
// the limit is reported at once even when the agent never ends it.
func (f *LineFilter) next() {
	scanned, oversize := 0, false
	for {
		if i := bytes.IndexByte(f.buf[scanned:], '\n'); i >= 0 {
			end := scanned + i + 1
			line := f.buf[:end]
			f.buf = f.buf[end:]
			switch {
			case oversize: // the rest of an oversize line, already reported
				f.compact()
			case lineLength(line[:end-1]) > f.max: // it ended in the read that crossed the limit
				f.onDrop(Drop{Oversize: true, Bytes: end - 1})
				f.compact()
			default:
				f.emit(line)
			}
			return
		}
		scanned = len(f.buf)
		// No newline yet: a trailing "\r" may still be the start of "\r\n".
		if !oversize && lineLength(f.buf) > f.max {
			oversize = true
			f.onDrop(Drop{Oversize: true, Bytes: len(f.buf)})
		}
		if oversize { // keep nothing of it: only look for its end
			f.buf, scanned = f.buf[:0], 0
		}
		if f.err != nil {
			if !oversize && len(f.buf) > 0 { // a last line without a newline
				line := f.buf
				f.buf = nil
				f.emit(line)
			}
			return
		}
		n, err := f.r.Read(f.chunk)
		f.buf = append(f.buf, f.chunk[:n]...)
		if err != nil {
			f.err = err
		}
	}
}

// lineLength is the length of a line without its newline: its bytes less
// one "\r" at the end ("\r\n" ends a line as "\n" does).
func lineLength(line []byte) int {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return n - 1
	}
	return len(line)
}

// compact drops the consumed front of buf once it is large, so a rare huge
// line does not pin its memory.
func (f *LineFilter) compact() {
	if cap(f.buf) > 1<<20 && len(f.buf) < 64<<10 {
		f.buf = append([]byte(nil), f.buf...)
	}
}

// emit forwards a whole line that is a JSON object, or reports its drop.
func (f *LineFilter) emit(line []byte) {
	defer f.compact()
	body := bytes.TrimSpace(line)
	if len(body) == 0 {
		return
	}
	if body[0] != '{' || !json.Valid(body) {
		f.onDrop(Drop{Bytes: len(body)})
		return
	}
	f.pending = append(append(make([]byte, 0, len(body)+1), body...), '\n')
	f.onLine()
}
