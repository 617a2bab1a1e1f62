package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// RequestDepthMax bounds how deeply a request's values may nest, in both
// encodings (arrays and maps/objects each count a level).
const RequestDepthMax = 128

// CheckMsgpack walks one MessagePack value without allocating and refuses
// what a decoder would turn into a huge allocation or a deep recursion: a
// declared array, map, string or binary length longer than the bytes that
// follow, nesting deeper than depthMax, a reserved code, or bytes after the
// value. Requests from the network are checked before they are decoded.
func CheckMsgpack(b []byte, depthMax int) error {
	end, err := skipValue(b, 0, depthMax)
	if errors.Is(err, errTooDeep) {
		return fmt.Errorf("MessagePack nests deeper than %d levels", depthMax)
	}
	if err != nil {
		return err
	}
	if end != len(b) {
		return fmt.Errorf("%d bytes after the MessagePack value", len(b)-end)
	}
	return nil
}

func need(b []byte, off, n int) error {
	if n < 0 || off+n > len(b) || off+n < off {
		return fmt.Errorf("truncated MessagePack at byte %d", off)
	}
	return nil
}

func uintAt(b []byte, off, size int) (int, error) {
	if err := need(b, off, size); err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return int(b[off]), nil
	case 2:
		return int(binary.BigEndian.Uint16(b[off:])), nil
	default:
		v := binary.BigEndian.Uint32(b[off:])
		if uint64(v) > uint64(len(b)) {
			return 0, fmt.Errorf("MessagePack length %d at byte %d is longer than the message", v, off)
		}
		return int(v), nil
	}
}

// fixedSize is the payload size of each MessagePack code whose value has a
// fixed size (floats, ints, fixext with its type byte); lenSize is the size
// of the length field of each str, bin, ext, array and map code. Zero: not
// such a code. Tables, so the walk allocates nothing.
var (
	fixedSize = [256]int8{0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8,
		0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}
	lenSize = [256]int8{0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4, 0xc7: 1, 0xc8: 2, 0xc9: 4,
		0xdc: 2, 0xdd: 4, 0xde: 2, 0xdf: 4}
)

// errTooDeep is skipValue's answer to a container nested too deeply.
var errTooDeep = errors.New("nested too deeply")

// skipValue returns the offset after the value at off, which may open at
// most depth more levels of arrays and maps (each container is a level, as
// in CheckJSONDepth).
func skipValue(b []byte, off, depth int) (int, error) {
	if err := need(b, off, 1); err != nil {
		return 0, err
	}
	c := b[off]
	off++
	switch {
	case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		return off, nil
	case c >= 0x80 && c <= 0x8f:
		return skipItems(b, off, 2*int(c&0x0f), depth)
	case c >= 0x90 && c <= 0x9f:
		return skipItems(b, off, int(c&0x0f), depth)
	case c >= 0xa0 && c <= 0xbf:
		n := int(c & 0x1f)
		return off + n, need(b, off, n)
	}
	if n := int(fixedSize[c]); n > 0 {
		return off + n, need(b, off, n)
	}
	size := int(lenSize[c])
	if size == 0 {
		return 0, fmt.Errorf("reserved MessagePack code 0x%02x at byte %d", c, off-1)
	}
	n, err := uintAt(b, off, size)
	if err != nil {
		return 0, err
	}
	off += size
	switch c {
	case 0xdc, 0xdd:
		return skipItems(b, off, n, depth)
	case 0xde, 0xdf:
		return skipItems(b, off, 2*n, depth)
	case 0xc7, 0xc8, 0xc9:
		n++ // the extension's type byte
	}
	return off + n, need(b, off, n)
}

func skipItems(b []byte, off, n, depth int) (int, error) {
	if depth <= 0 {
		return 0, errTooDeep
	}
	if n > len(b)-off { // every item takes at least one byte
		return 0, fmt.Errorf("MessagePack declares %d items at byte %d, more than the message holds", n, off)
	}
	var err error
	for i := 0; i < n; i++ {
		if off, err = skipValue(b, off, depth-1); err != nil {
			return 0, err
		}
	}
	return off, nil
}

// CheckJSONDepth refuses JSON text whose arrays and objects nest deeper than
// depthMax, without allocating (encoding/json alone allows 10,000 levels).
// It only counts brackets outside strings; the decoder judges the rest.
func CheckJSONDepth(b []byte, depthMax int) error {
	depth, inString, escaped := 0, false, false
	for i, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > depthMax {
				return fmt.Errorf("JSON nests deeper than %d levels at byte %d", depthMax, i)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}
