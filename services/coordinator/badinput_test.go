package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/store"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/client"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/services/coordinator"
)

// fakeChild writes a live continuable child of parent as a start writes it
// (header, lease on host, and its own ledger when own is non-nil) and
// returns its credential: the test holds what its worker would.
func fakeChild(t *testing.T, s *stack.Stack, host, parent, id string, budgets []string, own *protocol.Budget) protocol.ParentRef {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := protocol.ParentRef{SessionID: id, Credential: "credential-of-" + id}
	if err := s.Store.PutHeader(ctx, protocol.SessionHeader{ID: id, ParentSession: parent, Origin: protocol.OriginSubagent,
		Provider: "spawn", CreatedAt: store.NowMs(), Budgets: budgets}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.CreateLease(ctx, protocol.AgentRecord{SessionID: id, Kind: protocol.AgentContinuable, Provider: "spawn",
		ParentSession: parent, HostID: host, CredentialHash: protocol.HashCredential(ref.Credential)}); err != nil {
		t.Fatal(err)
	}
	if own != nil {
		if _, err := s.Store.WriteBudget(ctx, id, protocol.BudgetRecord{SessionID: id, Limits: *own, CreatedAt: store.NowMs()}, 0); err != nil {
			t.Fatal(err)
		}
	}
	return ref
}

// replyCode sends body to the coordinator's endpoint ep as JSON and
// returns the code of the error it answers ("" for a reply that is none).
func replyCode(t *testing.T, s *stack.Stack, nc *nats.Conn, ep, body string) (protocol.Code, string) {
	t.Helper()
	resp := rawReq(t, nc, s.Store.Subj.Coord(ep), body, jsonHeader())
	var pe protocol.Error
	if err := json.Unmarshal(resp.Data, &pe); err != nil || pe.Code == "" {
		return "", string(resp.Data)
	}
	return pe.Code, string(resp.Data)
}

func authJSON(a protocol.Authority) string {
	b, _ := json.Marshal(a)
	return string(b)
}

// TestBudgetRaiseAndGetRefuseBadInput (docs/protocol.md §5.5 "Pause and
// raise", §5.23; issue 32, item 3): budget.raise and budget.get refuse,
// with a typed error and nothing written, a malformed body (an unknown
// field, a wrong type, a number no int64 or float64 holds), a bad childId,
// no or a forged authority, a child raising its own or its parent's
// ledger, a root's credential over another tree's child, and a replayed
// raise past the parent's remainder.
func TestBudgetRaiseAndGetRefuseBadInput(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	child := fakeChild(t, s, host.ID(), root.SessionID, "badinputchild000000000001", []string{root.SessionID, "badinputchild000000000001"}, &protocol.Budget{ModelRequests: 2})
	stranger := s.Root()
	strangerChild := fakeChild(t, s, host.ID(), stranger.SessionID, "badinputstranger000000001", []string{"badinputstranger000000001"}, &protocol.Budget{ModelRequests: 1})
	ledgers := func() string {
		var out []string
		for _, id := range []string{root.SessionID, child.SessionID, strangerChild.SessionID} {
			rec, err := s.Store.Budget(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s %+v %+v %d", id, rec.Value.Limits, rec.Value.Charged, len(rec.Value.Reservations)))
		}
		return strings.Join(out, "; ")
	}
	before := ledgers()

	parent := authJSON(root.Authority())
	forged := authJSON(protocol.Authority{Parent: &protocol.ParentRef{SessionID: root.SessionID, Credential: root.Ref().Credential + "x"}})
	self := authJSON(protocol.Authority{Parent: &child})
	cases := []struct {
		name, ep, body string
		code           protocol.Code
	}{
		{"an unknown field", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1},"force":true}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"an unknown limit", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1,"dollars":5}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"a string amount", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":"1"}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"a list for the raise", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":[1]}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"a null raise", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":null}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"no float64 holds it", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1e400}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"int64 overflow", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":9223372036854775808}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"max int64", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":9223372036854775807}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"negative zero", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":-0}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"a positive and a negative", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1,"toolCalls":-5}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
		{"an empty childId", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":"","authority":%s,"raise":{"modelRequests":1}}`, parent), protocol.CodeInvalidArgument},
		{"a path as childId", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":"../budget.x","authority":%s,"raise":{"modelRequests":1}}`, parent), protocol.CodeInvalidArgument},
		{"a wildcard childId", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":">","authority":%s,"raise":{"modelRequests":1}}`, parent), protocol.CodeInvalidArgument},
		{"no authority", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"raise":{"modelRequests":1}}`, child.SessionID), protocol.CodeUnauthorized},
		{"a forged credential", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1}}`, child.SessionID, forged), protocol.CodeUnauthorized},
		{"an unknown grant", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":{"grant":"no-such-grant-000000000000001"},"raise":{"modelRequests":1}}`, child.SessionID), protocol.CodeUnauthorized},
		{"the child raises itself", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1}}`, child.SessionID, self), protocol.CodeUnauthorized},
		{"the child raises its parent", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1}}`, root.SessionID, self), protocol.CodeUnauthorized},
		{"a root raises another tree's child", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1}}`, strangerChild.SessionID, parent), protocol.CodeUnauthorized},
		{"a stranger's child raises this child", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1}}`, child.SessionID, authJSON(protocol.Authority{Parent: &strangerChild})), protocol.CodeUnauthorized},
		{"an unknown session", protocol.EpBudgetRaise, fmt.Sprintf(`{"childId":"nosuchsession000000000001","authority":%s,"raise":{"modelRequests":1}}`, parent), protocol.CodeUnauthorized},
		{"get: the child reads itself", protocol.EpBudgetGet, fmt.Sprintf(`{"childId":%q,"authority":%s}`, child.SessionID, self), protocol.CodeUnauthorized},
		{"get: another tree's child", protocol.EpBudgetGet, fmt.Sprintf(`{"childId":%q,"authority":%s}`, strangerChild.SessionID, parent), protocol.CodeUnauthorized},
		{"get: an unknown field", protocol.EpBudgetGet, fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":1}}`, child.SessionID, parent), protocol.CodeInvalidArgument},
	}
	nc := s.Conn()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if code, data := replyCode(t, s, nc, tt.ep, tt.body); code != tt.code {
				t.Fatalf("reply %s; want %s", data, tt.code)
			}
		})
	}
	if after := ledgers(); after != before {
		t.Fatalf("the refused raises changed the ledgers:\n%s\nwas\n%s", after, before)
	}

	// A replay: the parent raises its child to its own remainder (10
	// model requests left of the root's ledger: the child's 2 + 8), then
	// sends the same raise again, which would leave 18.
	raise := fmt.Sprintf(`{"childId":%q,"authority":%s,"raise":{"modelRequests":8}}`, child.SessionID, parent)
	if code, data := replyCode(t, s, nc, protocol.EpBudgetRaise, raise); code != "" {
		t.Fatalf("the first raise: %s", data)
	}
	raised := ledgers()
	if code, data := replyCode(t, s, nc, protocol.EpBudgetRaise, raise); code != protocol.CodeLimitExceeded {
		t.Fatalf("the replayed raise: %s; want LIMIT_EXCEEDED", data)
	}
	if after := ledgers(); after != raised {
		t.Fatalf("the replayed raise changed the ledgers:\n%s\nwas\n%s", after, raised)
	}
}

// TestABudgetPauseNamesOnlyALedgerItDrawsOn (docs/protocol.md §5.21,
// "Kinds": a budget pause's budgetOf is the session whose ledger refused):
// requests.open of kind budget naming a ledger the session does not draw on
// (another tree's session) is INVALID_ARGUMENT and nothing is written;
// otherwise that tree's user's raise would answer this tree's request and
// learn its id. A ledger the session draws on (its own, an ancestor's) is
// accepted.
func TestABudgetPauseNamesOnlyALedgerItDrawsOn(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	child := fakeChild(t, s, host.ID(), root.SessionID, "pausingchild0000000000001", []string{root.SessionID, "pausingchild0000000000001"}, &protocol.Budget{ModelRequests: 1})
	stranger := s.Root()
	strangerChild := fakeChild(t, s, host.ID(), stranger.SessionID, "pausingstranger0000000001", []string{"pausingstranger0000000001"}, &protocol.Budget{ModelRequests: 1})
	nc := s.Conn()
	open := func(callID, budgetOf string) (protocol.Code, string) {
		b, _ := json.Marshal(protocol.RequestOpenRequest{Self: child, Kind: protocol.RequestBudget, CallID: callID, Turn: 1, Step: 1,
			BudgetOf: budgetOf, Exhausted: "modelRequests spent"})
		return replyCode(t, s, nc, protocol.EpRequestsOpen, string(b))
	}
	for _, tt := range []struct {
		name, callID, budgetOf string
		code                   protocol.Code
	}{
		{"another tree's session", "budget-t1-s1-1", strangerChild.SessionID, protocol.CodeInvalidArgument},
		{"a session that does not exist", "budget-t1-s1-2", "nosuchsession000000000001", protocol.CodeInvalidArgument},
		{"its own ledger", "budget-t1-s1-3", child.SessionID, ""},
		{"its parent's ledger", "budget-t1-s1-4", root.SessionID, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, data := open(tt.callID, tt.budgetOf)
			if code != tt.code {
				t.Fatalf("requests.open budgetOf %s: %s; want %q", tt.budgetOf, data, tt.code)
			}
			_, err := s.Store.Request(ctx, protocol.RequestID(child.SessionID, tt.callID))
			if written := err == nil; written != (tt.code == "") {
				t.Fatalf("request written %v after %s (%v)", written, data, err)
			}
		})
	}
	// A record naming the other tree's ledger as an earlier coordinator
	// wrote it (before requests.open checked budgetOf).
	now := store.NowMs()
	old := protocol.RequestRecord{Version: protocol.RequestVersion, ID: protocol.RequestID(child.SessionID, "budget-t1-s1-9"), SessionID: child.SessionID,
		Kind: protocol.RequestBudget, CallID: "budget-t1-s1-9", Turn: 1, Step: 1, BudgetOf: strangerChild.SessionID,
		State: protocol.RequestPending, CreatedAt: now, Deadline: now + 60_000}
	if _, err := s.Store.CreateRequest(ctx, old); err != nil {
		t.Fatal(err)
	}
	// The other tree's user raises its child: nothing of this tree is
	// answered.
	rep, err := s.Client.RaiseBudget(ctx, strangerChild.SessionID, stranger.Authority(), protocol.BudgetSpend{ModelRequests: 1})
	if err != nil || len(rep.Resumed) != 0 {
		t.Fatalf("the other tree's raise = %+v, %v; want no request of this tree answered", rep, err)
	}
	if rec, err := s.Store.Request(ctx, old.ID); err != nil || rec.Value.State != protocol.RequestPending {
		t.Fatalf("the request naming the other tree's ledger after its raise: %+v, %v; want still pending", rec.Value, err)
	}
}

// TestAForgedContinueTakesNoRun (docs/protocol.md §9.3, provider continue;
// issue 31, item 2): a continue request for a run whose host is alive (its
// lease not taken over), at a revision that is not the lease's, naming
// another provider, a header of another session, no revision, or a run
// that does not exist, is refused with its code by the instance, and the
// run's lease and record stay as they were: the live host keeps its run.
func TestAForgedContinueTakesNoRun(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	other, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("sleep 30s\nsay done")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = run.Dispose(context.Background()) }()
	var lease store.Record[protocol.AgentRecord]
	testutil.Eventually(t, 10*time.Second, func() bool {
		lease, err = s.Store.LeaseLatest(ctx, run.ChildID)
		return err == nil
	}, "the run's lease is written")
	header, _ := s.Log(run.ChildID)
	instance := host.ID() // the instance that is not the run's host
	if lease.Value.HostID == instance {
		instance = other.ID()
	}
	rec, err := s.Store.RunLatest(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	otherHeader := header
	otherHeader.ID = "notthechild00000000000001"
	forkHeader := header
	forkHeader.Provider = "fork"
	good := protocol.ProviderContinueRequest{RunID: run.RunID, ChildID: run.ChildID, Provider: "spawn", LeaseRevision: protocol.Seq(lease.Revision),
		Deadline: store.NowMs() + 10_000, Header: header}
	nc := s.Conn()
	for _, tt := range []struct {
		name string
		edit func(*protocol.ProviderContinueRequest)
		code protocol.Code
	}{
		{"a run whose host is alive", func(*protocol.ProviderContinueRequest) {}, protocol.CodeNotPending},
		{"a stale revision", func(r *protocol.ProviderContinueRequest) { r.LeaseRevision-- }, protocol.CodeNotPending},
		{"no revision", func(r *protocol.ProviderContinueRequest) { r.LeaseRevision = 0 }, protocol.CodeInvalidArgument},
		{"another provider", func(r *protocol.ProviderContinueRequest) { r.Provider = "fork" }, protocol.CodeInvalidArgument},
		{"a header of another provider", func(r *protocol.ProviderContinueRequest) { r.Header = forkHeader }, protocol.CodeInvalidArgument},
		{"a header of another session", func(r *protocol.ProviderContinueRequest) { r.Header = otherHeader }, protocol.CodeInvalidArgument},
		{"a run that does not exist", func(r *protocol.ProviderContinueRequest) { r.RunID = "nosuchrun0000000000000001" }, protocol.CodeNotPending},
		{"a bad runId", func(r *protocol.ProviderContinueRequest) { r.RunID = "../x" }, protocol.CodeInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := good
			tt.edit(&req)
			b, _ := json.Marshal(req)
			// Sent to the instance that is not the run's host, as a
			// coordinator's dispatch would.
			resp := rawReq(t, nc, s.Store.Subj.ProviderInstance("spawn", instance, protocol.OpProviderContinue), string(b), jsonHeader())
			var pe protocol.Error
			if err := json.Unmarshal(resp.Data, &pe); err != nil || pe.Code != tt.code {
				t.Fatalf("reply %s; want %s", resp.Data, tt.code)
			}
		})
	}
	after, err := s.Store.LeaseLatest(ctx, run.ChildID)
	if err != nil || after.Revision != lease.Revision || after.Value.HostID != lease.Value.HostID || after.Value.CredentialHash != lease.Value.CredentialHash {
		t.Fatalf("the lease after the forged continues: rev %d host %s (%v); want rev %d on %s, unchanged", after.Revision, after.Value.HostID, err, lease.Revision, lease.Value.HostID)
	}
	if now, err := s.Store.RunLatest(ctx, run.RunID); err != nil || now.Revision != rec.Revision || now.Value.State != protocol.RunRunning {
		t.Fatalf("the run after the forged continues: %+v rev %d (%v); want running at rev %d", now.Value, now.Revision, err, rec.Revision)
	}
}

// TestAQueuedStartIsDisposedOnceByItsParentOnly (docs/protocol.md §5.5,
// "The start queue"; issue 32, item 4): another root's credential can
// neither await nor dispose a queued run (UNAUTHORIZED, the entry stays
// queued); the parent's two disposes at once and a third later all answer
// it settled CANCELLED, and its child is given back to the budget once.
func TestAQueuedStartIsDisposedOnceByItsParentOnly(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator(func(c *coordinator.Config) { c.LiveChildrenMax = 1 })
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{Children: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	start := func() (*client.Run, error) {
		return s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text("sleep 30s\nsay x")})
	}
	if _, err := start(); err != nil {
		t.Fatal(err)
	}
	waiting, err := start()
	if err != nil || waiting.State != protocol.RunQueued {
		t.Fatalf("the second start: %v (state %q), want queued", err, waiting.State)
	}
	children := func() int64 {
		rec, err := s.Store.Budget(ctx, root.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		return rec.Value.Charged.Add(rec.Value.Reserved()).Children
	}
	queuedCharge := children()
	if queuedCharge != 2 {
		t.Fatalf("the root's ledger charges %d children with one live and one queued; want 2", queuedCharge)
	}

	stranger := s.Root().Ref()
	for _, ep := range []string{protocol.EpRunsAwait, protocol.EpRunsDispose} {
		var st protocol.RunStatus
		err := s.Client.Call(ctx, ep, protocol.RunRef{RunID: waiting.RunID, Parent: &stranger}, &st)
		if protocol.CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("%s of a queued run with another root's credential: %+v, %v; want UNAUTHORIZED", ep, st, err)
		}
	}
	if q, err := s.Store.StartQueue(ctx, root.SessionID); err != nil || len(q.Value.Entries) != 1 || q.Value.Entries[0].RunID != waiting.RunID {
		t.Fatalf("the queue after a stranger's dispose: %+v, %v; want the queued start still there", q.Value, err)
	}

	var wg sync.WaitGroup
	sts := make([]protocol.RunStatus, 3)
	errs := make([]error, 3)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sts[i], errs[i] = waiting.Dispose(ctx)
		}()
	}
	wg.Wait()
	sts[2], errs[2] = waiting.Dispose(ctx)
	for i := range sts {
		if errs[i] != nil || sts[i].State != protocol.RunSettled || sts[i].Result == nil || sts[i].Result.ErrorCode != protocol.CodeCancelled {
			t.Fatalf("dispose %d of the queued run: %+v, %v; want settled CANCELLED", i, sts[i], errs[i])
		}
	}
	if got := children(); got != queuedCharge-1 {
		t.Fatalf("the root's ledger charges %d children after the disposes; want %d (the queued child given back once)", got, queuedCharge-1)
	}
}

// TestBudgetReserveAndSettleRefuseOthers (docs/protocol.md §5.5,
// "Budgets"; issue 32, item 2, as ACP and A2A children use them): a
// reservation is taken on a session's own credential only, for a whole
// positive want of tokens, modelRequests or toolCalls; it is settled by its
// own session only, with a whole non-negative use, and once: another
// child's settle (of the same ledger), a forged credential, a negative,
// fractional or 1e400 use, and a replay are refused or change nothing.
func TestBudgetReserveAndSettleRefuseOthers(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	host, _ := s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root, err := s.Client.OpenRoot(ctx, protocol.AgentsOpenRequest{Cwd: t.TempDir(), Budget: &protocol.Budget{ModelRequests: 10, Tokens: 100_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close(context.Background()) }()
	a := fakeChild(t, s, host.ID(), root.SessionID, "reservingchild00000000001", []string{root.SessionID}, nil)
	b := fakeChild(t, s, host.ID(), root.SessionID, "reservingchild00000000002", []string{root.SessionID}, nil)
	nc := s.Conn()
	ledger := func() string {
		rec, err := s.Store.Budget(ctx, root.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%+v %+v", rec.Value.Charged, rec.Value.Reservations)
	}
	before := ledger()
	self := func(p protocol.ParentRef) string { b, _ := json.Marshal(p); return string(b) }
	forged := protocol.ParentRef{SessionID: a.SessionID, Credential: b.Credential}
	for _, tt := range []struct {
		name, body string
		code       protocol.Code
	}{
		{"another child's credential", fmt.Sprintf(`{"self":%s,"want":{"modelRequests":1}}`, self(forged)), protocol.CodeUnauthorized},
		{"a credential of the root for its child", fmt.Sprintf(`{"self":%s,"want":{"modelRequests":1}}`, self(protocol.ParentRef{SessionID: a.SessionID, Credential: root.Ref().Credential})), protocol.CodeUnauthorized},
		{"children", fmt.Sprintf(`{"self":%s,"want":{"children":1}}`, self(a)), protocol.CodeInvalidArgument},
		{"nothing", fmt.Sprintf(`{"self":%s,"want":{}}`, self(a)), protocol.CodeInvalidArgument},
		{"negative", fmt.Sprintf(`{"self":%s,"want":{"modelRequests":-1}}`, self(a)), protocol.CodeInvalidArgument},
		{"fractional", fmt.Sprintf(`{"self":%s,"want":{"tokens":0.5}}`, self(a)), protocol.CodeInvalidArgument},
		{"tokensMin above tokens", fmt.Sprintf(`{"self":%s,"want":{"tokens":10},"tokensMin":11}`, self(a)), protocol.CodeInvalidArgument},
		{"negative tokensMin", fmt.Sprintf(`{"self":%s,"want":{"tokens":10},"tokensMin":-1}`, self(a)), protocol.CodeInvalidArgument},
		{"an unknown field", fmt.Sprintf(`{"self":%s,"want":{"modelRequests":1},"free":true}`, self(a)), protocol.CodeInvalidArgument},
	} {
		t.Run("reserve: "+tt.name, func(t *testing.T) {
			if code, data := replyCode(t, s, nc, protocol.EpBudgetReserve, tt.body); code != tt.code {
				t.Fatalf("reply %s; want %s", data, tt.code)
			}
		})
	}
	if after := ledger(); after != before {
		t.Fatalf("the refused reservations changed the ledger: %s, was %s", after, before)
	}

	var res protocol.BudgetReserveReply
	if err := s.Client.Call(ctx, protocol.EpBudgetReserve, protocol.BudgetReserveRequest{Self: a, Want: protocol.BudgetSpend{ModelRequests: 1, Tokens: 1000}}, &res); err != nil || res.ReservationID == "" {
		t.Fatalf("a's reservation: %+v, %v", res, err)
	}
	reserved := ledger()
	for _, tt := range []struct {
		name, body string
		code       protocol.Code
	}{
		{"by another child", fmt.Sprintf(`{"self":%s,"reservationId":%q,"used":{"modelRequests":1}}`, self(b), res.ReservationID), protocol.CodeUnauthorized},
		{"a forged credential", fmt.Sprintf(`{"self":%s,"reservationId":%q,"used":{"modelRequests":1}}`, self(forged), res.ReservationID), protocol.CodeUnauthorized},
		{"negative", fmt.Sprintf(`{"self":%s,"reservationId":%q,"used":{"modelRequests":-1}}`, self(a), res.ReservationID), protocol.CodeInvalidArgument},
		{"fractional", fmt.Sprintf(`{"self":%s,"reservationId":%q,"used":{"tokens":1.5}}`, self(a), res.ReservationID), protocol.CodeInvalidArgument},
		{"no float64 holds it", fmt.Sprintf(`{"self":%s,"reservationId":%q,"used":{"tokens":1e400}}`, self(a), res.ReservationID), protocol.CodeInvalidArgument},
		{"no reservation id", fmt.Sprintf(`{"self":%s,"reservationId":"","used":{"modelRequests":1}}`, self(a)), protocol.CodeInvalidArgument},
	} {
		t.Run("settle: "+tt.name, func(t *testing.T) {
			if code, data := replyCode(t, s, nc, protocol.EpBudgetSettle, tt.body); code != tt.code {
				t.Fatalf("reply %s; want %s", data, tt.code)
			}
		})
	}
	if after := ledger(); after != reserved {
		t.Fatalf("the refused settles changed the ledger: %s, was %s", after, reserved)
	}
	settle := protocol.BudgetSettleRequest{Self: a, ReservationID: res.ReservationID, Used: protocol.BudgetSpend{ModelRequests: 1, Tokens: 700}}
	for i := 0; i < 2; i++ {
		if err := s.Client.Call(ctx, protocol.EpBudgetSettle, settle, &protocol.Empty{}); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
	}
	rec, err := s.Store.Budget(ctx, root.SessionID)
	if err != nil || rec.Value.Charged.ModelRequests != 1 || rec.Value.Charged.Tokens != 700 || len(rec.Value.Reservations) != 0 {
		t.Fatalf("the ledger after a settle and its replay: %+v, %v; want 1 request and 700 tokens charged once, nothing in flight", rec.Value, err)
	}
}

// TestApproveToolsRefusesBadInput (docs/protocol.md §5.5, approveTools;
// issue 33, item 2(a)): a runs.start or continuable.start whose
// approveTools is not a list of the provider's tool names (an unknown or
// empty name, another case, a string, a number, an object), or names a
// tool autoApprove also names, is INVALID_ARGUMENT and starts nothing.
func TestApproveToolsRefusesBadInput(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	root := s.Root()
	nc := s.Conn()
	body := func(ep string, options map[string]json.RawMessage) string {
		var req any = protocol.RunStartRequest{Provider: "spawn", Parent: root.Ref(), Prompt: protocol.Text("say x")}
		if ep == protocol.EpContinuableStart {
			req = protocol.ContinuableStartRequest{Provider: "spawn", Parent: root.Ref(), Label: "x", Prompt: protocol.Text("say x")}
		}
		b, _ := json.Marshal(req)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		o, _ := json.Marshal(options)
		m["options"] = o
		b, _ = json.Marshal(m)
		return string(b)
	}
	for _, ep := range []string{protocol.EpRunsStart, protocol.EpContinuableStart} {
		for _, tt := range []struct {
			name    string
			options map[string]json.RawMessage
		}{
			{"an unknown tool", map[string]json.RawMessage{"approveTools": json.RawMessage(`["launch_missiles"]`)}},
			{"an empty name", map[string]json.RawMessage{"approveTools": json.RawMessage(`[""]`)}},
			{"another case", map[string]json.RawMessage{"approveTools": json.RawMessage(`["READ_FILE"]`)}},
			{"a wildcard", map[string]json.RawMessage{"approveTools": json.RawMessage(`["*"]`)}},
			{"a string", map[string]json.RawMessage{"approveTools": json.RawMessage(`"read_file"`)}},
			{"a number", map[string]json.RawMessage{"approveTools": json.RawMessage(`[1]`)}},
			{"an object", map[string]json.RawMessage{"approveTools": json.RawMessage(`{"read_file":true}`)}},
			{"both lists", map[string]json.RawMessage{"approveTools": json.RawMessage(`["write_file"]`), "autoApprove": json.RawMessage(`["write_file"]`)}},
		} {
			t.Run(ep+": "+tt.name, func(t *testing.T) {
				if code, data := replyCode(t, s, nc, ep, body(ep, tt.options)); code != protocol.CodeInvalidArgument {
					t.Fatalf("reply %s; want INVALID_ARGUMENT", data)
				}
			})
		}
	}
	rows, err := s.Client.Children(ctx, protocol.ChildrenListRequest{Parent: root.SessionID, Authority: root.Authority()})
	if err != nil || len(rows.Rows) != 0 {
		t.Fatalf("children after the refused starts: %+v, %v; want none", rows.Rows, err)
	}
}
