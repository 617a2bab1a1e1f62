package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/pkg/protocol"
)

// TestDeleteErrorKeepsTheCode: nats.go reports a refused message deletion
// with the API error as text only; deleteError recovers its code, so an
// election's "temporarily unavailable" is retried and "not found" is gone.
func TestDeleteErrorKeepsTheCode(t *testing.T) {
	refused := func(code int) error {
		return fmt.Errorf("%w: nats: API error: code=400 err_code=%d description=x", jetstream.ErrMsgDeleteUnsuccessful, code)
	}
	if err := deleteError(refused(10008)); !Transient(err) {
		t.Errorf("10008 after deleteError: not transient: %v", err)
	}
	var apiErr *jetstream.APIError
	if err := deleteError(refused(errCodeSequenceNotFound)); !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeSequenceNotFound || Transient(err) {
		t.Errorf("10043 after deleteError = %v", err)
	}
	if err := deleteError(jetstream.ErrMsgNotFound); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("other errors pass through: %v", err)
	}
}

// runsBucket provisions a store named name and returns it, its brood_runs
// bucket and a context of 10 s for the test.
func runsBucket(t *testing.T, name string) (*Store, *bucket, context.Context) {
	t.Helper()
	st := provisioned(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	b, ok := st.Runs.(*bucket)
	if !ok {
		t.Fatalf("the store's buckets are %T, not *bucket", st.Runs)
	}
	return st, b, ctx
}

// TestLeaderReads: the reads that decide whether a write landed (leaderLast,
// a bucket's leaderGet) see the latest value, a deleted key as gone, and a
// missing subject as not found.
func TestLeaderReads(t *testing.T) {
	st, b, ctx := runsBucket(t, "leader")
	if _, _, found, err := b.leaderGet(ctx, "K"); found || err != nil {
		t.Fatalf("missing key: found %v, %v", found, err)
	}
	rev, err := Put(ctx, st.Runs, "K", protocol.RunRecord{RunID: "K"})
	if err != nil {
		t.Fatal(err)
	}
	data, got, found, err := b.leaderGet(ctx, "K")
	var rec protocol.RunRecord
	if err != nil || !found || got != rev || protocol.Unmarshal(protocol.Msgpack, data, &rec) != nil || rec.RunID != "K" {
		t.Fatalf("leaderGet = rev %d (want %d), found %v, %+v, %v", got, rev, found, rec, err)
	}
	if err := Delete(ctx, st.Runs, "K", rev); err != nil {
		t.Fatal(err)
	}
	if _, _, found, err := b.leaderGet(ctx, "K"); found || err != nil {
		t.Fatalf("deleted key: found %v, %v", found, err)
	}
	if _, err := st.leaderLast(ctx, st.Subj.StreamLog(protocol.ScopeRoot), st.Subj.Log(protocol.ScopeRoot, "none")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("missing subject: %v", err)
	}
}

// TestReadLogPastALaggingReplica: a whole-log read (and a tail read) whose
// direct batch gets are answered by a replica that lacks some records
// (Faults.Lagging) reads those from the stream's leader and returns what a
// read of a current replica returns, across several batches; an empty log
// reads empty.
func TestReadLogPastALaggingReplica(t *testing.T) {
	st := provisioned(t, "lagging-log")
	// A bound, not a wait: a record the lagging replica lacks is read from
	// the leader one by one, which under -race on a loaded 2-core machine
	// took 16 s of the 20 s this bound was (loaded-test, 2026-12-07).
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	w, other := st.NewLogWriter(protocol.ScopeRoot, "A", 0, 0), st.NewLogWriter(protocol.ScopeRoot, "B", 0, 0)
	for i := 0; i < 2*LogReadBatch+7; i++ {
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			if _, err := other.Append(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A replica applies records in order: one that lacks a record lacks
	// every later one. Each batch it answers stops before the first it
	// lacks (the server still sends the rest of the batch, which the test
	// pays for: the cases are kept small).
	for _, c := range []struct {
		name, id string
		lacks    func(last uint64) func(seq uint64) bool
	}{
		{"lacks the last 40 records, past a full batch", "A", func(last uint64) func(uint64) bool {
			return func(seq uint64) bool { return seq > last-40 }
		}},
		{"lacks every record", "B", func(uint64) func(uint64) bool {
			return func(uint64) bool { return true }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			current, err := st.ReadLog(ctx, protocol.ScopeRoot, c.id)
			if err != nil {
				t.Fatal(err)
			}
			var asked atomic.Int64
			lacks := c.lacks(current.LastSubjSeq)
			lag := st.WithFaults(Faults{Lagging: func(seq uint64) bool {
				if !lacks(seq) {
					return false
				}
				asked.Add(1)
				return true
			}})
			got, err := lag.ReadLog(ctx, protocol.ScopeRoot, c.id)
			if err != nil {
				t.Fatal(err)
			}
			if asked.Load() == 0 {
				t.Fatal("the lagging replica never lacked a record")
			}
			if len(got.Events) != len(current.Events) || got.LastSubjSeq != current.LastSubjSeq {
				t.Fatalf("read past a lagging replica: %d events, last %d; current: %d events, last %d", len(got.Events), got.LastSubjSeq, len(current.Events), current.LastSubjSeq)
			}
			for i, ev := range got.Events {
				if ev.Seq != int64(i) || !bytes.Equal(ev.Data, current.Events[i].Data) {
					t.Fatalf("event %d: seq %d %x, want seq %d %x", i, ev.Seq, ev.Data, i, current.Events[i].Data)
				}
			}
			last := int64(len(current.Events) - 1)
			tail, _, err := lag.ReadLogTail(ctx, protocol.ScopeRoot, c.id, func(evs []protocol.SessionEvent) bool { return len(evs) >= 10 })
			if err != nil || len(tail) < 10 || tail[len(tail)-1].Seq != last {
				t.Fatalf("tail past a lagging replica: %d events, %v", len(tail), err)
			}
		})
	}
	lag := st.WithFaults(Faults{Lagging: func(uint64) bool { return true }})
	if empty, err := lag.ReadLog(ctx, protocol.ScopeRoot, "none"); err != nil || len(empty.Events) != 0 {
		t.Fatalf("read of an empty log: %+v, %v", empty, err)
	}
}

// staleReplica answers the direct get of a subject's last message with its
// first one, as a replica that is not yet current (after a restart or a
// partition) can.
type staleReplica struct {
	jetstream.Stream
}

func (s staleReplica) GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil && m.Subject == subject {
			return m, nil
		}
	}
	return nil, jetstream.ErrMsgNotFound
}

// TestReadLogAsksTheLeaderForTheLastRecord: a whole-log read gets the last
// record from the stream's leader, so a replica that answers an older one
// cannot make a stale log look whole; an append after the read names the
// real last record and is not refused as fenced (chaos seed 1 of make test:
// a cold-resumed activation stopped fenced while its lease was its own).
func TestReadLogAsksTheLeaderForTheLastRecord(t *testing.T) {
	st := provisioned(t, "stale")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w := st.NewLogWriter(protocol.ScopeRoot, "S", 0, 0)
	for i := 0; i < 3; i++ {
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	rootLog, err := st.LogStream(ctx, protocol.ScopeRoot)
	if err != nil {
		t.Fatal(err)
	}
	st.streams.Store(st.Subj.StreamLog(protocol.ScopeRoot), staleReplica{rootLog})
	log, err := st.ReadLog(ctx, protocol.ScopeRoot, "S")
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Events) != 3 || log.LastSubjSeq != w.LastSubjSeq() {
		t.Fatalf("read %d events up to record %d; the log has 3 up to record %d", len(log.Events), log.LastSubjSeq, w.LastSubjSeq())
	}
	next := st.NewLogWriter(protocol.ScopeRoot, "S", log.LastSubjSeq, int64(len(log.Events)))
	ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Append(ctx, ev); err != nil {
		t.Fatalf("append after the read: %v", err)
	}
}

// provisioned is a store provisioned on a fresh embedded server named name
// (package store's own tests cannot use internal/testutil, which imports
// this package); both stop when the test ends.
func provisioned(t *testing.T, name string) *Store {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: -1, DataDir: t.TempDir(), ServerName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := Provision(ctx, nc, protocol.MustSubjects(""), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// laggingReplica is a runs bucket whose replica reads (Get) have not
// applied the runs' states yet, as a node catching up after a restart
// answers direct gets; its leader reads see them.
type laggingReplica struct{ *bucket }

func (l laggingReplica) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if kind, _, _ := RunsKindOf(key); kind == RunsState {
		return nil, jetstream.ErrKeyNotFound
	}
	return l.bucket.Get(ctx, key)
}

// TestARunsStateMissingOnAReplicaIsReadFromTheLeader: a run whose spec is
// found but whose state a replica has not applied yet is read from the
// leader, not answered as no run (runs.await answered a caller's existing
// run UNAUTHORIZED, "not a run of session ... (or does not exist)", right
// after a node restarted in deploy's election test). The leader read is the
// bucket's through a wrapper that has no leaderGet of its own (plainLayer:
// before layerAs, such a wrapper's reads fell back to its Get, the
// replica's).
func TestARunsStateMissingOnAReplicaIsReadFromTheLeader(t *testing.T) {
	st := provisioned(t, "lagging")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec := protocol.RunRecord{RunID: "R1", ChildID: "C1", ParentSession: "P1", Provider: "spawn", Mode: protocol.ModeOneShot,
		State: protocol.RunRunning, CreatedAt: 1}
	rev, err := st.CreateRun(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	b := st.Runs.(*bucket)
	for _, c := range []struct {
		name string
		runs jetstream.KeyValue
	}{
		{"the bucket", laggingReplica{b}},
		{"a wrapper of the bucket", plainLayer{laggingReplica{b}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st.Runs = c.runs
			if _, err := st.Runs.Get(ctx, RunStateKey("spawn", "R1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("the lagging replica answers the state: %v", err)
			}
			got, err := st.Run(ctx, "R1")
			if err != nil || got.Revision != rev || got.Value.State != protocol.RunRunning || got.Value.ChildID != "C1" {
				t.Fatalf("Run = %+v at %d, %v; want the running record at %d", got.Value, got.Revision, err, rev)
			}
			if _, err := st.Run(ctx, "NONE"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("a run that does not exist: %v, want ErrNotFound", err)
			}
		})
	}
}

// TestReadRecordsEndsAtTheLastRecordRead: the payload-only batch gets of a
// log read (readRecords) stop at the record holding the last record's last
// event, whatever the stream holds after it (a record appended after the
// last record was read), start where asked (a tail's window), continue
// across batches (TestReadLogPastALaggingReplica), and call a stream that
// does not hold records up to the last one incomplete.
func TestReadRecordsEndsAtTheLastRecordRead(t *testing.T) {
	st := provisioned(t, "records")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subject := st.Subj.Log(protocol.ScopeRoot, "R")
	w, other := st.NewLogWriter(protocol.ScopeRoot, "R", 0, 0), st.NewLogWriter(protocol.ScopeRoot, "O", 0, 0)
	var seqs []uint64 // the stream sequence of each of R's records
	for i := 0; i < 5; i++ {
		var evs []protocol.SessionEvent
		for j := 0; j < 2; j++ {
			ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{Turn: int64(2*i + j)})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		if _, err := w.Append(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Append(ctx, evs[0]); err != nil { // another session's record between R's
			t.Fatal(err)
		}
		m, err := st.leaderLast(ctx, st.Subj.StreamLog(protocol.ScopeRoot), subject)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, m.Sequence)
	}
	record := func(i int) *jetstream.RawStreamMsg {
		str, err := st.LogStream(ctx, protocol.ScopeRoot)
		if err != nil {
			t.Fatal(err)
		}
		m, err := str.GetMsg(ctx, seqs[i])
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	overstated := func() *jetstream.RawStreamMsg { // a last record the stream does not hold up to
		ev, err := protocol.NewEvent(protocol.EvTurnStart, 1, protocol.TurnData{})
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = 50
		data, err := protocol.Marshal(protocol.Msgpack, protocol.LogRecord{Events: []protocol.SessionEvent{ev}})
		if err != nil {
			t.Fatal(err)
		}
		return &jetstream.RawStreamMsg{Subject: subject, Sequence: seqs[4] + 100, Data: data}
	}
	for _, tc := range []struct {
		name       string
		from       uint64
		last       *jetstream.RawStreamMsg
		firstSeq   int64
		wantSeqs   [2]int64 // first and last event seq read
		incomplete bool
	}{
		{"up to the last record, with records after it", 1, record(2), 0, [2]int64{0, 5}, false},
		{"the whole log", 1, record(4), 0, [2]int64{0, 9}, false},
		{"from a window's start", seqs[1], record(3), -1, [2]int64{2, 7}, false},
		{"a last record the stream does not hold up to", 1, overstated(), 0, [2]int64{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := st.readRecords(ctx, protocol.ScopeRoot, subject, "R", tc.from, tc.last, tc.firstSeq)
			if tc.incomplete {
				if !errors.Is(err, ErrIncompleteRead) {
					t.Fatalf("read %d events, %v; want ErrIncompleteRead", len(evs), err)
				}
				return
			}
			if err != nil || len(evs) == 0 {
				t.Fatalf("read %d events, %v", len(evs), err)
			}
			if got := [2]int64{evs[0].Seq, evs[len(evs)-1].Seq}; got != tc.wantSeqs || int64(len(evs)) != got[1]-got[0]+1 {
				t.Fatalf("read events %d..%d (%d of them), want %d..%d", got[0], got[1], len(evs), tc.wantSeqs[0], tc.wantSeqs[1])
			}
		})
	}
}

// TestABucketsWritesAnswerAsNatsGos: a store bucket's Update and Create
// (its own publish, the key checked without nats.go's regular expression)
// answer as nats.go's KeyValue does on the same bucket, step by step: a
// create, a create of a key that exists, an update at the wrong and at the
// right revision, a create over a deleted key, and invalid keys.
func TestABucketsWritesAnswerAsNatsGos(t *testing.T) {
	_, b, ctx := runsBucket(t, "bucketwrites")
	lib := b.KeyValue
	type outcome struct {
		ok                        bool
		exists, mismatch, invalid bool
	}
	of := func(err error) outcome {
		return outcome{ok: err == nil, exists: errors.Is(err, jetstream.ErrKeyExists),
			mismatch: errors.Is(err, jetstream.ErrKeyRevisionMismatch), invalid: errors.Is(err, jetstream.ErrInvalidKey)}
	}
	steps := []struct {
		name string
		do   func(kv jetstream.KeyValue, key string, rev *uint64) error
	}{
		{"create", func(kv jetstream.KeyValue, key string, rev *uint64) (err error) {
			*rev, err = kv.Create(ctx, key, []byte("a"))
			return err
		}},
		{"create again", func(kv jetstream.KeyValue, key string, _ *uint64) error {
			_, err := kv.Create(ctx, key, []byte("b"))
			return err
		}},
		{"update at a wrong revision", func(kv jetstream.KeyValue, key string, rev *uint64) error {
			_, err := kv.Update(ctx, key, []byte("c"), *rev+100)
			return err
		}},
		{"update at its revision", func(kv jetstream.KeyValue, key string, rev *uint64) (err error) {
			*rev, err = kv.Update(ctx, key, []byte("d"), *rev)
			return err
		}},
		{"delete", func(kv jetstream.KeyValue, key string, _ *uint64) error { return kv.Delete(ctx, key) }},
		{"create over the delete", func(kv jetstream.KeyValue, key string, rev *uint64) (err error) {
			*rev, err = kv.Create(ctx, key, []byte("e"))
			return err
		}},
		{"update of a key never written", func(kv jetstream.KeyValue, key string, _ *uint64) error {
			_, err := kv.Update(ctx, key+".none", []byte("f"), 1)
			return err
		}},
	}
	var ourRev, theirRev uint64
	for _, step := range steps {
		ours, theirs := step.do(b, "K.ours", &ourRev), step.do(lib, "K.theirs", &theirRev)
		if of(ours) != of(theirs) {
			t.Errorf("%s: the bucket answered %v, nats.go %v", step.name, ours, theirs)
		}
	}
	for _, k := range []string{"K.ours", "K.theirs"} {
		e, err := lib.Get(ctx, k)
		if err != nil || string(e.Value()) != "e" {
			t.Fatalf("%s after the steps: %v, %v; want e", k, e, err)
		}
	}
	for _, key := range []string{"", ".a", "a.", "a..b", "a b", "a*", "a>", "é", "a\x00"} {
		_, uerr := b.Update(ctx, key, []byte("x"), 1)
		_, lerr := lib.Update(ctx, key, []byte("x"), 1)
		_, cerr := b.Create(ctx, key, []byte("x"))
		if !errors.Is(uerr, jetstream.ErrInvalidKey) || !errors.Is(lerr, jetstream.ErrInvalidKey) || !errors.Is(cerr, jetstream.ErrInvalidKey) {
			t.Errorf("key %q: bucket update %v, nats.go update %v, bucket create %v; want ErrInvalidKey", key, uerr, lerr, cerr)
		}
	}
}

// TestValidKeyIsNatsGosKeyCheck: validKey accepts exactly the keys nats.go's
// key expression and dot rules accept.
func TestValidKeyIsNatsGosKeyCheck(t *testing.T) {
	re := regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)
	natsGo := func(k string) bool {
		return k != "" && k[0] != '.' && k[len(k)-1] != '.' && !strings.Contains(k, "..") && re.MatchString(k)
	}
	keys := []string{"", ".", "..", "a", "a.b", "a..b", ".a", "a.", "spec.spawn.01ABC", "lease.spawn.01ABC", "slots.P=1/x-y_z",
		"a b", "a*", "a>", "a\tb", "é", "a\x00", "A-Z/0_9=.x", "-", "/", "_", "="}
	for c := 0; c < 256; c++ {
		keys = append(keys, string(rune(c)), "a"+string([]byte{byte(c)})+"b")
	}
	for _, k := range keys {
		if validKey(k) != natsGo(k) {
			t.Errorf("validKey(%q) = %v; nats.go says %v", k, validKey(k), natsGo(k))
		}
	}
}
