package protocol

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// A run record is the hottest record of a run: created twice (spec and
// state) and written twice more (the claim, the settlement) per one-shot
// run, and decoded by every coordinator's runs watch each time. Reflection
// was 5 µs to encode and 7 µs to decode one (a settled record, 2-vCPU
// machine under load), so Marshal and Unmarshal encode and decode a
// RunRecord's own fields by hand (BENCHMARKS.md, issue 31 item 4). The
// bytes are those of the reflective encoder with Marshal's options (a map of
// the fields not omitted, in declaration order, compact integers), and the
// decoding is the reflective decoder's (unknown keys skipped, nil is the
// zero record, a key given twice keeps its last value); Result and
// Descriptor, present on few records, are left to the library. Strict
// decoding (UnmarshalRequest) stays reflective. TestRunRecordCodec holds
// both to the reflective codec for every field, so a field added to
// RunRecord without a line here fails it.

// encodeRunRecord writes r as the reflective encoder does with compact
// integers (Marshal's options).
func encodeRunRecord(e *msgpack.Encoder, r *RunRecord) error {
	n := 7 // runId childId parentSession provider mode state createdAt
	for _, set := range [...]bool{r.Notify != "", r.NotifyJSON, r.Structured, r.Remote, r.HostID != "", r.StartedAt != 0,
		r.NotStarted, r.SettledAt != 0, r.SettledBy != "", r.Result != nil, r.Descriptor != nil, r.Takeovers != 0} {
		if set {
			n++
		}
	}
	w := fieldWriter{e: e}
	w.err = e.EncodeMapLen(n)
	w.str("runId", r.RunID)
	w.str("childId", r.ChildID)
	w.str("parentSession", r.ParentSession)
	w.str("provider", r.Provider)
	w.str("mode", r.Mode)
	if r.Notify != "" {
		w.str("notify", r.Notify)
	}
	if r.NotifyJSON {
		w.boolean("notifyJson")
	}
	if r.Structured {
		w.boolean("structured")
	}
	if r.Remote {
		w.boolean("remote")
	}
	w.str("state", r.State)
	w.integer("createdAt", r.CreatedAt)
	if r.HostID != "" {
		w.str("hostId", r.HostID)
	}
	if r.StartedAt != 0 {
		w.integer("startedAt", r.StartedAt)
	}
	if r.NotStarted {
		w.boolean("notStarted")
	}
	if r.SettledAt != 0 {
		w.integer("settledAt", r.SettledAt)
	}
	if r.SettledBy != "" {
		w.str("settledBy", r.SettledBy)
	}
	if r.Result != nil {
		w.value("result", r.Result)
	}
	if r.Descriptor != nil {
		w.value("descriptor", r.Descriptor)
	}
	if r.Takeovers != 0 {
		w.integer("takeovers", r.Takeovers)
	}
	return w.err
}

// fieldWriter writes a map's keys and values until the first error.
type fieldWriter struct {
	e   *msgpack.Encoder
	err error
}

func (w *fieldWriter) key(k string) bool {
	if w.err == nil {
		w.err = w.e.EncodeString(k)
	}
	return w.err == nil
}

func (w *fieldWriter) str(k, v string) {
	if w.key(k) {
		w.err = w.e.EncodeString(v)
	}
}

// boolean writes k: true (a false is omitted).
func (w *fieldWriter) boolean(k string) {
	if w.key(k) {
		w.err = w.e.EncodeBool(true)
	}
}

func (w *fieldWriter) integer(k string, v int64) {
	if w.key(k) {
		w.err = w.e.EncodeInt(v)
	}
}

func (w *fieldWriter) value(k string, v any) {
	if w.key(k) {
		w.err = w.e.Encode(v)
	}
}

// decodeRunRecord reads a RunRecord as the reflective decoder does when it
// allows unknown fields (Unmarshal). A record encoded as an array (never
// written by Brood) is left to the reflective decoder.
func decodeRunRecord(d *msgpack.Decoder, r *RunRecord) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	if c != msgpcode.Nil && !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return decodeMsgpack(d, r)
	}
	n, err := d.DecodeMapLen()
	if err != nil {
		return err
	}
	if n == -1 {
		*r = RunRecord{}
		return nil
	}
	var kb [32]byte // longer than every key of the record
	for i := 0; i < n; i++ {
		k, err := readKey(d, kb[:])
		if err != nil {
			return err
		}
		switch string(k) { // compared without a copy
		case "":
			err = d.Skip()
		case "runId":
			r.RunID, err = d.DecodeString()
		case "childId":
			r.ChildID, err = d.DecodeString()
		case "parentSession":
			r.ParentSession, err = d.DecodeString()
		case "provider":
			r.Provider, err = d.DecodeString()
		case "mode":
			r.Mode, err = d.DecodeString()
		case "notify":
			r.Notify, err = d.DecodeString()
		case "notifyJson":
			r.NotifyJSON, err = d.DecodeBool()
		case "structured":
			r.Structured, err = d.DecodeBool()
		case "remote":
			r.Remote, err = d.DecodeBool()
		case "state":
			r.State, err = d.DecodeString()
		case "createdAt":
			r.CreatedAt, err = d.DecodeInt64()
		case "hostId":
			r.HostID, err = d.DecodeString()
		case "startedAt":
			r.StartedAt, err = d.DecodeInt64()
		case "notStarted":
			r.NotStarted, err = d.DecodeBool()
		case "settledAt":
			r.SettledAt, err = d.DecodeInt64()
		case "settledBy":
			r.SettledBy, err = d.DecodeString()
		case "result":
			err = decodeMsgpack(d, &r.Result)
		case "descriptor":
			err = decodeMsgpack(d, &r.Descriptor)
		case "takeovers":
			r.Takeovers, err = d.DecodeInt64()
		default:
			err = d.Skip()
		}
		if err != nil {
			return fmt.Errorf("msgpack: run record field %q: %w", k, err)
		}
	}
	return nil
}

// readKey reads a map key (a string or binary, as the reflective decoder
// accepts) into buf when it fits, without allocating; nil is "".
func readKey(d *msgpack.Decoder, buf []byte) ([]byte, error) {
	n, err := d.DecodeBytesLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	if n > len(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	return buf, d.ReadFull(buf)
}
