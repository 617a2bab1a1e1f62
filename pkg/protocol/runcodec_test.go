package protocol

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// plainRun is RunRecord without its hand-written codec: the same fields and
// tags, so the library encodes and decodes it by reflection.
type plainRun RunRecord

// reflectiveEncode is Marshal's msgpack encoding done by reflection.
func reflectiveEncode(t *testing.T, r RunRecord) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.Encode(plainRun(r)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// reflectiveDecode is Unmarshal's msgpack decoding done by reflection,
// into a copy of into.
func reflectiveDecode(t *testing.T, data []byte, into RunRecord) (RunRecord, error) {
	t.Helper()
	p := plainRun(into)
	d := msgpack.NewDecoder(bytes.NewReader(data))
	d.UseLooseInterfaceDecoding(true)
	err := d.Decode(&p)
	r := RunRecord(p)
	normalizeTarget(&r)
	return r, err
}

// setField gives field i of r a value that is not its zero value, derived
// from seed. A field of a kind it does not know fails the test: the hand
// codec must learn it.
func setField(t *testing.T, r *RunRecord, i int, seed int) {
	t.Helper()
	f := reflect.ValueOf(r).Elem().Field(i)
	name := reflect.TypeOf(*r).Field(i).Name
	switch f.Kind() {
	case reflect.String:
		f.SetString(fmt.Sprintf("%s-%d", name, seed))
	case reflect.Bool:
		f.SetBool(true)
	case reflect.Int64:
		f.SetInt(int64(seed)*1_000_003 + int64(i) + 1)
	case reflect.Pointer:
		switch v := f.Addr().Interface().(type) {
		case **SubagentResult:
			*v = &SubagentResult{Output: Text(fmt.Sprintf("out %d", seed)), StopReason: StopCompleted, Structured: map[string]any{"n": int64(seed)}}
		case **DescriptorData:
			*v = &DescriptorData{Version: DescriptorVersion, Mode: ModeContinuable, Provider: "spawn", Label: fmt.Sprint(seed)}
		default:
			t.Fatalf("RunRecord.%s: a pointer to %s: teach runcodec.go and this test its type", name, f.Type().Elem())
		}
	default:
		t.Fatalf("RunRecord.%s: kind %s: teach runcodec.go and this test its kind", name, f.Kind())
	}
}

// TestRunRecordCodec: the hand-written codec of RunRecord (runcodec.go)
// writes the reflective encoder's bytes and reads them as the reflective
// decoder does, for each field alone, every field, random subsets, and the
// decoder's edge cases.
func TestRunRecordCodec(t *testing.T) {
	nf := reflect.TypeOf(RunRecord{}).NumField()
	var cases []RunRecord
	cases = append(cases, RunRecord{})
	for i := 0; i < nf; i++ { // each field alone
		var r RunRecord
		setField(t, &r, i, i)
		cases = append(cases, r)
	}
	var all RunRecord
	for i := 0; i < nf; i++ {
		setField(t, &all, i, 7)
	}
	cases = append(cases, all)
	rng := rand.New(rand.NewPCG(31, 4))
	for n := 0; n < 200; n++ { // random subsets
		var r RunRecord
		for i := 0; i < nf; i++ {
			if rng.IntN(2) == 0 {
				setField(t, &r, i, rng.IntN(1<<20))
			}
		}
		if n%5 == 0 {
			r.CreatedAt = -r.CreatedAt // negative and large integers too
			r.StartedAt = 1 << 40
		}
		cases = append(cases, r)
	}
	for i, r := range cases {
		got, err := Marshal(Msgpack, &r)
		if err != nil {
			t.Fatal(err)
		}
		if want := reflectiveEncode(t, r); !bytes.Equal(got, want) {
			t.Fatalf("case %d %+v: encoded\n%x\nreflective encoder\n%x", i, r, got, want)
		}
		byValue, err := Marshal(Msgpack, r)
		if err != nil || !bytes.Equal(byValue, got) {
			t.Fatalf("case %d: by value %x (%v), by pointer %x", i, byValue, err, got)
		}
		var back RunRecord
		if err := Unmarshal(Msgpack, got, &back); err != nil {
			t.Fatal(err)
		}
		want, err := reflectiveDecode(t, got, RunRecord{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, want) {
			t.Fatalf("case %d: decoded %+v, reflective decoder %+v", i, back, want)
		}
	}
}

// TestRunRecordDecodeEdges: what the reflective decoder does with input
// Brood does not write, the hand decoder does too.
func TestRunRecordDecodeEdges(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	prior := RunRecord{RunID: "kept", State: RunRunning, CreatedAt: 5, Result: &SubagentResult{StopReason: StopCompleted}}
	for _, c := range []struct {
		name string
		data []byte
		into RunRecord
	}{
		{"nil is the zero record", enc(nil), prior},
		{"unknown keys are skipped", enc(map[string]any{"runId": "r", "future": map[string]any{"a": []any{1, "x"}}, "state": "settled"}), RunRecord{}},
		{"fields absent keep the prior value", enc(map[string]any{"state": "settled", "settledAt": 9}), prior},
		{"a key given twice keeps the last", append([]byte{0x82}, append(append(enc("runId"), enc("a")...), append(enc("runId"), enc("b")...)...)...), RunRecord{}},
		{"a nil result clears it", enc(map[string]any{"result": nil}), prior},
		{"an empty map", enc(map[string]any{}), prior},
		{"an array-encoded record", enc([]any{"r"}), RunRecord{}},
		{"a string, not a record", enc("nope"), RunRecord{}},
		{"a wrong type for a field", enc(map[string]any{"createdAt": "x"}), RunRecord{}},
		{"truncated", enc(map[string]any{"runId": "abcdef"})[:5], RunRecord{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want, wantErr := reflectiveDecode(t, c.data, c.into)
			got := c.into
			if c.into.Result != nil {
				res := *c.into.Result
				got.Result = &res
			}
			err := Unmarshal(Msgpack, c.data, &got)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("error %v, reflective decoder's %v", err, wantErr)
			}
			if err == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %+v, reflective decoder %+v", got, want)
			}
		})
	}
}

func BenchmarkRunRecordCodec(b *testing.B) {
	r := RunRecord{RunID: "01M98AFNEV4FTK52W2MS86V8W4", ChildID: "01M98AFNEV4FTK52W2MS86V8W5", ParentSession: "01M98AFNEV4FTK52W2MS86V8W6",
		Provider: "spawn", Mode: ModeOneShot, Notify: "_INBOX.abcdefghijkl.xyz", State: RunSettled, CreatedAt: 1765000000000,
		HostID: "spawn.01M98AFNEV4FTK52W2MS86V8W7", StartedAt: 1765000000100, SettledAt: 1765000000200, SettledBy: "host",
		Result: &SubagentResult{Output: Text("ok"), StopReason: StopCompleted}}
	claimed := r
	claimed.State, claimed.SettledAt, claimed.SettledBy, claimed.Result = RunRunning, 0, "", nil
	for _, c := range []struct {
		name string
		r    RunRecord
	}{{"settled", r}, {"claimed", claimed}} {
		data, _ := Marshal(Msgpack, &c.r)
		b.Run(c.name+"/encode", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Marshal(Msgpack, &c.r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/encode-reflective", func(b *testing.B) {
			b.ReportAllocs()
			p := plainRun(c.r)
			for i := 0; i < b.N; i++ {
				if _, err := Marshal(Msgpack, &p); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var x RunRecord
				if err := Unmarshal(Msgpack, data, &x); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/decode-reflective", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var x plainRun
				if err := Unmarshal(Msgpack, data, &x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
