package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// slotsOf reads a parent's slot record (brood_agents `slots.<parent>`); a
// missing record holds no slot.
func slotsOf(t *testing.T, s *stack.Stack, parent string) []string {
	t.Helper()
	rec, err := store.Get[coordinator.ChildSlotsRecord](context.Background(), s.Store.Agents, store.SlotsKey(parent))
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read the slot record of %s: %v", parent, err)
	}
	var ids []string
	for _, sl := range rec.Value.Slots {
		ids = append(ids, sl.ChildID)
	}
	return ids
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestASlotCountsForAStartsBudgetAndTwoHostExpiries: a slot whose child has
// no lease yet (its start is still on the way to a provider) counts against
// the parent's limit for slotGrace, a start's whole budget (RequestBudget)
// and two host expiries, and no longer (slots.go; docs/design.md §4, agent
// limits).
func TestASlotCountsForAStartsBudgetAndTwoHostExpiries(t *testing.T) {
	const budget, expiry = 20 * time.Second, 10 * time.Second
	const grace = budget + 2*expiry
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) {
		c.LiveChildrenMax, c.RequestBudget, c.HostExpiry = 1, budget, expiry
		c.StartQueueMax = -1 // refused at the limit, not queued
	})
	s.AddSpawnWorker()
	for _, tc := range []struct {
		name    string
		age     time.Duration // how long ago the slot was taken
		refused bool
	}{
		{"within its grace", grace - 8*time.Second, true},
		{"past its grace", grace + 8*time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := s.Root()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			inFlight := coordinator.ChildSlotsRecord{Slots: []coordinator.ChildSlot{{
				ChildID: "in-flight-" + root.SessionID, ReservedAt: store.NowMs() - tc.age.Milliseconds()}}}
			if _, err := store.Create(ctx, s.Store.Agents, store.SlotsKey(root.SessionID), inFlight); err != nil {
				t.Fatal(err)
			}
			run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
			switch {
			case tc.refused && protocol.CodeOf(err) != protocol.CodeLimitExceeded:
				t.Fatalf("a start beside a slot taken %v ago (grace %v): %v, want LIMIT_EXCEEDED", tc.age, grace, err)
			case !tc.refused && err != nil:
				t.Fatalf("a start beside a slot taken %v ago (grace %v) was refused: %v", tc.age, grace, err)
			case !tc.refused:
				if _, err := run.Result(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestALiveChildCountsWithoutItsSlot: a child with a live lease counts
// against its parent's limit whether or not the parent's slot record holds
// its slot (the record was rewritten without it: the lease is the
// evidence), beside the slots of starts still on their way (slots.go,
// countSlots; RELIABILITY.md I8).
func TestALiveChildCountsWithoutItsSlot(t *testing.T) {
	const limit = 3
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LiveChildrenMax, c.StartQueueMax = limit, -1 }) // refused at the limit, not queued
	s.AddSpawnWorker()
	root := s.Root()
	auth := protocol.Authority{Parent: ptr(root.Ref())}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := func(label, prompt string) (string, error) {
		r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: label, Prompt: protocol.Text(prompt)})
		return r.ChildID, err
	}
	var busy []string
	for _, label := range []string{"a", "b"} {
		id, err := start(label, "sleep 120s\nsay late")
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		busy = append(busy, id)
	}
	for _, id := range busy {
		testutil.Eventually(t, 60*time.Second, func() bool {
			st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
			return err == nil && st.State == protocol.StateRunning
		}, "%s runs", id)
	}
	// The record loses a's slot and gains one of a start on its way (another
	// replica took it; its child has no lease yet).
	key := store.SlotsKey(root.SessionID)
	cur, err := store.Get[coordinator.ChildSlotsRecord](ctx, s.Store.Agents, key)
	if err != nil {
		t.Fatal(err)
	}
	rec := coordinator.ChildSlotsRecord{Slots: []coordinator.ChildSlot{{ChildID: "on-its-way", ReservedAt: store.NowMs()}}}
	for _, sl := range cur.Value.Slots {
		if sl.ChildID != busy[0] {
			rec.Slots = append(rec.Slots, sl)
		}
	}
	if _, err := store.Update(ctx, s.Store.Agents, key, rec, cur.Revision); err != nil {
		t.Fatal(err)
	}
	if ids := slotsOf(t, s, root.SessionID); len(ids) != 2 || contains(ids, busy[0]) || !contains(ids, busy[1]) {
		t.Fatalf("slots %v: want b's and the start's on its way", ids)
	}
	// a and b are live and one start is on its way: the limit is reached.
	d, err := start("d", "say x")
	if protocol.CodeOf(err) != protocol.CodeLimitExceeded {
		t.Fatalf("a fourth child (%s) beside a live child without a slot, a live one with a slot and a start on its way: %v, want LIMIT_EXCEEDED", d, err)
	}
}

// TestAdmissionGivesUpWhenItsSlotRecordKeepsChanging: an admission tries
// its compare-and-set of the parent's slot record at most slotrecord.AttemptsMax
// times; when another writer changes the record before each attempt, the
// start is refused UNAVAILABLE (retry later), after exactly that many
// attempts, and nothing is started.
func TestAdmissionGivesUpWhenItsSlotRecordKeepsChanging(t *testing.T) {
	s := stack.New(t)
	var parentKey atomic.Value
	parentKey.Store("")
	var attempts atomic.Int64
	s.AddCoordinator(func(c *coordinator.Config) {
		c.Store = c.Store.WithFaults(store.Faults{Before: func(ctx context.Context, w store.Write) error {
			if (w.Op == store.OpKVCreate || w.Op == store.OpKVUpdate) && w.Key == parentKey.Load().(string) {
				attempts.Add(1)
				// Another replica's admission lands first.
				if _, err := store.Put(ctx, s.Store.Agents, w.Key, coordinator.ChildSlotsRecord{}); err != nil {
					return err
				}
			}
			return nil
		}})
	})
	s.AddSpawnWorker()
	root := s.Root()
	parentKey.Store(store.SlotsKey(root.SessionID))
	headers := s.SessionCount()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say x")})
	if protocol.CodeOf(err) != protocol.CodeUnavailable || !strings.Contains(err.Error(), "kept changing") {
		t.Fatalf("a start whose slot record changes before each write: %v, want UNAVAILABLE (kept changing)", err)
	}
	if got := attempts.Load(); got != coordinator.SlotAttemptsMax {
		t.Fatalf("%d compare-and-set attempts, want slotrecord.AttemptsMax (%d)", got, coordinator.SlotAttemptsMax)
	}
	if got := s.SessionCount(); got != headers {
		t.Fatalf("a refused start wrote %d session headers", got-headers)
	}
}

// TestAStaleSlotRevisionDoesNotWait: a parent's admissions alternate
// between replicas (the coordinators' queue group), so the slot revision a
// replica remembers from its own last write is usually stale. Its
// compare-and-set conflict reads the record again and writes at once; only
// a conflict on a revision just read (two admissions of the parent at the
// same time) waits the random backoff. Before, every such admission waited
// up to 20 ms (make bench-scale: one-shot p50 1.2 ms with one coordinator,
// 3.8 ms with two, 9.8 ms with four), and the slots stay exact either way.
func TestAStaleSlotRevisionDoesNotWait(t *testing.T) {
	s := stack.New(t)
	a, b := s.AddCoordinator(), s.AddCoordinator()
	var waits atomic.Int64
	a.CountSlotBackoffs(&waits)
	b.CountSlotBackoffs(&waits)
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, c := range []*coordinator.Coordinator{a, b, a, b, a} {
		if err := c.ReserveChild(ctx, root.SessionID, fmt.Sprintf("child-%d", i)); err != nil {
			t.Fatalf("reservation %d: %v", i, err)
		}
	}
	if n := waits.Load(); n != 0 {
		t.Errorf("%d backoffs for stale revisions; want none", n)
	}
	got := slotsOf(t, s, root.SessionID)
	for i := 0; i < 5; i++ {
		if !contains(got, fmt.Sprintf("child-%d", i)) {
			t.Errorf("slots %v lack child-%d", got, i)
		}
	}
	if len(got) != 5 {
		t.Errorf("slots %v, want the five children once each", got)
	}
}

// TestAColdResumeKeepsTheOtherSlots: a cold resume replaces its child's own
// slot with one naming the resumed run and leaves every other slot of the
// parent in place (a start still on its way keeps counting): the record
// holds each child once, and the next start sees the limit reached.
func TestAColdResumeKeepsTheOtherSlots(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LiveChildrenMax, c.StartQueueMax = 2, -1 }) // refused at the limit, not queued
	s.AddSpawnWorker()
	root := s.Root()
	auth := protocol.Authority{Parent: ptr(root.Ref())}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := func(prompt string) (string, error) {
		r, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "cold", Prompt: protocol.Text(prompt)})
		return r.ChildID, err
	}
	stateOf := func(id string) string {
		st, err := s.Client.State(ctx, protocol.ChildRef{ChildID: id, Authority: auth})
		if err != nil {
			t.Fatalf("state of %s: %v", id, err)
		}
		return st.State
	}
	a, err := start("say hi")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return stateOf(a) == protocol.StateNone }, "a goes cold")
	// Another replica admitted a start that is on its way.
	key := store.SlotsKey(root.SessionID)
	cur, err := store.Get[coordinator.ChildSlotsRecord](ctx, s.Store.Agents, key)
	if err != nil {
		t.Fatal(err)
	}
	rec := cur.Value
	rec.Slots = append(rec.Slots, coordinator.ChildSlot{ChildID: "on-its-way", ReservedAt: store.NowMs()})
	if _, err := store.Update(ctx, s.Store.Agents, key, rec, cur.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: a, Authority: auth, Message: protocol.Text("sleep 120s\nsay again")}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return stateOf(a) == protocol.StateRunning }, "a is resumed")
	ids := slotsOf(t, s, root.SessionID)
	if len(ids) != 2 || !contains(ids, a) || !contains(ids, "on-its-way") {
		t.Fatalf("slots after a's cold resume: %v; want a's (once) and the start's on its way", ids)
	}
	if d, err := start("say x"); protocol.CodeOf(err) != protocol.CodeLimitExceeded {
		t.Fatalf("a third child (%s) beside the resumed one and a start on its way: %v, want LIMIT_EXCEEDED", d, err)
	}
}

// TestASlotPastItsGraceCountsWhileItsChildHoldsALease: a slot past its grace
// whose child this replica's cache does not show live (here its lease is
// marked ending; a restarting watch loses leases the same way) still
// counts while the bucket holds the child's lease (for a cold resume's
// slot: the lease of the run it names): admission rests on the bucket, not
// on the cache alone (slots.go, confirmLive).
func TestASlotPastItsGraceCountsWhileItsChildHoldsALease(t *testing.T) {
	const budget, expiry = 20 * time.Second, 10 * time.Second
	const grace = budget + 2*expiry
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) {
		c.LiveChildrenMax, c.RequestBudget, c.HostExpiry = 1, budget, expiry
		c.StartQueueMax = -1 // refused at the limit, not queued
	})
	w, _ := s.AddSpawnWorker()
	for _, tc := range []struct {
		name              string
		slotRun, leaseRun string // the run the slot names (a cold resume's), the run of the child's lease
		counts            bool
	}{
		{"an admission's slot", "", "", true},
		{"a resume's slot, its run's lease", "epoch-2", "epoch-2", true},
		{"a resume's slot, another run's lease", "epoch-2", "epoch-3", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := s.Root()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			child := "held-" + root.SessionID
			if err := s.Store.PutHeader(ctx, protocol.SessionHeader{Version: protocol.SessionHeaderVersion, ID: child, CreatedAt: store.NowMs(),
				ParentSession: root.SessionID, Origin: protocol.OriginSubagent, DelegationDepth: 1, Provider: "spawn"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: child, Kind: protocol.AgentContinuable, HostID: w.ID(), Epoch: 1,
				RunID: tc.leaseRun, Provider: "spawn", CredentialHash: protocol.HashCredential(protocol.NewCredential()), ParentSession: root.SessionID,
				Ancestry: []string{root.SessionID}, Ending: true, CreatedAt: store.NowMs()}); err != nil {
				t.Fatal(err)
			}
			old := coordinator.ChildSlotsRecord{Slots: []coordinator.ChildSlot{{ChildID: child, RunID: tc.slotRun, ReservedAt: store.NowMs() - (grace + 8*time.Second).Milliseconds()}}}
			if _, err := store.Create(ctx, s.Store.Agents, store.SlotsKey(root.SessionID), old); err != nil {
				t.Fatal(err)
			}
			r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
			switch {
			case tc.counts && protocol.CodeOf(err) != protocol.CodeLimitExceeded:
				t.Fatalf("a start beside a slot past its grace whose child still holds its lease: %v, want LIMIT_EXCEEDED", err)
			case !tc.counts && err != nil:
				t.Fatalf("a start beside a slot past its grace whose run's lease is gone: %v", err)
			case !tc.counts:
				if _, err := r.Result(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestAColdResumesSlotIsFreedOnceItsRunSettled: the slot a cold resume took
// names the resumed epoch's run; once that run is settled the slot is free,
// even while this replica never saw the child's lease come and go (another
// replica resumed it) and the slot is within its grace.
func TestAColdResumesSlotIsFreedOnceItsRunSettled(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LiveChildrenMax = 1 })
	s.AddSpawnWorker()
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const child, run = "resumed-elsewhere", "resumed-elsewhere-epoch-2"
	now := store.NowMs()
	epoch := protocol.RunRecord{RunID: run, ChildID: child, ParentSession: root.SessionID, Provider: "spawn",
		Mode: protocol.ModeContinuable, State: protocol.RunRunning, CreatedAt: now}
	rev, err := s.Store.CreateRun(ctx, epoch)
	if err != nil {
		t.Fatal(err)
	}
	epoch.State, epoch.SettledAt, epoch.SettledBy = protocol.RunSettled, now, "elsewhere"
	epoch.Result = &protocol.SubagentResult{Output: protocol.Text("done"), StopReason: protocol.StopCompleted}
	if ok, err := s.Store.SettleRun(ctx, epoch, rev); !ok || err != nil {
		t.Fatalf("settle the resumed epoch: %v %v", ok, err)
	}
	rec := coordinator.ChildSlotsRecord{Slots: []coordinator.ChildSlot{{ChildID: child, ReservedAt: now, RunID: run}}}
	if _, err := store.Create(ctx, s.Store.Agents, store.SlotsKey(root.SessionID), rec); err != nil {
		t.Fatal(err)
	}
	r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	if err != nil {
		t.Fatalf("a start beside the slot of a resume whose run settled: %v", err)
	}
	if _, err := r.Result(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAOneShotRunIsCreatedWhenItsSlotIsTaken: a one-shot run's record and
// its child's header are created at its admission, once its live-children
// slot is taken (the slot record's compare-and-set), never before: the
// children whose end let it in were read ended before that write was sent,
// so they settled before the run's createdAt, and the records never show
// them live at its admission (RELIABILITY.md I8; chaos seeds 2 and 3 of
// issue 9: createdAt stamped 28 ms and 1.07 s before the slot write, while
// the start waited for the parent's slot lock and read the counted children
// from the leader, and children settled in between were counted live at the
// admission). The start's slot write is held until the clock has passed
// the time it was sent.
func TestAOneShotRunIsCreatedWhenItsSlotIsTaken(t *testing.T) {
	s := stack.New(t)
	var slotsKey atomic.Value
	slotsKey.Store("")
	var sentAt, admittedAt atomic.Int64 // ms: the start's slot write sent, and let go
	s.AddCoordinator(func(c *coordinator.Config) {
		c.Store = c.Store.WithFaults(store.Faults{Before: func(ctx context.Context, w store.Write) error {
			if (w.Op != store.OpKVCreate && w.Op != store.OpKVUpdate) || w.Key != slotsKey.Load().(string) || !sentAt.CompareAndSwap(0, store.NowMs()) {
				return nil
			}
			for store.NowMs() <= sentAt.Load() { // hold the write until the clock passes its sending
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
			admittedAt.Store(store.NowMs())
			return nil
		}})
	})
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	slotsKey.Store(store.SlotsKey(root.SessionID))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("say ok")})
	if err != nil {
		t.Fatal(err)
	}
	admitted := admittedAt.Load()
	if admitted == 0 {
		t.Fatal("the start wrote no slot of its parent")
	}
	run, err := s.Store.RunLatest(ctx, r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Value.CreatedAt < admitted {
		t.Errorf("the run's createdAt %d is %d ms before its slot write was let go (%d; sent at %d); want it at or after the admission",
			run.Value.CreatedAt, admitted-run.Value.CreatedAt, admitted, sentAt.Load())
	}
	h, err := s.Store.GetHeader(ctx, r.ChildID)
	if err != nil {
		t.Fatal(err)
	}
	if h.CreatedAt < admitted {
		t.Errorf("the child's header createdAt %d is %d ms before its slot write was let go (%d); want it at or after the admission",
			h.CreatedAt, admitted-h.CreatedAt, admitted)
	}
	if _, err := r.Result(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStartInputsAtTheirLimits: runs.start takes a prompt, a label and a
// notify subject of exactly their bound and refuses one byte more (the
// prompt LIMIT_EXCEEDED, Config.PromptBytesMax; the label and the notify
// subject INVALID_ARGUMENT, protocol.LabelBytesMax and
// NotifySubjectBytesMax); a prompt with no text, or a block that is not
// text, is INVALID_ARGUMENT; a notify subject is printable ASCII from '!'
// to '~' (no space, no DEL).
func TestStartInputsAtTheirLimits(t *testing.T) {
	const promptMax = 64
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.PromptBytesMax = promptMax })
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	say := func(n int) []protocol.ContentBlock { return protocol.Text("say " + strings.Repeat("x", n-len("say "))) }
	notify := func(n int) string { return "test.notify." + strings.Repeat("n", n-len("test.notify.")) }
	tests := []struct {
		name   string
		prompt []protocol.ContentBlock
		label  string
		notify string
		want   protocol.Code
	}{
		{"a prompt of the bound", say(promptMax), "", "", ""},
		{"a prompt one byte over", say(promptMax + 1), "", "", protocol.CodeLimitExceeded},
		{"no prompt", nil, "", "", protocol.CodeInvalidArgument},
		{"a prompt of one empty text", protocol.Text(""), "", "", protocol.CodeInvalidArgument},
		{"a prompt block that is not text", []protocol.ContentBlock{{Type: "image"}}, "", "", protocol.CodeInvalidArgument},
		{"a label of the bound", say(8), strings.Repeat("l", protocol.LabelBytesMax), "", ""},
		{"a label one byte over", say(8), strings.Repeat("l", protocol.LabelBytesMax+1), "", protocol.CodeInvalidArgument},
		{"a notify subject of the bound", say(8), "", notify(protocol.NotifySubjectBytesMax), ""},
		{"a notify subject one byte over", say(8), "", notify(protocol.NotifySubjectBytesMax + 1), protocol.CodeInvalidArgument},
		{"a notify subject with ! and ~", say(8), "", "test.notify.!~", ""},
		{"a notify subject with a space", say(8), "", "test.notify.a b", protocol.CodeInvalidArgument},
		{"a notify subject with DEL", say(8), "", "test.notify.a\x7f", protocol.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The request as sent (client.StartRun puts its own subject in notify).
			var reply protocol.RunStartReply
			err := s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: tt.prompt,
				Notify: tt.notify, Options: protocol.StartOptions{Label: tt.label}}, &reply)
			if protocol.CodeOf(err) != tt.want {
				t.Fatalf("runs.start: %v, want %q", err, tt.want)
			}
		})
	}
}

// TestTextThatIsNotUTF8IsRefusedOnEveryDoor: a prompt, a followup message
// and a report must be UTF-8 text (one check, checkPrompt); raw bytes (a
// msgpack client can send any) are INVALID_ARGUMENT on runs.start,
// continuable.start and continuable.followup, while the same text in
// valid UTF-8 (several-byte characters, an encoded U+FFFD) is accepted
// (issue 37, item 4).
func TestTextThatIsNotUTF8IsRefusedOnEveryDoor(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.WaitProvider("spawn")
	root := s.Root()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	idle, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "idle", Prompt: protocol.Text("say hi")})
	if err != nil {
		t.Fatal(err)
	}
	doors := []struct {
		name string
		send func(text string) error
	}{
		{"runs.start", func(text string) error {
			var reply protocol.RunStartReply
			return s.Client.Call(ctx, protocol.EpRunsStart, protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text(text)}, &reply)
		}},
		{"continuable.start", func(text string) error {
			_, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "utf8", Prompt: protocol.Text(text)})
			return err
		}},
		{"continuable.followup", func(text string) error {
			_, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: idle.ChildID, Authority: root.Authority(), Message: protocol.Text(text)})
			return err
		}},
	}
	texts := []struct {
		name string
		text string
		want protocol.Code
	}{
		{"a lone 0xff byte", "say a\xffb", protocol.CodeInvalidArgument},
		{"a cut three-byte character", "say \xe2\x82", protocol.CodeInvalidArgument},
		{"an encoded surrogate", "say \xed\xa0\x80", protocol.CodeInvalidArgument},
		{"several-byte characters and U+FFFD", "say é€😀\uFFFD", ""},
	}
	for _, d := range doors {
		for _, tt := range texts {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				if err := d.send(tt.text); protocol.CodeOf(err) != tt.want {
					t.Fatalf("%s: %v, want %q", d.name, err, tt.want)
				}
			})
		}
	}
}
