package coordinator_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
)

// readStack is a stack with a root whose child delegated once more: root →
// child (one-shot) → grandchild (one-shot), all settled.
type readStack struct {
	s                   *stack.Stack
	root, other         *client.Root
	child, grandchild   string
	grant               protocol.Authority
	rootAuth, otherAuth protocol.Authority
}

func newReadStack(t *testing.T) *readStack {
	t.Helper()
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	r := &readStack{s: s, root: s.Root(), other: s.Root(), grant: s.Grant()}
	r.rootAuth, r.otherAuth = r.root.Authority(), r.other.Authority()
	run, res, err := s.Run(r.root.Ref(), "spawn", "call subagent {\"description\":\"deeper\",\"prompt\":\"say deep\"}\nsay done", protocol.StartOptions{})
	if err != nil || res.StopReason != protocol.StopCompleted {
		t.Fatalf("run: %v %+v", err, res)
	}
	r.child = run.ChildID
	_, evs := s.Log(r.child)
	for _, ev := range evs {
		var d protocol.ToolResultData
		if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil {
			r.grandchild = d.Meta["childId"]
		}
	}
	if r.grandchild == "" {
		t.Fatalf("the child started no grandchild: %v", evs)
	}
	return r
}

func TestReadAuthority(t *testing.T) {
	r := newReadStack(t)
	ctx := context.Background()
	forged := r.root.Ref()
	forged.Credential = "forged"
	tests := []struct {
		name string
		id   string
		auth protocol.Authority
		want protocol.Code
	}{
		{"a grant reads any session", r.child, r.grant, ""},
		{"a root reads itself", r.root.SessionID, r.rootAuth, ""},
		{"a root reads its child", r.child, r.rootAuth, ""},
		{"a root reads its grandchild", r.grandchild, r.rootAuth, ""},
		{"another root does not read the child", r.child, r.otherAuth, protocol.CodeUnauthorized},
		{"another root does not read the root", r.root.SessionID, r.otherAuth, protocol.CodeUnauthorized},
		{"an unknown session is outside every subtree", "NOSUCHSESSION", r.rootAuth, protocol.CodeUnauthorized},
		{"a grant learns that a session does not exist", "NOSUCHSESSION", r.grant, protocol.CodeNotFound},
		{"a forged credential reads nothing", r.child, protocol.Authority{Parent: &forged}, protocol.CodeUnauthorized},
		{"no authority reads nothing", r.child, protocol.Authority{}, protocol.CodeUnauthorized},
		{"a bad id", "not/an id", r.grant, protocol.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := r.s.Client.Header(ctx, protocol.SessionGetRequest{SessionID: tt.id, Authority: tt.auth})
			if protocol.CodeOf(err) != tt.want {
				t.Fatalf("sessions.get: err = %v, want %q", err, tt.want)
			}
			if tt.want == "" && h.ID != tt.id {
				t.Fatalf("header %+v, want session %s", h, tt.id)
			}
			_, err = r.s.Client.LogPage(ctx, protocol.LogReadRequest{SessionID: tt.id, Authority: tt.auth})
			if protocol.CodeOf(err) != tt.want {
				t.Fatalf("sessions.log: err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestLogPagesAddUpToTheLog(t *testing.T) {
	r := newReadStack(t)
	ctx := context.Background()
	whole, err := r.s.Store.ReadLog(ctx, "spawn", r.child)
	if err != nil || len(whole.Events) < 8 {
		t.Fatalf("log of the child: %d events, %v", len(whole.Events), err)
	}
	for _, size := range []int{1, 2, 3, 1000} {
		var got []protocol.SessionEvent
		req := protocol.LogReadRequest{SessionID: r.child, Authority: r.rootAuth, EventsMax: size}
		for pages := 0; ; pages++ {
			if pages > len(whole.Events)+1 {
				t.Fatalf("size %d: more pages than events", size)
			}
			p, err := r.s.Client.LogPage(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Events) > size {
				t.Fatalf("size %d: page of %d events", size, len(p.Events))
			}
			got = append(got, p.Events...)
			if p.Complete {
				break
			}
			req.FromSeq, req.Cursor = p.NextSeq, p.Cursor
		}
		if !reflect.DeepEqual(got, whole.Events) {
			t.Fatalf("size %d: pages give %d events, the log has %d", size, len(got), len(whole.Events))
		}
	}
	// A wrong cursor is detected: the page still starts at fromSeq.
	for _, cursor := range []protocol.Seq{1 << 40, 3, protocol.Seq(whole.LastSubjSeq)} {
		p, err := r.s.Client.LogPage(ctx, protocol.LogReadRequest{SessionID: r.child, Authority: r.grant, FromSeq: 2, Cursor: cursor, EventsMax: 2})
		if err != nil || len(p.Events) != 2 || p.Events[0].Seq != 2 || p.Events[1].Seq != 3 {
			t.Fatalf("cursor %d: %+v, %v", cursor, p, err)
		}
	}
	// Past the end: an empty, complete page.
	p, err := r.s.Client.LogPage(ctx, protocol.LogReadRequest{SessionID: r.child, Authority: r.grant, FromSeq: int64(len(whole.Events))})
	if err != nil || len(p.Events) != 0 || !p.Complete || p.NextSeq != int64(len(whole.Events)) {
		t.Fatalf("page past the end: %+v, %v", p, err)
	}
	if _, err := r.s.Client.LogPage(ctx, protocol.LogReadRequest{SessionID: r.child, Authority: r.grant, FromSeq: -1}); protocol.CodeOf(err) != protocol.CodeInvalidArgument {
		t.Fatalf("negative fromSeq: %v", err)
	}
}

func TestLogLongPollWakesOnANewEvent(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	ctx := context.Background()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "tail", Prompt: protocol.Text("say one")})
	if err != nil {
		t.Fatal(err)
	}
	var from int64
	testutil.Eventually(t, 20*time.Second, func() bool {
		_, evs := s.Log(start.ChildID)
		from = int64(len(evs))
		return from > 0 && evs[from-1].Type == protocol.EvTurnEnd
	}, "the first turn ended")
	type result struct {
		p   protocol.LogPage
		err error
		at  time.Duration
	}
	done := make(chan result, 1)
	began := time.Now()
	go func() {
		p, err := s.Client.LogPage(ctx, protocol.LogReadRequest{SessionID: start.ChildID, Authority: root.Authority(), FromSeq: from, WaitMs: 30_000})
		done <- result{p, err, time.Since(began)}
	}()
	time.Sleep(200 * time.Millisecond) // let the poll wait first (it must also work if it did not)
	if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: root.Authority(), Message: protocol.Text("say two")}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || len(r.p.Events) == 0 || r.p.Events[0].Seq != from {
			t.Fatalf("long poll: %+v, %v", r.p, r.err)
		}
		if r.at > 20*time.Second {
			t.Fatalf("the long poll answered after %s, not when the event arrived", r.at)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the long poll never answered")
	}
}

func TestEventsReadScopesAndPages(t *testing.T) {
	r := newReadStack(t)
	ctx := context.Background()
	read := func(req protocol.EventsReadRequest) ([]protocol.LifecycleEvent, error) {
		var all []protocol.LifecycleEvent
		for {
			p, err := r.s.Client.Events(ctx, req)
			if err != nil {
				return nil, err
			}
			all = append(all, p.Events...)
			if p.Complete {
				return all, nil
			}
			req.AfterSeq = p.Cursor
		}
	}
	ids := func(evs []protocol.LifecycleEvent) string {
		var b []string
		for _, e := range evs {
			who := "child"
			if e.ID == r.grandchild {
				who = "grandchild"
			}
			b = append(b, who+" "+e.Type)
		}
		return strings.Join(b, ", ")
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		evs, err := read(protocol.EventsReadRequest{Parent: r.root.SessionID, Descendants: true, Authority: r.rootAuth})
		return err == nil && len(evs) == 4
	}, "four lifecycle events in the root's subtree")
	tests := []struct {
		name string
		req  protocol.EventsReadRequest
		want string
		code protocol.Code
	}{
		{"children only", protocol.EventsReadRequest{Parent: r.root.SessionID, Authority: r.rootAuth}, "child subagent/start, child subagent/end", ""},
		{"the subtree, one event per page", protocol.EventsReadRequest{Parent: r.root.SessionID, Descendants: true, Authority: r.rootAuth, EventsMax: 1},
			"child subagent/start, grandchild subagent/start, grandchild subagent/end, child subagent/end", ""},
		{"a child's own children", protocol.EventsReadRequest{Parent: r.child, Authority: r.rootAuth}, "grandchild subagent/start, grandchild subagent/end", ""},
		{"everything with a grant", protocol.EventsReadRequest{Authority: r.grant},
			"child subagent/start, grandchild subagent/start, grandchild subagent/end, child subagent/end", ""},
		{"everything needs a grant", protocol.EventsReadRequest{Authority: r.rootAuth}, "", protocol.CodeUnauthorized},
		{"another root", protocol.EventsReadRequest{Parent: r.root.SessionID, Authority: r.otherAuth}, "", protocol.CodeUnauthorized},
		{"descendants need a parent", protocol.EventsReadRequest{Descendants: true, Authority: r.grant}, "", protocol.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, err := read(tt.req)
			if protocol.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want %q", err, tt.code)
			}
			if got := ids(evs); got != tt.want {
				t.Fatalf("events %q\nwant   %q", got, tt.want)
			}
			for i := 1; i < len(evs); i++ {
				if evs[i].Seq <= evs[i-1].Seq {
					t.Fatalf("sequences out of order: %v", evs)
				}
			}
		})
	}
}

// rawFollow opens a follow by hand: the request's reply subject is a
// subscription of the test's own, so every message of the stream is seen.
func rawFollow(t *testing.T, nc *nats.Conn, req protocol.EventsFollowRequest) (*nats.Subscription, protocol.EventsFollowReply) {
	t.Helper()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	data, _ := protocol.Marshal(protocol.Msgpack, req)
	if err := nc.PublishMsg(&nats.Msg{Subject: "brood.v1.coord.events.follow", Reply: inbox, Data: data}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if perr := client.ErrorOf(m); perr != nil {
		t.Fatal(perr)
	}
	var reply protocol.EventsFollowReply
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &reply); err != nil {
		t.Fatal(err)
	}
	return sub, reply
}

func nextFollow(t *testing.T, sub *nats.Subscription, wait time.Duration) (protocol.FollowMessage, bool) {
	t.Helper()
	m, err := sub.NextMsg(wait)
	if err != nil {
		return protocol.FollowMessage{}, false
	}
	var fm protocol.FollowMessage
	if err := protocol.Unmarshal(protocol.Msgpack, m.Data, &fm); err != nil {
		t.Fatal(err)
	}
	return fm, true
}

// nextEvent returns the next event message, skipping heartbeats, or false
// when none came within wait.
func nextEvent(t *testing.T, sub *nats.Subscription, wait time.Duration) (protocol.FollowMessage, bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return protocol.FollowMessage{}, false
		}
		fm, ok := nextFollow(t, sub, left)
		if !ok {
			return fm, false
		}
		if fm.Kind != protocol.FollowHeartbeat {
			return fm, true
		}
	}
}

func TestFollowSendsOnlyWhatWasCredited(t *testing.T) {
	r := newReadStack(t)
	zero := protocol.Seq(0)
	sub, info := rawFollow(t, r.s.NC, protocol.EventsFollowRequest{
		Parent: r.root.SessionID, Descendants: true, Authority: r.rootAuth, AfterSeq: &zero, CreditMsgs: 1, HeartbeatMs: 1000,
	})
	if info.CreditMsgs != 1 || info.HeartbeatMs != 1000 || info.FollowID == "" || !strings.HasSuffix(info.CreditSubject, ".follow."+coordinatorID(t, r.s)) {
		t.Fatalf("follow reply %+v", info)
	}
	first, ok := nextEvent(t, sub, 10*time.Second)
	if !ok || first.Kind != protocol.FollowEvent || first.Event.Type != protocol.LifecycleStart || first.Event.ID != r.child {
		t.Fatalf("first message %+v", first)
	}
	// The credit is spent: nothing but heartbeats until the client grants more.
	if m, ok := nextEvent(t, sub, 2500*time.Millisecond); ok {
		t.Fatalf("a message beyond the credit: %+v", m)
	}
	credit := func(n int) {
		var reply protocol.FollowCreditReply
		if err := client.Call(context.Background(), r.s.NC, info.CreditSubject, protocol.FollowCreditRequest{FollowID: info.FollowID, CreditMsgs: n}, &reply); err != nil {
			t.Fatal(err)
		}
	}
	credit(2)
	var got []string
	for i := 0; i < 2; i++ {
		m, ok := nextEvent(t, sub, 10*time.Second)
		if !ok || m.Kind != protocol.FollowEvent || m.Seq <= first.Seq {
			t.Fatalf("after the credit: %+v", m)
		}
		got = append(got, m.Event.Type)
	}
	if m, ok := nextEvent(t, sub, 2500*time.Millisecond); ok {
		t.Fatalf("a message beyond the second credit: %+v", m)
	}
	credit(10)
	last, ok := nextEvent(t, sub, 10*time.Second)
	if !ok || last.Event.Type != protocol.LifecycleEnd || last.Event.ID != r.child {
		t.Fatalf("last event %+v", last)
	}
	if strings.Join(got, ",") != "subagent/start,subagent/end" {
		t.Fatalf("grandchild events %v", got)
	}
	// An unknown follow is NOT_FOUND (the client resumes elsewhere).
	err := client.Call(context.Background(), r.s.NC, info.CreditSubject, protocol.FollowCreditRequest{FollowID: "nope", CreditMsgs: 1}, nil)
	if protocol.CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("credit for an unknown follow: %v", err)
	}
	// Credit for a replica that is gone is NOT_FOUND too, at once: the client resumes.
	err = client.Call(context.Background(), r.s.NC, "brood.v1.coord.follow.GONE", protocol.FollowCreditRequest{FollowID: info.FollowID, CreditMsgs: 1}, nil)
	if protocol.CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("credit to a gone replica: %v", err)
	}
}

func coordinatorID(t *testing.T, s *stack.Stack) string {
	t.Helper()
	var id string
	testutil.Eventually(t, 5*time.Second, func() bool {
		keys, err := s.Store.Hosts.Keys(context.Background())
		if err != nil {
			return false
		}
		for _, k := range keys {
			e, err := s.Store.Hosts.Get(context.Background(), k)
			var h protocol.HostRecord
			if err == nil && protocol.Unmarshal(protocol.Msgpack, e.Value(), &h) == nil && h.Kind == protocol.HostCoordinator {
				id = k
			}
		}
		return id != ""
	}, "the coordinator's host record")
	return id
}

func TestFollowEndsWhenItsAuthorityDies(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	sub, _ := rawFollow(t, s.NC, protocol.EventsFollowRequest{Parent: root.SessionID, Authority: root.Authority(), HeartbeatMs: 1000})
	ctx := context.Background()
	if err := root.Close(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, ok := nextFollow(t, sub, time.Until(deadline))
		if !ok {
			break
		}
		if m.Kind == protocol.FollowEnd {
			if m.Error == nil || m.Error.Code != protocol.CodeUnauthorized {
				t.Fatalf("end %+v", m)
			}
			return
		}
	}
	t.Fatal("the follow of a closed root did not end")
}

// TestFollowStoppedByTheClientEndsWithAnEndMessage: a credit request with
// stop ends the follow with a last message of kind end and no error
// (docs/protocol.md §5.19), so a reader waiting for the end is not left
// waiting (issue 37, item 6: it sent nothing).
func TestFollowStoppedByTheClientEndsWithAnEndMessage(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	sub, info := rawFollow(t, s.NC, protocol.EventsFollowRequest{Parent: root.SessionID, Authority: root.Authority(), HeartbeatMs: 1000})
	if err := client.Call(context.Background(), s.NC, info.CreditSubject, protocol.FollowCreditRequest{FollowID: info.FollowID, Stop: true}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, ok := nextFollow(t, sub, time.Until(deadline))
		if !ok {
			break
		}
		if m.Kind == protocol.FollowEnd {
			if m.Error != nil {
				t.Fatalf("end of a stopped follow carries an error: %+v", m.Error)
			}
			return
		}
	}
	t.Fatal("a stopped follow sent no end")
}

func TestClientFollowResumesWithoutGapsOrRepeats(t *testing.T) {
	r := newReadStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := protocol.Seq(0)
	f, err := r.s.Client.Follow(ctx, protocol.EventsFollowRequest{Parent: r.root.SessionID, Descendants: true, Authority: r.rootAuth, AfterSeq: &zero, CreditMsgs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, err := f.Next(ctx)
	if err != nil || first.ID != r.child || first.Type != protocol.LifecycleStart {
		t.Fatalf("first %+v, %v", first, err)
	}
	// A second follow resumes after the first event: it sees the other three.
	g, err := r.s.Client.Follow(ctx, protocol.EventsFollowRequest{Parent: r.root.SessionID, Descendants: true, Authority: r.rootAuth, AfterSeq: &first.Seq})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var rest []string
	for i := 0; i < 3; i++ {
		ev, err := g.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq <= first.Seq {
			t.Fatalf("repeated event %+v", ev)
		}
		rest = append(rest, ev.Type)
	}
	if strings.Join(rest, ",") != "subagent/start,subagent/end,subagent/end" {
		t.Fatalf("rest %v", rest)
	}
	// The first follow, with a credit of one, goes on as the client reads.
	for i := 0; i < 3; i++ {
		if _, err := f.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Live: a new run's events arrive on the open follow.
	if _, _, err := r.s.Run(r.root.Ref(), "spawn", "say again", protocol.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	ev, err := g.Next(ctx)
	if err != nil || ev.Type != protocol.LifecycleStart {
		t.Fatalf("live event %+v, %v", ev, err)
	}
}

// settledNotice waits until the root's inbox holds n items.
func waitInbox(t *testing.T, s *stack.Stack, id string, auth protocol.Authority, n int) []protocol.InboxItem {
	t.Helper()
	var items []protocol.InboxItem
	testutil.Eventually(t, 20*time.Second, func() bool {
		p, err := s.Client.Inbox(context.Background(), protocol.InboxReadRequest{SessionID: id, Authority: auth})
		items = p.Items
		return err == nil && len(items) == n
	}, "%d items in the inbox of %s", n, id)
	return items
}

func TestRootInboxReadAndAck(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root, other := s.Root(), s.Root()
	ctx := context.Background()
	grant := s.Grant()
	start, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "worker", Prompt: protocol.Text("say finished")})
	if err != nil {
		t.Fatal(err)
	}
	items := waitInbox(t, s, root.SessionID, root.Authority(), 1)
	n := items[0]
	if n.Source.Kind != protocol.SourceSubagentSettled || n.Source.SenderSessionID != start.ChildID || n.Delivery != protocol.DeliveryNextStep || n.Seq == 0 ||
		!strings.Contains(protocol.AllText(n.Content), "is done") || !strings.Contains(protocol.AllText(n.Content), "finished") {
		t.Fatalf("notice %+v", n)
	}
	// The other root's own notice, to try acknowledging across inboxes.
	if _, err := s.Client.StartContinuable(ctx, protocol.ContinuableStartRequest{Provider: "spawn", Parent: other.Ref(), Label: "w", Prompt: protocol.Text("say x")}); err != nil {
		t.Fatal(err)
	}
	otherItem := waitInbox(t, s, other.SessionID, other.Authority(), 1)[0]

	reads := []struct {
		name string
		id   string
		auth protocol.Authority
		want protocol.Code
	}{
		{"the root reads its inbox", root.SessionID, root.Authority(), ""},
		{"a grant reads it", root.SessionID, grant, ""},
		{"a grant reads a child's inbox", start.ChildID, grant, ""},
		{"another root does not", root.SessionID, other.Authority(), protocol.CodeUnauthorized},
		{"no authority", root.SessionID, protocol.Authority{}, protocol.CodeUnauthorized},
		{"a grant, unknown session", "NOSUCH", grant, protocol.CodeNotFound},
	}
	for _, tt := range reads {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Client.Inbox(ctx, protocol.InboxReadRequest{SessionID: tt.id, Authority: tt.auth})
			if protocol.CodeOf(err) != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	acks := []struct {
		name string
		req  protocol.InboxAckRequest
		want protocol.Code
	}{
		{"another root cannot ack", protocol.InboxAckRequest{SessionID: root.SessionID, Authority: other.Authority(), Seqs: []protocol.Seq{n.Seq}}, protocol.CodeUnauthorized},
		{"a child's inbox is never acked", protocol.InboxAckRequest{SessionID: start.ChildID, Authority: grant, Seqs: []protocol.Seq{1}}, protocol.CodeInvalidArgument},
		{"an item of another inbox", protocol.InboxAckRequest{SessionID: root.SessionID, Authority: root.Authority(), Seqs: []protocol.Seq{otherItem.Seq}}, protocol.CodeInvalidArgument},
		{"no sequences", protocol.InboxAckRequest{SessionID: root.SessionID, Authority: root.Authority()}, protocol.CodeInvalidArgument},
	}
	for _, tt := range acks {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Client.Ack(ctx, tt.req); protocol.CodeOf(err) != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if got := waitInbox(t, s, other.SessionID, other.Authority(), 1); got[0].Seq != otherItem.Seq {
		t.Fatalf("the other root's item changed: %+v", got)
	}
	a, err := root.Ack(ctx, protocol.InboxAckRequest{Seqs: []protocol.Seq{n.Seq}})
	if err != nil || a.Removed != 1 {
		t.Fatalf("ack: %+v, %v", a, err)
	}
	if a, err := root.Ack(ctx, protocol.InboxAckRequest{Seqs: []protocol.Seq{n.Seq}}); err != nil || a.Removed != 0 {
		t.Fatalf("a second ack of the same item: %+v, %v", a, err)
	}
	waitInbox(t, s, root.SessionID, root.Authority(), 0)

	// A long poll answers when the next notice arrives.
	done := make(chan []protocol.InboxItem, 1)
	go func() {
		items, _ := root.Notices(ctx, protocol.InboxReadRequest{WaitMs: 30_000})
		done <- items
	}()
	if _, err := s.Client.Followup(ctx, protocol.FollowupRequest{ChildID: start.ChildID, Authority: root.Authority(), Message: protocol.Text("say again")}); err != nil {
		t.Fatal(err)
	}
	select {
	case items := <-done:
		if len(items) != 1 || !strings.Contains(protocol.AllText(items[0].Content), "again") {
			t.Fatalf("long poll gave %+v", items)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the inbox long poll never answered")
	}
	waitInbox(t, s, root.SessionID, root.Authority(), 0)
}
