package chaos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Recorded histories of deliberately broken builds (testdata/): the checker
// must catch each, naming the invariant the break violates, and pass the
// good history they come from.
//
// testdata/good.json.gz is the history of a real run (TestChaos, seed 1,
// 6 s, a worker killed -9). A broken build's fault shows only when a fault
// lands in a window of a few microseconds (between an inbox item's delete
// and its claim's append; between a host's last append and its settlement),
// so a short run of the broken build rarely trips it; each broken history is
// therefore the good history with exactly what that build leaves behind
// when it does, written by TestRecordBrokenBuilds (-chaos.mkbroken=GOOD):
//
//   - broken-delete-before-claim: the worker deletes an inbox item before it
//     logs the claim and dies in between: the claim, its turn and the item
//     are gone, yet the followup was answered with its messageId.
//   - broken-settle-without-cas: the host settles a one-shot run with a plain
//     put instead of the compare-and-set, after a coordinator settled it
//     HOST_LOST: both writes land and both publish, the client gets two
//     notices, and the record holds the second result.
//   - broken-answer-without-cas: requests.answer writes the answer with a
//     plain put instead of the compare-and-set: a second answer (a deny by
//     another client's grant) to a request already approved is taken too,
//     replacing the first in the record, while the child went on with the
//     approval it read.
//   - broken-tool-runs-twice: an approved run_command runs twice (say, a
//     worker that runs an approved call again when its result's append
//     fails): its token is twice in the workspace's RanFile.
//   - broken-model-request-unreserved: a worker sends one model request of
//     a budgeted session without budget.reserve (so nothing settles it):
//     its step is in the log, its tokens and request on no ledger of the
//     session's.
//   - broken-reservation-charged-twice: a dead host's reservation is
//     charged twice (a settle that lands after the coordinator swept it,
//     without the "already gone" check; or a sweep that charges without
//     removing it): a ledger at its limit of model requests (or tool
//     calls) is charged one more, and the request's tokens again.
//   - broken-continues-twice: a one-shot run whose host died is continued
//     by two instances (the takeover asks two, or the continue takes the
//     lease without its compare-and-set): both send the model request that
//     was in flight and log its step, the same turn's same step twice, one
//     after the other; the run's settlement, a compare-and-set, is still
//     taken once (issue 31).
//
// The good history of a real run holds requests (issue 33): approvals
// approved and denied, a question, a second answer refused
// ALREADY_ANSWERED, approved run_command and write_file calls that ran;
// and budgets (issue 32): ledgers charged exactly what their trees' logs
// show, and ledgers at a limit.
var brokenBuilds = []struct {
	file, invariant, example string
}{
	{"broken-delete-before-claim.json.gz", "I1", "is neither in the log nor in the inbox: lost"},
	{"broken-settle-without-cas.json.gz", "I2", "announced settled 2 times with 2 results"},
	{"broken-answer-without-cas.json.gz", "I10", "2 answers were taken"},
	{"broken-tool-runs-twice.json.gz", "I10", "ran 2 times"},
	{"broken-model-request-unreserved.json.gz", "I11", "less than its tree's logs show"},
	{"broken-reservation-charged-twice.json.gz", "I11", "over its limit of"},
	{"broken-continues-twice.json.gz", "I12", "has two step/start records"},
}

func TestCheckerCatchesRecordedBrokenBuilds(t *testing.T) {
	good, err := LoadHistory(filepath.Join("testdata", "good.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(good); !r.OK() {
		t.Fatalf("the good history fails:\n%s", strings.Join(r.Lines(), "\n"))
	}
	for _, b := range brokenBuilds {
		t.Run(b.file, func(t *testing.T) {
			h, err := LoadHistory(filepath.Join("testdata", b.file))
			if err != nil {
				t.Fatal(err)
			}
			r := Check(h)
			found := false
			for _, v := range r.Verdicts {
				if v.Name == b.invariant {
					found = true
					if v.Holds() || !strings.Contains(strings.Join(v.Examples, "\n"), b.example) {
						t.Errorf("%s: %d violations %v; want one saying %q", v.Name, v.Violations, v.Examples, b.example)
					}
				} else if !v.Holds() {
					t.Errorf("%s violated too: %v", v.Name, v.Examples)
				}
			}
			if !found {
				t.Errorf("the checker has no invariant %s", b.invariant)
			}
			if t.Failed() {
				t.Log(strings.Join(r.Lines(), "\n"))
			}
		})
	}
}

var makeBroken = flag.String("chaos.mkbroken", "", "a good history for TestRecordBrokenBuilds to write testdata/ from")

// TestRecordBrokenBuilds writes testdata/: the good history and, from it,
// the histories the broken builds leave (see brokenBuilds).
func TestRecordBrokenBuilds(t *testing.T) {
	if *makeBroken == "" {
		t.Skip("no -chaos.mkbroken history given")
	}
	load := func() *History {
		h, err := LoadHistory(*makeBroken)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := load().Save(filepath.Join("testdata", "good.json.gz")); err != nil {
		t.Fatal(err)
	}

	// Delete before claim: the first accepted followup claimed in a turn of
	// its own loses that turn and its item.
	h := load()
	lost := false
	for _, op := range sortedOps(h) {
		if op.Kind != OpFollowup || op.Outcome != OutcomeOK || lost {
			continue
		}
		if dropTurnOf(h.Snapshot, op.Child, op.MessageID) {
			t.Logf("broken-delete-before-claim: op %d, message %s of %s", op.ID, op.MessageID, op.Child)
			lost = true
		}
	}
	if !lost {
		t.Fatal("no followup to lose")
	}
	if err := h.Save(filepath.Join("testdata", brokenBuilds[0].file)); err != nil {
		t.Fatal(err)
	}

	// Settle without CAS: the first completed one-shot run gets a second
	// settlement, HOST_LOST, published and written after the host's.
	h = load()
	settled := false
	for _, op := range sortedOps(h) {
		if op.Kind != OpRun || op.Outcome != OutcomeOK || len(op.Notices) != 1 || op.Notices[0].StopReason != string(protocol.StopCompleted) {
			continue
		}
		rec, ok := h.Snapshot.Runs[op.RunID]
		if !ok {
			continue
		}
		at := op.Notices[0].At + 900
		op.Notices = append(op.Notices, Notice{At: at, StopReason: string(protocol.StopError), ErrorCode: string(protocol.CodeHostLost)})
		rec.SettledAt, rec.SettledBy = at, "coordinator"
		rec.Result = &protocol.SubagentResult{Output: []protocol.ContentBlock{}, StopReason: protocol.StopError, ErrorCode: protocol.CodeHostLost,
			Diagnostic: "the host stopped heartbeating"}
		h.Snapshot.Runs[op.RunID] = rec
		t.Logf("broken-settle-without-cas: op %d, run %s", op.ID, op.RunID)
		settled = true
		break
	}
	if !settled {
		t.Fatal("no run to settle twice")
	}
	if err := h.Save(filepath.Join("testdata", brokenBuilds[1].file)); err != nil {
		t.Fatal(err)
	}

	// Answer without CAS: the first approval taken gets a second answer,
	// a deny by another grant, taken too; the record holds it.
	h = load()
	op := firstApproved(h, "")
	if op == nil {
		t.Fatal("no approval taken to answer twice")
	}
	at := op.Complete + 5
	second := &Op{ID: int64(len(h.Ops)) + 1, Client: "client-2", Kind: OpAnswer, Root: op.Root, Sender: "grant:client-2", Child: op.Child,
		RequestID: op.RequestID, Verb: protocol.AnswerDeny, AnswerID: op.AnswerID + "-2", AnswerState: protocol.RequestDenied,
		Invoke: op.Invoke + 1, Complete: at, Outcome: OutcomeOK}
	h.Ops = append(h.Ops, second)
	rec := h.Snapshot.Requests[op.RequestID]
	rec.State = protocol.RequestDenied
	rec.Answer = &protocol.RequestAnswer{State: protocol.RequestDenied, Reason: "denied by grant:client-2", By: protocol.Answerer{Kind: protocol.AnswererUser},
		At: at, ID: second.AnswerID}
	h.Snapshot.Requests[op.RequestID] = rec
	t.Logf("broken-answer-without-cas: op %d, request %s, answered again by op %d", op.ID, op.RequestID, second.ID)
	if err := h.Save(filepath.Join("testdata", brokenBuilds[2].file)); err != nil {
		t.Fatal(err)
	}

	// The tool runs twice: the first approved run_command that ran leaves
	// its token twice.
	h = load()
	op = firstApproved(h, "run_command")
	if op == nil {
		t.Fatal("no approved run_command")
	}
	tok := ""
	for _, ev := range h.Snapshot.Logs[op.Child] {
		var d protocol.ToolCallData
		if ev.Type == protocol.EvToolCall && ev.Decode(&d) == nil && protocol.RequestID(op.Child, d.CallID) == op.RequestID {
			tok = requestTokenRE.FindString(d.Arguments)
		}
	}
	if tok == "" || !strings.Contains(h.Workspace[RanFile], tok+"\n") {
		t.Fatalf("request %s: no token %q in %s", op.RequestID, tok, RanFile)
	}
	h.Workspace[RanFile] += tok + "\n"
	t.Logf("broken-tool-runs-twice: op %d, request %s, %s", op.ID, op.RequestID, tok)
	if err := h.Save(filepath.Join("testdata", brokenBuilds[3].file)); err != nil {
		t.Fatal(err)
	}

	// A model request without a reservation: the first step with reported
	// usage of a session whose every ledger charged exactly what its tree's
	// logs show is on none of them.
	h = load()
	session, step := budgetedStep(h, func(id string, rec protocol.BudgetRecord, logged sessionSpend) bool {
		used := rec.Charged.Add(rec.Reserved())
		return used.Tokens == logged.tokens && used.ModelRequests == logged.requests
	})
	if session == "" {
		t.Fatal("no budgeted step on ledgers charged exactly their logs")
	}
	for _, id := range h.Snapshot.Headers[session].Budgets {
		rec := h.Snapshot.Budgets[id]
		rec.Charged.Tokens -= step.Tokens
		rec.Charged.ModelRequests -= step.ModelRequests
		h.Snapshot.Budgets[id] = rec
	}
	t.Logf("broken-model-request-unreserved: session %s, a step of %+v on %v", session, step, h.Snapshot.Headers[session].Budgets)
	if err := h.Save(filepath.Join("testdata", brokenBuilds[4].file)); err != nil {
		t.Fatal(err)
	}

	// A reservation charged twice: a ledger at its limit of model
	// requests (else tool calls) is charged one of its tree's steps (else
	// a step's tool call) again.
	h = load()
	var ledger string
	for _, id := range sortedKeys(h.Snapshot.Budgets) {
		rec := h.Snapshot.Budgets[id]
		used := rec.Charged.Add(rec.Reserved())
		if l := rec.Limits; (l.ModelRequests > 0 && used.ModelRequests >= l.ModelRequests) || (l.ToolCalls > 0 && used.ToolCalls >= l.ToolCalls) {
			ledger = id
			break
		}
	}
	if ledger == "" {
		t.Fatal("no ledger at its limit of model requests or tool calls")
	}
	lrec := h.Snapshot.Budgets[ledger]
	again := protocol.BudgetSpend{ToolCalls: 1}
	if l := lrec.Limits; l.ModelRequests > 0 && lrec.Charged.Add(lrec.Reserved()).ModelRequests >= l.ModelRequests {
		_, again = budgetedStep(h, func(id string, _ protocol.BudgetRecord, _ sessionSpend) bool { return id == ledger })
		again.ModelRequests = 1
	}
	lrec.Charged = lrec.Charged.Add(again)
	h.Snapshot.Budgets[ledger] = lrec
	t.Logf("broken-reservation-charged-twice: budget %s (limits %+v) charged %+v again", ledger, lrec.Limits, again)
	if err := h.Save(filepath.Join("testdata", brokenBuilds[5].file)); err != nil {
		t.Fatal(err)
	}

	// Continued twice: the first completed one-shot run of an unbudgeted,
	// unseeded child whose last step called no tool is taken over before
	// that step, and the step is logged twice.
	h = load()
	continued := ""
	for _, op := range sortedOps(h) {
		if op.Kind != OpRun || op.Outcome != OutcomeOK || len(op.Notices) != 1 || op.Notices[0].StopReason != string(protocol.StopCompleted) {
			continue
		}
		rec, ok := h.Snapshot.Runs[op.RunID]
		hd := h.Snapshot.Headers[rec.ChildID]
		if !ok || rec.Mode != protocol.ModeOneShot || len(hd.Budgets) > 0 || hd.SeedLength > 0 {
			continue
		}
		turn, step, at := lastStep(h.Snapshot.Logs[rec.ChildID])
		if at < 0 || !logStepAgain(h.Snapshot, rec.ChildID, turn, step) {
			continue
		}
		ev, err := protocol.NewEvent(protocol.EvAgentTakeover, h.Snapshot.Logs[rec.ChildID][at].Time-1,
			protocol.TakeoverData{HostID: rec.HostID, By: "coordinator", Epoch: 2})
		if err != nil {
			t.Fatal(err)
		}
		evs := h.Snapshot.Logs[rec.ChildID]
		evs = append(evs[:at:at], append([]Event{{Type: ev.Type, Time: ev.Time, Data: ev.Data}}, evs[at:]...)...)
		for i := range evs {
			evs[i].Seq = int64(i)
		}
		h.Snapshot.Logs[rec.ChildID] = evs
		rec.Takeovers = 1
		h.Snapshot.Runs[op.RunID] = rec
		for i, le := range h.Snapshot.Lifecycle {
			if le.RunID == op.RunID && le.Type == protocol.LifecycleEnd {
				h.Snapshot.Lifecycle[i].Takeovers = 1
			}
		}
		continued = fmt.Sprintf("op %d, run %s, turn %d step %d", op.ID, op.RunID, turn, step)
		break
	}
	if continued == "" {
		t.Fatal("no one-shot run whose last step called no tool")
	}
	t.Logf("broken-continues-twice: %s", continued)
	if err := h.Save(filepath.Join("testdata", brokenBuilds[6].file)); err != nil {
		t.Fatal(err)
	}
}

// lastStep is the turn and step of a log's last step/start and its index
// (-1 when it has none).
func lastStep(evs []Event) (turn, step int64, at int) {
	for i := len(evs) - 1; i >= 0; i-- {
		var d protocol.StepData
		if evs[i].Type == protocol.EvStepStart && evs[i].Decode(&d) == nil {
			return d.Turn, d.Step, i
		}
	}
	return 0, 0, -1
}

// budgetedStep finds, in session order, the first step with reported
// usage of a session every ledger of which ok accepts (given what its
// tree's logs show): that session and the step's spend (its tokens, one
// model request).
func budgetedStep(h *History, ok func(id string, rec protocol.BudgetRecord, logged sessionSpend) bool) (string, protocol.BudgetSpend) {
	logged := map[string]sessionSpend{}
	for _, id := range sortedKeys(h.Snapshot.Headers) {
		hd := h.Snapshot.Headers[id]
		sp := (&checker{}).sessionSpend(&session{header: hd, events: h.Snapshot.Logs[id]})
		for _, b := range hd.Budgets {
			t := logged[b]
			t.tokens, t.requests = t.tokens+sp.tokens, t.requests+sp.requests
			logged[b] = t
		}
	}
	for _, id := range sortedKeys(h.Snapshot.Headers) {
		hd := h.Snapshot.Headers[id]
		if len(hd.Budgets) == 0 {
			continue
		}
		fits := true
		for _, b := range hd.Budgets {
			rec, has := h.Snapshot.Budgets[b]
			fits = fits && has && ok(b, rec, logged[b])
		}
		if !fits {
			continue
		}
		for _, ev := range h.Snapshot.Logs[id] {
			var d protocol.AssistantMessageData
			if ev.Type == protocol.EvAssistantMessage && ev.Decode(&d) == nil && d.Usage != nil && !d.Usage.Unknown && d.Usage.InputTokens+d.Usage.OutputTokens > 0 {
				return id, protocol.BudgetSpend{Tokens: d.Usage.InputTokens + d.Usage.OutputTokens, ModelRequests: 1}
			}
		}
	}
	return "", protocol.BudgetSpend{}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// firstApproved is the first answer op of h whose approval was taken and
// whose request's tool (any, when tool is "") ran after it in its log.
func firstApproved(h *History, tool string) *Op {
	for _, op := range sortedOps(h) {
		if op.Kind != OpAnswer || op.Outcome != OutcomeOK || op.AnswerState != protocol.RequestApproved {
			continue
		}
		rec, ok := h.Snapshot.Requests[op.RequestID]
		if !ok || rec.Answer == nil || rec.Answer.ID != op.AnswerID || (tool != "" && rec.Tool != tool) {
			continue
		}
		ran := false
		for _, ev := range h.Snapshot.Logs[rec.SessionID] {
			var d protocol.ToolResultData
			if ev.Type == protocol.EvToolResult && ev.Decode(&d) == nil && d.CallID == rec.CallID && !d.IsError {
				ran = true
			}
		}
		if ran {
			op.Child = rec.SessionID
			return op
		}
	}
	return nil
}

func sortedOps(h *History) []*Op {
	ops := append([]*Op(nil), h.Ops...)
	sort.Slice(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
	return ops
}

// dropTurnOf removes from session's log the turn that claimed messageID
// (and any enqueue of it), renumbering the events after it, when that turn
// claimed nothing else. It reports whether it did.
func dropTurnOf(s *Snapshot, session, messageID string) bool {
	evs := s.Logs[session]
	start, end := -1, -1
	for i, ev := range evs {
		switch ev.Type {
		case protocol.EvTurnStart:
			start = i
		case protocol.EvInboxDequeue:
			var d protocol.InboxDequeueData
			if ev.Decode(&d) == nil && d.MessageID == messageID && start >= 0 {
				for j := i; j < len(evs); j++ {
					if evs[j].Type == protocol.EvTurnEnd {
						end = j
						break
					}
				}
			}
		}
		if end >= 0 {
			break
		}
	}
	if start < 0 || end < 0 {
		return false
	}
	claims := 0
	for _, ev := range evs[start : end+1] {
		if ev.Type == protocol.EvInboxDequeue {
			claims++
		}
	}
	if claims != 1 {
		return false
	}
	var out []Event
	for i, ev := range evs {
		if i >= start && i <= end {
			continue
		}
		if ev.Type == protocol.EvInboxEnqueue {
			var d protocol.InboxEnqueueData
			if ev.Decode(&d) == nil && d.MessageID == messageID {
				continue
			}
		}
		ev.Seq = int64(len(out))
		out = append(out, ev)
	}
	s.Logs[session] = out
	return true
}

// logStepAgain logs step of turn in session's log a second time, as a
// second host continuing the same turn would: a copy of the step's events
// (its step/start through its step/end) right after them, a millisecond
// later, the events after it renumbered. The step must have no tool calls
// (a call id logged twice would not replay, I7). It reports whether it
// found such a step.
func logStepAgain(s *Snapshot, session string, turn, step int64) bool {
	evs := s.Logs[session]
	start, end := -1, -1
	for i, ev := range evs {
		var d protocol.StepData
		switch ev.Type {
		case protocol.EvStepStart:
			if ev.Decode(&d) == nil && d.Turn == turn && d.Step == step {
				start = i
			}
		case protocol.EvStepEnd:
			if start >= 0 && end < 0 && ev.Decode(&d) == nil && d.Turn == turn && d.Step == step {
				end = i
			}
		case protocol.EvToolCall:
			if start >= 0 && end < 0 {
				return false
			}
		}
	}
	if start < 0 || end < 0 {
		return false
	}
	shift := evs[end].Time - evs[start].Time + 1
	out := append([]Event(nil), evs[:end+1]...)
	for _, ev := range evs[start : end+1] {
		ev.Time += shift
		out = append(out, ev)
	}
	out = append(out, evs[end+1:]...)
	for i := range out {
		out[i].Seq = int64(i)
	}
	s.Logs[session] = out
	return true
}
