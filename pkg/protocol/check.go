package protocol

import (
	"encoding/binary"
	"fmt"
)

// RequestDepthMax bounds how deeply a request's values may nest.
const RequestDepthMax = 128

// CheckMsgpack walks one MessagePack value without allocating and refuses
// what a decoder would turn into a huge allocation or a deep recursion: a
// declared array, map, string or binary length longer than the bytes that
// follow, nesting deeper than depthMax, a reserved code, or bytes after the
// value. Requests from the network are checked before they are decoded.
func CheckMsgpack(b []byte, depthMax int) error {
	end, err := skipValue(b, 0, depthMax)
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

// skipValue returns the offset after the value at off.
func skipValue(b []byte, off, depth int) (int, error) {
	if depth < 0 {
		return 0, fmt.Errorf("MessagePack nests deeper than %d levels", RequestDepthMax)
	}
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
	fixed := map[byte]int{0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8,
		0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}
	if n, ok := fixed[c]; ok {
		return off + n, need(b, off, n)
	}
	lenSize := map[byte]int{0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4, 0xc7: 1, 0xc8: 2, 0xc9: 4,
		0xdc: 2, 0xdd: 4, 0xde: 2, 0xdf: 4}
	size, ok := lenSize[c]
	if !ok {
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
