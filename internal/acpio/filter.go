package acpio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// LineBytesMaxDefault bounds one line of an agent's stdout. It stays below
// the ACP Go SDK's own scanner limit (10 MiB), whose overflow would close the
// connection; a longer line is dropped and reported instead.
const LineBytesMaxDefault = 8 << 20

// Drop describes a stdout line the filter did not forward.
type Drop struct {
	// Oversize: the line was longer than the limit (a lost protocol message,
	// so the caller should end the turn); otherwise it was not a JSON object.
	Oversize bool
	// Bytes is the line's length, newline excluded.
	Bytes int
}

// LineFilter reads an ACP agent's stdout and yields only the lines that are
// JSON objects, each whole and newline-terminated, to the SDK's reader: stray
// text (a banner, a debug print) never reaches the JSON-RPC decoder, and no
// line is ever split or truncated. Lines up to the limit pass however long
// (64 KiB is no boundary). Not safe for concurrent use (one reader).
type LineFilter struct {
	br      *bufio.Reader
	max     int
	onLine  func()
	onDrop  func(Drop)
	line    []byte
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
	return &LineFilter{br: bufio.NewReaderSize(r, 64<<10), max: maxLineBytes, onLine: onLine, onDrop: onDrop}
}

// Read implements io.Reader.
func (f *LineFilter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		f.next()
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// next reads one line and either queues it for Read or reports its drop.
func (f *LineFilter) next() {
	f.line = f.line[:0]
	total, oversize := 0, false
	for {
		chunk, err := f.br.ReadSlice('\n')
		total += len(chunk)
		if !oversize {
			if len(f.line)+len(chunk) > f.max+2 { // the limit plus "\r\n"
				oversize = true
				f.line = f.line[:0]
			} else {
				f.line = append(f.line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			f.err = err
			if total == 0 {
				return
			}
		}
		break
	}
	if oversize {
		f.onDrop(Drop{Oversize: true, Bytes: total})
		return
	}
	body := bytes.TrimSpace(f.line)
	if len(body) == 0 {
		return
	}
	if body[0] != '{' || !json.Valid(body) {
		f.onDrop(Drop{Bytes: len(body)})
		return
	}
	f.pending = append(body, '\n')
	if cap(f.line) > 1<<20 { // do not keep a huge buffer after a rare huge line
		f.line = nil
	}
	f.onLine()
}
