package acpio

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/brood-dev/brood/internal/testutil/fuzzcheck"
)

// fuzzReader hands out its data in reads of at most step bytes; with
// eofEarly it returns io.EOF together with the last bytes, as some readers
// do.
type fuzzReader struct {
	data     []byte
	step     int
	eofEarly bool
}

func (r *fuzzReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.data[:min(r.step, len(r.data))])
	r.data = r.data[n:]
	if r.eofEarly && len(r.data) == 0 {
		return n, io.EOF
	}
	return n, nil
}

// expectedFilter is the LineFilter's contract applied line by line: the
// input split at "\n" (a last piece without one is a line too); a line's
// length leaves out one "\r" before its end; a line longer than max is an
// oversize drop; a blank line vanishes; a line whose trimmed text is a JSON
// object is forwarded trimmed, with "\n"; any other line is a drop of its
// trimmed length.
func expectedFilter(data []byte, lineMax int) (out []byte, lines int, drops []Drop) {
	pieces := bytes.Split(data, []byte("\n"))
	if len(pieces[len(pieces)-1]) == 0 {
		pieces = pieces[:len(pieces)-1] // data ended with "\n" (or was empty)
	}
	for _, line := range pieces {
		if contentLength(line) > lineMax {
			drops = append(drops, Drop{Oversize: true, Bytes: len(line)})
			continue
		}
		body := bytes.TrimSpace(line)
		switch {
		case len(body) == 0:
		case body[0] == '{' && json.Valid(body):
			out = append(append(out, body...), '\n')
			lines++
		default:
			drops = append(drops, Drop{Bytes: len(body)})
		}
	}
	return out, lines, drops
}

// contentLength is a line's length without one "\r" at its end.
func contentLength(line []byte) int {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return n - 1
	}
	return len(line)
}

// filterAllocBound: the read buffer (64 KiB), the line buffer's growth
// (a line at most max bytes plus one read, reallocated as it slides) and
// each forwarded line's copy.
var filterAllocBound = fuzzcheck.Bound{Base: 256 << 10, PerByte: 16}

// FuzzLineFilter holds the ACP stdout filter to its contract
// (expectedFilter) whatever the input and however it is cut into reads:
// every line within the limit that is a JSON object comes out whole, in
// order, and nothing else does; every other non-blank line is reported
// once, an oversize one (with at least max+1 bytes seen) apart from a
// non-JSON one; no forwarded line is longer than the limit; the filter
// never holds more than the limit plus one read, and allocates within
// filterAllocBound.
func FuzzLineFilter(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzLineFilter", 10)
	f.Fuzz(func(t *testing.T, data []byte, maxLine uint16, step uint8, eofEarly bool) {
		lineMax := int(maxLine % 1024) // small limits, so lines cross them
		if lineMax == 0 {
			lineMax = 1024
		}
		wantOut, wantLines, wantDrops := expectedFilter(data, lineMax)
		var out []byte
		var lines int
		var drops []Drop
		var held int
		fuzzcheck.AllocWithin(t, "filtering", filterAllocBound.Of(len(data)), func() {
			out, lines, drops, held = nil, 0, nil, 0
			lf := NewLineFilter(&fuzzReader{data: data, step: int(step) + 1, eofEarly: eofEarly}, lineMax,
				func() { lines++ }, func(d Drop) { drops = append(drops, d) })
			p := make([]byte, 1+int(step)%7) // small reads of the filter too
			for {
				n, err := lf.Read(p)
				out = append(out, p[:n]...)
				held = max(held, len(lf.buf))
				if len(lf.pending) > lineMax+1 {
					t.Fatalf("a pending line of %d bytes, limit %d", len(lf.pending), lineMax)
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		})
		if !bytes.Equal(out, wantOut) {
			t.Fatalf("forwarded %q, want %q (limit %d)", out, wantOut, lineMax)
		}
		for _, line := range bytes.SplitAfter(out, []byte("\n")) {
			if len(bytes.TrimSuffix(line, []byte("\n"))) > lineMax {
				t.Fatalf("forwarded a line of %d bytes, limit %d", len(line)-1, lineMax)
			}
		}
		if lines != wantLines {
			t.Fatalf("onLine called %d times for %d lines", lines, wantLines)
		}
		if len(drops) != len(wantDrops) {
			t.Fatalf("drops %+v, want %+v (limit %d)", drops, wantDrops, lineMax)
		}
		for i, d := range drops {
			w := wantDrops[i]
			if d.Oversize != w.Oversize {
				t.Fatalf("drop %d is %+v, want %+v", i, d, w)
			}
			// An oversize line is reported when it crosses the limit,
			// with what had arrived by then.
			if w.Oversize && (d.Bytes <= lineMax || d.Bytes > w.Bytes) || !w.Oversize && d.Bytes != w.Bytes {
				t.Fatalf("drop %d is %+v, want %+v (limit %d)", i, d, w, lineMax)
			}
		}
		if limit := lineMax + 1 + int(step) + 1; held > limit {
			t.Fatalf("held %d bytes, more than the limit %d plus one read", held, lineMax)
		}
	})
}
