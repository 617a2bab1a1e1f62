package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/brood-dev/brood/internal/testutil/fuzzcheck"
)

// FuzzCheckMsgpack holds CheckMsgpack, the structure check every MessagePack
// request passes before it is decoded, against the msgpack library itself:
//   - with no depth bound it accepts exactly what the library's Skip reads
//     as one whole value (nothing before, nothing after);
//   - the depth it enforces is the nesting of arrays and maps as the
//     library's own length readers see it: a value of depth k passes with
//     depthMax k and fails with k-1 (the same count as CheckJSONDepth);
//   - accepting allocates nothing.
func FuzzCheckMsgpack(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzCheckMsgpack", 10)
	f.Fuzz(func(t *testing.T, b []byte) {
		unbounded := len(b) + 1 // no value nests deeper than its byte count
		err := CheckMsgpack(b, unbounded)
		r := bytes.NewReader(b)
		d := msgpack.NewDecoder(r)
		skipErr := d.Skip()
		whole := skipErr == nil && r.Len() == 0
		if (err == nil) != whole {
			t.Fatalf("CheckMsgpack says %v, the library's Skip %v with %d bytes left", err, skipErr, r.Len())
		}
		if err != nil {
			return
		}
		fuzzcheck.NoAlloc(t, "CheckMsgpack of an accepted value", func() { _ = CheckMsgpack(b, unbounded) })
		k, err := msgpackDepth(msgpack.NewDecoder(bytes.NewReader(b)))
		if err != nil {
			t.Fatalf("the library cannot walk what Skip read: %v", err)
		}
		if err := CheckMsgpack(b, k); err != nil {
			t.Fatalf("a value of depth %d is refused with depthMax %d: %v", k, k, err)
		}
		if k > 0 {
			if err := CheckMsgpack(b, k-1); err == nil {
				t.Fatalf("a value of depth %d passes with depthMax %d", k, k-1)
			}
		}
	})
}

// msgpackDepth is the nesting of arrays and maps of the next value, read
// with the library's own length decoders.
func msgpackDepth(d *msgpack.Decoder) (int, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	var n, items int
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err = d.DecodeArrayLen()
		items = n
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err = d.DecodeMapLen()
		items = 2 * n
	default:
		return 0, d.Skip()
	}
	if err != nil {
		return 0, err
	}
	deepest := 0
	for range items {
		k, err := msgpackDepth(d)
		if err != nil {
			return 0, err
		}
		deepest = max(deepest, k)
	}
	return deepest + 1, nil
}

// FuzzCheckJSONDepth holds CheckJSONDepth against encoding/json: for valid
// JSON it passes at exactly the nesting encoding/json's tokens show, it
// allocates nothing when it accepts, and a JSON value within RequestDepthMax is within it as
// MessagePack too (a request keeps its verdict across encodings).
func FuzzCheckJSONDepth(f *testing.F) {
	fuzzcheck.SeedsPresent(f, "FuzzCheckJSONDepth", 5)
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckJSONDepth(b, RequestDepthMax) == nil {
			fuzzcheck.NoAlloc(t, "CheckJSONDepth of accepted text", func() { _ = CheckJSONDepth(b, RequestDepthMax) })
		}
		if !json.Valid(b) {
			return
		}
		k, err := jsonDepth(b)
		if err != nil {
			t.Fatalf("valid JSON does not tokenize: %v", err)
		}
		if err := CheckJSONDepth(b, k); err != nil {
			t.Fatalf("JSON of depth %d is refused with depthMax %d: %v", k, k, err)
		}
		if k > 0 {
			if err := CheckJSONDepth(b, k-1); err == nil {
				t.Fatalf("JSON of depth %d passes with depthMax %d", k, k-1)
			}
		}
		if k > RequestDepthMax {
			return
		}
		var v any
		if err := Unmarshal(JSON, b, &v); err != nil {
			return // one value per body: trailing blanks are all json.Valid allows
		}
		mp, err := Marshal(Msgpack, v)
		if err != nil {
			t.Fatalf("a decoded JSON value does not encode as MessagePack: %v", err)
		}
		if err := CheckMsgpack(mp, RequestDepthMax); err != nil {
			t.Fatalf("JSON of depth %d is refused as MessagePack: %v", k, err)
		}
	})
}

// jsonDepth is the nesting of arrays and objects in valid JSON text.
func jsonDepth(b []byte) (int, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	depth, deepest := 0, 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return deepest, nil
		}
		if err != nil {
			return 0, err
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			depth++
			deepest = max(deepest, depth)
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}
