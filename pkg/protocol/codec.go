package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is the body encoding of a message: MessagePack by default, JSON when
// the request carries the header Content-Type: application/json (docs/design.md §3).
type Encoding int

const (
	Msgpack Encoding = iota
	JSON
)

// Header names of the wire contract.
const (
	HeaderContentType  = "Content-Type"
	ContentTypeJSON    = "application/json"
	ContentTypeMsgpack = "application/msgpack"
	// HeaderMessageID carries an inbox item's messageId on the inbox streams (BROOD_INBOX_<scope>).
	HeaderMessageID = "Brood-Message-Id"
	// HeaderTimeout carries how long the caller waits for the reply, in
	// milliseconds (decimal), measured when the request was sent: the
	// coordinator answers within it (docs/protocol.md §2.4). Relative, so
	// clocks need not agree.
	HeaderTimeout = "Brood-Timeout"
	// HeaderServiceError and HeaderServiceErrorCode are the micro error headers.
	HeaderServiceError     = "Nats-Service-Error"
	HeaderServiceErrorCode = "Nats-Service-Error-Code"
)

// ReplyMargin is how much sooner than its caller stops waiting a callee
// answers (docs/protocol.md §2.4): a tenth of the time it was given, between
// 100 ms and 1 s. A coordinator answers within Brood-Timeout less it; a
// provider instance gives up a start's or an activation's claim that much
// before the request's deadline, so the coordinator hears its UNAVAILABLE
// instead of its own timeout.
func ReplyMargin(t time.Duration) time.Duration {
	return min(max(t/10, 100*time.Millisecond), time.Second)
}

func (e Encoding) String() string {
	if e == JSON {
		return "json"
	}
	return "msgpack"
}

// ContentType is the media type of the encoding (the Content-Type header).
func (e Encoding) ContentType() string {
	if e == JSON {
		return ContentTypeJSON
	}
	return ContentTypeMsgpack
}

// RequestEncoding returns the encoding of a request: JSON when its
// Content-Type header says so (EncodingOf); otherwise JSON when the body,
// after ASCII whitespace, starts with `{` (a JSON object: what `nats req`
// sends when the header is forgotten), else MessagePack. The sniff cannot
// misread a MessagePack request, which is always a map (first byte 0x80–0x8f,
// 0xde or 0xdf), never the integer 0x7b that `{` would be.
func RequestEncoding(header map[string][]string, body []byte) Encoding {
	if EncodingOf(header) == JSON {
		return JSON
	}
	for _, b := range body {
		switch b {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return JSON
		}
		return Msgpack
	}
	return Msgpack
}

// EncodingOf returns the encoding a request asked for. NATS header lookups are
// case-sensitive, so the Content-Type header is matched in any case, and the
// media type in any case with parameters ignored.
func EncodingOf(header map[string][]string) Encoding {
	for k, vs := range header {
		if !strings.EqualFold(k, HeaderContentType) || len(vs) == 0 {
			continue
		}
		mt, _, _ := strings.Cut(vs[0], ";")
		if strings.EqualFold(strings.TrimSpace(mt), ContentTypeJSON) {
			return JSON
		}
	}
	return Msgpack
}

// Marshal encodes v. MessagePack uses compact integers, so an int64 holding 7
// travels as one byte and JavaScript decoders keep exact values up to 2^53.
//
// JSON is written without HTML escaping, so `>` in a subject or a message
// stays `>` rather than `\u003e`, and without a trailing newline.
func Marshal(enc Encoding, v any) ([]byte, error) {
	if enc == JSON {
		var buf bytes.Buffer
		e := json.NewEncoder(&buf)
		e.SetEscapeHTML(false)
		if err := e.Encode(v); err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
	}
	buf := encodeBufs.Get().(*bytes.Buffer)
	buf.Reset()
	e := msgpack.GetEncoder()
	e.Reset(buf)
	e.UseCompactInts(true)
	var err error
	switch r := v.(type) {
	case *RunRecord: // by hand: runcodec.go
		err = encodeRunRecord(e, r)
	case RunRecord:
		err = encodeRunRecord(e, &r)
	default:
		err = e.Encode(v)
	}
	msgpack.PutEncoder(e)
	var out []byte
	if err == nil {
		out = bytes.Clone(buf.Bytes()) // one allocation of the exact size
	}
	if buf.Cap() <= encodeBufKeptMax {
		encodeBufs.Put(buf)
	}
	return out, err
}

// Every start, record and event is encoded and decoded on the hot path of a
// run (issue 12's profile: msgpack.NewEncoder, the growth of a fresh
// bytes.Buffer and msgpack.NewDecoder were 9 % of the bytes a one-shot run
// allocated), so Marshal encodes into a pooled buffer with a pooled encoder
// and copies the result out once, and the decoders come from the msgpack
// library's pool.

// encodeBufKeptMax is the largest encode buffer, in bytes, kept for reuse:
// one that grew past it (a large log record) is left to the GC.
const encodeBufKeptMax = 64 << 10

var encodeBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// decodeMsgpackPooled decodes data into v with a pooled decoder and Brood's
// options (untyped numbers as int64/uint64/float64; strict: a field v does
// not know is an error). The decoder goes back to the pool only after a
// decode that succeeded: one that failed (perhaps mid-panic) is dropped.
func decodeMsgpackPooled(data []byte, v any, strict bool) error {
	d := msgpack.GetDecoder()
	d.Reset(bytes.NewReader(data))
	d.UseLooseInterfaceDecoding(true)
	d.DisallowUnknownFields(strict)
	var err error
	if r, ok := v.(*RunRecord); ok && !strict { // by hand: runcodec.go
		err = decodeRunRecord(d, r)
	} else {
		err = decodeMsgpack(d, v)
	}
	if err != nil {
		return err
	}
	msgpack.PutDecoder(d)
	return nil
}

// Unmarshal decodes data into v. Numbers inside untyped (`any`) values decode as
// int64 when integral and in range, else uint64 or float64, in both encodings,
// so a value keeps its exact integer across a JSON and a MessagePack hop.
func Unmarshal(enc Encoding, data []byte, v any) error {
	if enc == JSON {
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		if err := d.Decode(v); err != nil {
			return err
		}
		if d.More() {
			return fmt.Errorf("trailing data after the JSON value")
		}
		normalizeTarget(v)
		return nil
	}
	if err := decodeMsgpackPooled(data, v, false); err != nil {
		return err
	}
	normalizeTarget(v)
	return nil
}

// decodeMsgpack is d.Decode(v) with the msgpack library's panics turned
// into errors. The library (v5.4.1) panics on a map that gives the key of
// an untyped (any) struct field twice: it decodes the second value into the
// unaddressable copy the first left in the interface ("reflect.Value.SetInt
// using unaddressable value"). A record or reply with such a map must be
// refused like any other malformed input, never crash its reader
// (FuzzDecodeRequest found it).
func decodeMsgpack(d *msgpack.Decoder, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("MessagePack the decoder cannot read (a key given twice?): %v", p)
		}
	}()
	return d.Decode(v)
}

// normalizeTarget applies NormalizeNumbers to the untyped parts of a decoded value.
func normalizeTarget(v any) {
	switch x := v.(type) {
	case numberNormalizer:
		x.normalizeNumbers()
	case *any:
		*x = NormalizeNumbers(*x)
	case *map[string]any:
		NormalizeNumbers(*x)
	case *[]any:
		NormalizeNumbers(*x)
	}
}

// UnmarshalRequest decodes an untrusted request strictly: the structure is
// checked first (MessagePack: CheckMsgpack, declared lengths, depth and
// trailing bytes; JSON: CheckJSONDepth), so both encodings nest at most
// RequestDepthMax levels; a field the message type does not know is an error
// in both encodings, so an option is never accepted and then ignored; and a
// JSON number no float64 holds (1e400) is an error rather than a value
// Brood could not write back.
func UnmarshalRequest(enc Encoding, data []byte, v any) error {
	if enc == JSON {
		if err := CheckJSONDepth(data, RequestDepthMax); err != nil {
			return err
		}
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		d.DisallowUnknownFields()
		if err := d.Decode(v); err != nil {
			return err
		}
		if d.More() {
			return fmt.Errorf("trailing data after the JSON value")
		}
		if err := checkJSONNumbers(reflect.ValueOf(v)); err != nil {
			return err
		}
		normalizeTarget(v)
		return nil
	}
	if err := CheckMsgpack(data, RequestDepthMax); err != nil {
		return err
	}
	if err := decodeMsgpackPooled(data, v, true); err != nil {
		return err
	}
	normalizeTarget(v)
	return nil
}

// checkJSONNumbers refuses a json.Number anywhere in v (the untyped fields
// of a request decoded with UseNumber) that no float64 holds: NormalizeNumbers
// would make it NaN, which no JSON text can carry back.
func checkJSONNumbers(v reflect.Value) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		if n, ok := v.Interface().(json.Number); ok {
			if _, err := strconv.ParseFloat(string(n), 64); err != nil {
				return fmt.Errorf("number %s is out of the range of a float64", n)
			}
			return nil
		}
		return checkJSONNumbers(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				if err := checkJSONNumbers(v.Field(i)); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if err := checkJSONNumbers(v.Index(i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if err := checkJSONNumbers(it.Value()); err != nil {
				return err
			}
		}
	}
	return nil
}

// numberNormalizer is implemented by messages with untyped fields, which after
// a JSON decode hold json.Number values that must become real numbers.
type numberNormalizer interface{ normalizeNumbers() }

// NormalizeNumbers returns v with every integer as an int64 when it fits (a
// uint64 above that range stays uint64) and every json.Number replaced by such
// an integer or a float64, walking maps and slices. Both decoders then give
// the same Go value for the same number.
func NormalizeNumbers(v any) any {
	switch x := v.(type) {
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x)
		}
		return x
	case json.Number:
		s := string(x)
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			if i == 0 && strings.HasPrefix(s, "-") {
				return math.Copysign(0, -1) // keep -0 visible to validation
			}
			return i
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil {
			return u
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return math.NaN()
		}
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = NormalizeNumbers(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = NormalizeNumbers(e)
		}
		return x
	default:
		return v
	}
}

// ToJSONValue converts a value decoded from MessagePack (maps with any keys,
// byte slices) into one that encoding/json can marshal.
func ToJSONValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = ToJSONValue(e)
		}
		return x
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = ToJSONValue(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = ToJSONValue(e)
		}
		return x
	default:
		return v
	}
}
