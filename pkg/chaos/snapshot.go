package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/pkg/protocol"
)

// Snapshot is Brood's durable state as the checker reads it once the faults
// healed: every session header and log, every lifecycle event, every run
// record (settled ones are kept 24 hours), the agent records, the request
// records, the budget ledgers and the items still pending in each inbox.
type Snapshot struct {
	TakenAt   int64                             `json:"takenAt"`
	Headers   map[string]protocol.SessionHeader `json:"headers"`
	Logs      map[string][]Event                `json:"logs"`
	Lifecycle []protocol.LifecycleEvent         `json:"lifecycle"`
	Runs      map[string]protocol.RunRecord     `json:"runs"`
	Agents    map[string]protocol.AgentRecord   `json:"agents"`
	// Keys of brood_agents that are not leases nor requests (owns.*, drain.*, grant.*).
	OtherKeys []string                `json:"otherKeys,omitempty"`
	Inbox     map[string][]InboxEntry `json:"inbox"`
	// Requests are the request records (brood_agents request.<id>, kept a
	// day after their last write), by request id.
	Requests map[string]protocol.RequestRecord `json:"requests,omitempty"`
	// Budgets are the budget ledgers (brood_agents budget.<sessionId>,
	// written only by coordinators), by the id of the session that named
	// the budget (I11). Nil in histories recorded before budgets were in
	// the workload.
	Budgets map[string]protocol.BudgetRecord `json:"budgets,omitempty"`
}

// Event is one session event with its data kept as MessagePack.
type Event struct {
	Seq  int64  `json:"seq"`
	Type string `json:"type"`
	Time int64  `json:"time"`
	Data []byte `json:"data,omitempty"`
}

// Decode decodes the event's data into v.
func (e Event) Decode(v any) error { return protocol.Unmarshal(protocol.Msgpack, e.Data, v) }

func (e Event) session() protocol.SessionEvent {
	return protocol.SessionEvent{Seq: e.Seq, Type: e.Type, Time: e.Time, Data: e.Data}
}

// InboxEntry is one pending inbox item.
type InboxEntry struct {
	Seq       uint64                 `json:"seq"`
	MessageID string                 `json:"messageId"`
	Text      string                 `json:"text"`
	Source    protocol.MessageSource `json:"source"`
	Delivery  string                 `json:"delivery"`
}

// SnapshotReadTimeout bounds reading the whole durable state.
const SnapshotReadTimeout = 5 * time.Minute

// TakeSnapshot reads the durable state of the deployment whose subjects are
// subj (protocol.MustSubjects(prefix)) through nc, a connection of the
// harness's own that may read every stream and bucket, each stream in one
// pass of an ordered consumer
// that must reach the stream's last sequence as it was when the pass began.
// It gives up after SnapshotReadTimeout; an error of JetStream's (an
// election) is worth another try.
func TakeSnapshot(ctx context.Context, nc *nats.Conn, subj protocol.Subjects) (*Snapshot, error) {
	st, err := store.Bind(ctx, nc, subj)
	if err != nil {
		return nil, fmt.Errorf("snapshot: bind the streams and buckets: %w", err)
	}
	return takeSnapshot(ctx, st)
}

// takeSnapshot is TakeSnapshot through a store already bound.
func takeSnapshot(ctx context.Context, st *store.Store) (*Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, SnapshotReadTimeout)
	defer cancel()
	s := &Snapshot{
		TakenAt: time.Now().UnixMilli(),
		Headers: map[string]protocol.SessionHeader{}, Logs: map[string][]Event{},
		Runs: map[string]protocol.RunRecord{}, Agents: map[string]protocol.AgentRecord{}, Inbox: map[string][]InboxEntry{},
		Requests: map[string]protocol.RequestRecord{}, Budgets: map[string]protocol.BudgetRecord{},
	}
	sessPrefix := st.Subj.Session("")
	if err := readStream(ctx, st.Sessions, func(m jetstream.Msg) error {
		if !strings.HasPrefix(m.Subject(), sessPrefix) {
			return nil // the child index
		}
		var h protocol.SessionHeader
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &h); err != nil {
			return fmt.Errorf("header %s: %w", m.Subject(), err)
		}
		s.Headers[h.ID] = h
		return nil
	}); err != nil {
		return nil, err
	}
	logs, err := st.LogStreams(ctx)
	if err != nil {
		return nil, err
	}
	inboxes, err := st.InboxStreams(ctx)
	if err != nil {
		return nil, err
	}
	if err := readStreams(ctx, logs, func(m jetstream.Msg) error {
		id := protocol.SessionIDFromSubject(m.Subject())
		var rec protocol.LogRecord
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &rec); err != nil {
			return fmt.Errorf("log record %s: %w", m.Subject(), err)
		}
		for _, ev := range rec.Events {
			s.Logs[id] = append(s.Logs[id], Event{Seq: ev.Seq, Type: ev.Type, Time: ev.Time, Data: ev.Data})
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := readStream(ctx, st.Events, func(m jetstream.Msg) error {
		var ev protocol.LifecycleEvent
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &ev); err != nil {
			return fmt.Errorf("lifecycle event: %w", err)
		}
		s.Lifecycle = append(s.Lifecycle, ev)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := readStreams(ctx, inboxes, func(m jetstream.Msg) error {
		var it store.InboxItem
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &it); err != nil {
			return fmt.Errorf("inbox item: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		id := protocol.SessionIDFromSubject(m.Subject())
		s.Inbox[id] = append(s.Inbox[id], InboxEntry{
			Seq: md.Sequence.Stream, MessageID: it.MessageID, Text: protocol.AllText(it.Content), Source: it.Source, Delivery: it.Delivery,
		})
		return nil
	}); err != nil {
		return nil, err
	}
	// A run is its spec joined with its state under the spec's provider
	// (store.JoinRun); the two are created at once (store.CreateRun), so
	// the watch delivers them in either order: they are joined once both
	// were read.
	specs := map[string]protocol.RunRecord{}
	type stateOf struct {
		provider string
		rec      protocol.RunRecord
	}
	var states []stateOf
	if err := st.EachRunsKey(ctx, func(key string, v []byte) error {
		var r protocol.RunRecord
		if err := protocol.Unmarshal(protocol.Msgpack, v, &r); err != nil {
			return fmt.Errorf("run %s: %w", key, err)
		}
		switch kind, provider, id := store.RunsKindOf(key); kind {
		case store.RunsSpec:
			specs[id] = r
		case store.RunsState:
			r.RunID = id
			states = append(states, stateOf{provider, r})
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for _, x := range states {
		if spec, ok := specs[x.rec.RunID]; ok && spec.Provider == x.provider {
			s.Runs[x.rec.RunID] = store.JoinRun(spec, x.rec)
		}
	}
	if err := st.EachAgentsKey(ctx, func(key string, v []byte) error {
		if id, ok := strings.CutPrefix(key, store.RequestKey("")); ok {
			var r protocol.RequestRecord
			if err := protocol.Unmarshal(protocol.Msgpack, v, &r); err != nil {
				return fmt.Errorf("request %s: %w", id, err)
			}
			s.Requests[id] = r
			return nil
		}
		kind, id := store.KindOf(key)
		if kind == store.KindBudget {
			var b protocol.BudgetRecord
			if err := protocol.Unmarshal(protocol.Msgpack, v, &b); err != nil {
				return fmt.Errorf("budget %s: %w", id, err)
			}
			s.Budgets[id] = b
			return nil
		}
		if kind != store.KindLease && kind != store.KindRootLease {
			s.OtherKeys = append(s.OtherKeys, key)
			return nil
		}
		var a protocol.AgentRecord
		if err := protocol.Unmarshal(protocol.Msgpack, v, &a); err != nil {
			return fmt.Errorf("agent %s: %w", key, err)
		}
		s.Agents[id] = a
		return nil
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// readStream passes every message of str, in order, to f, and fails unless
// the pass reached the last sequence the stream had when it began.
// readStreams reads every message of each of strs (readStream).
func readStreams(ctx context.Context, strs []jetstream.Stream, f func(jetstream.Msg) error) error {
	for _, str := range strs {
		if err := readStream(ctx, str, f); err != nil {
			return err
		}
	}
	return nil
}

func readStream(ctx context.Context, str jetstream.Stream, f func(jetstream.Msg) error) error {
	info, err := str.Info(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: stream info: %w", err)
	}
	name := info.Config.Name
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("snapshot: %s: %w", name, err)
	}
	var seq uint64 // the last message's stream sequence
	for {
		n, done, err := readBatch(ctx, cons, name, last, &seq, f)
		if err != nil || done {
			return err
		}
		if n == 0 {
			if ctx.Err() != nil {
				return fmt.Errorf("snapshot: %s stopped at %d of %d: %w", name, seq, last, ctx.Err())
			}
			// Nothing came: done if nothing is pending for the consumer (the
			// messages up to last may have been deleted meanwhile, as
			// claimed inbox items are).
			ci, err := cons.Info(ctx)
			if err != nil {
				return fmt.Errorf("snapshot: %s: %w", name, err)
			}
			if ci.NumPending == 0 {
				return nil
			}
		}
	}
}

// fetchWait bounds one fetch of readStream.
const fetchWait = 5 * time.Second

// readBatch fetches one batch (up to 1,000 messages, fetchWait) and passes
// its messages to f; done once it passed the message at sequence last. The
// fetch ends when readBatch returns (its context is cancelled), so no fetch
// outlives the read.
func readBatch(ctx context.Context, cons jetstream.Consumer, name string, last uint64, seq *uint64, f func(jetstream.Msg) error) (n int, done bool, err error) {
	fctx, cancel := context.WithTimeout(ctx, fetchWait)
	defer cancel()
	batch, err := cons.Fetch(1000, jetstream.FetchContext(fctx))
	if err != nil {
		return 0, false, fmt.Errorf("snapshot: %s: %w", name, err)
	}
	for m := range batch.Messages() {
		n++
		md, err := m.Metadata()
		if err != nil {
			return n, false, err
		}
		*seq = md.Sequence.Stream
		if err := f(m); err != nil {
			return n, false, fmt.Errorf("snapshot: %s@%d: %w", name, *seq, err)
		}
		if *seq >= last {
			return n, true, nil
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return n, false, fmt.Errorf("snapshot: %s: %w", name, err)
	}
	return n, false, nil
}
