package chaos

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// I10 (shared/RELIABILITY.md; issue 33): every request is answered at most
// once, an answered request resumes exactly one turn, none is lost.
//
// The checker reads each session's log for its requests (request/open,
// request/answer, and the parked call's tool/call and tool/result), the
// request records of the snapshot, the workload's answers (OpAnswer) and
// agents' answer_request calls, and the workspace the approved calls
// wrote in. A request opened in a log ends one of three ways, and only so:
//
//   - answered: exactly one request/answer for it, in the turn that opened
//     it, after the open, then exactly one tool/result of its call in that
//     turn (none before the answer; a budget pause, kind budget, parks on
//     no call and has none); what the child logged is what the
//     record holds (state and who); a call that was not approved did not
//     run (its result is an error);
//   - closed while parked: no request/answer, and its call's only result
//     is an error (a budget pause, which parks on no call: none) in a turn
//     that did not complete (the turn was aborted
//     while the call waited, or closed interrupted after its host died:
//     docs/protocol.md §5.21, "The child's side");
//   - still parked: no request/answer and no result, its turn still open,
//     and its record pending (or answered while its session runs nothing:
//     a host lost with the turn not yet closed). A record still pending
//     past its deadline plus the grace while its session still runs is
//     stuck; an answered record whose session still runs without logging
//     the answer is a lost answer.
//
// A request with no record at all is lost. Each request has at most one
// accepted answer (an OpAnswer answered ok, or an answer_request call that
// approves, denies or answers and whose result is no error; pass_up answers
// nothing); an accepted answer is the record's (its answer.id,
// or its agent), and every later answer is refused. An approved call's side
// effect (a line of RanFile, a file of WriteDir) appears at most once and
// only when the log holds its approval.

// reqLog is one request as its session's log tells it.
type reqLog struct {
	id, session, callID, kind, tool string
	turn, openSeq, openAt           int64
	answers                         []reqAnswer
}

type reqAnswer struct {
	seq, at, turn int64
	d             protocol.RequestAnswerData
}

// callLog is one tool call of a session's log and its results.
type callLog struct {
	name, args string
	turn, at   int64
	results    []callResult
}

type callResult struct {
	seq, at, turn int64
	isError       bool
}

// agentAnswer is an answer_request call an agent made whose result was no
// error: its answer was taken.
type agentAnswer struct {
	session string
	at      int64
}

// sessionRequests is what checkRequests reads of one log.
type sessionRequests struct {
	calls    map[string]*callLog
	turnEnds map[int64]string // turn -> its end kind
	// endCodes are each turn's ends' error codes, one per turn/end logged
	// (a turn resumed twice ends twice).
	endCodes map[int64][]protocol.Code
	// opens are the log positions (seq) of each turn's request/opens.
	opens map[int64][]int64
}

func (c *checker) readRequests() (map[string]*reqLog, map[string]*sessionRequests, map[string][]agentAnswer) {
	reqs := map[string]*reqLog{}
	logs := map[string]*sessionRequests{}
	agents := map[string][]agentAnswer{}
	for id, s := range c.sessions {
		sr := &sessionRequests{calls: map[string]*callLog{}, turnEnds: map[int64]string{},
			endCodes: map[int64][]protocol.Code{}, opens: map[int64][]int64{}}
		logs[id] = sr
		var cur int64 // the open turn, 0 between turns
		for _, ev := range s.events {
			switch ev.Type {
			case protocol.EvTurnStart:
				var d protocol.TurnData
				if ev.Decode(&d) == nil {
					cur = d.Turn
				}
			case protocol.EvTurnEnd:
				var d protocol.TurnEndData
				if ev.Decode(&d) == nil {
					sr.turnEnds[d.Turn] = d.Reason.Kind
					sr.endCodes[d.Turn] = append(sr.endCodes[d.Turn], d.Reason.Code)
				}
				cur = 0
			case protocol.EvToolCall:
				var d protocol.ToolCallData
				if ev.Decode(&d) == nil {
					sr.calls[d.CallID] = &callLog{name: d.Name, args: d.Arguments, turn: d.Turn, at: ev.Time}
				}
			case protocol.EvToolResult:
				var d protocol.ToolResultData
				if ev.Decode(&d) != nil {
					continue
				}
				call := sr.calls[d.CallID]
				if call == nil {
					continue // I7 judges a result without its call
				}
				call.results = append(call.results, callResult{seq: ev.Seq, at: ev.Time, turn: d.Turn, isError: d.IsError})
				if d.Name == protocol.ToolAnswerRequest && !d.IsError {
					var a struct {
						RequestID string `json:"requestId"`
						Decision  string `json:"decision"`
					}
					// Only an answer's verb answers (a request passed up
					// is still pending).
					err := json.Unmarshal([]byte(call.args), &a)
					answers := a.Decision == protocol.AnswerApprove || a.Decision == protocol.AnswerDeny || a.Decision == protocol.AnswerAnswer
					if err == nil && a.RequestID != "" && answers {
						agents[a.RequestID] = append(agents[a.RequestID], agentAnswer{session: id, at: ev.Time})
					}
				}
			case protocol.EvRequestOpen:
				var d protocol.RequestOpenData
				if ev.Decode(&d) == nil {
					sr.opens[d.Turn] = append(sr.opens[d.Turn], ev.Seq)
				}
				if ev.Decode(&d) == nil && reqs[d.RequestID] == nil {
					reqs[d.RequestID] = &reqLog{id: d.RequestID, session: id, callID: d.CallID, kind: d.Kind, tool: d.Tool,
						turn: d.Turn, openSeq: ev.Seq, openAt: ev.Time}
				}
			case protocol.EvRequestAnswer:
				var d protocol.RequestAnswerData
				if ev.Decode(&d) != nil {
					continue
				}
				if r := reqs[d.RequestID]; r != nil && r.session == id {
					r.answers = append(r.answers, reqAnswer{seq: ev.Seq, at: ev.Time, turn: cur, d: d})
				} else {
					c.fail("I10", ev.Time, "%s logged request/answer of %s with no request/open before it", id, d.RequestID)
				}
			}
		}
	}
	return reqs, logs, agents
}

// running reports whether a run or epoch record of session id is not settled.
func (c *checker) running(id string) bool {
	if s := c.sessions[id]; s != nil {
		for _, r := range s.runs {
			if r.State != protocol.RunSettled {
				return true
			}
		}
	}
	return false
}

func (c *checker) checkRequests() {
	reqs, logs, agents := c.readRequests()
	ids := make([]string, 0, len(reqs))
	for id := range reqs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		c.checkRequestLog(reqs[id], logs[reqs[id].session])
	}
	c.checkAnswers(reqs, agents)
	c.checkEffects(reqs, logs)
}

// checkRequestLog judges how a request opened in a log ended.
func (c *checker) checkRequestLog(r *reqLog, sr *sessionRequests) {
	c.sum.Requests++
	c.checked("I10", r.openAt)
	rec, hasRec := c.snap.Requests[r.id]
	call := sr.calls[r.callID]
	var results []callResult
	if call != nil {
		for _, res := range call.results {
			if res.seq > r.openSeq {
				results = append(results, res)
			}
		}
	}
	switch len(r.answers) {
	case 0:
		c.requestUnanswered(r, sr, rec, hasRec, results)
	case 1:
		c.requestAnswered(r, sr, rec, hasRec, results)
	default:
		c.sum.Duplicated++
		c.fail("I10", r.openAt, "request %s of %s (call %s, opened at %s) was answered %d times in its log", r.id, r.session, r.callID, c.at(r.openAt), len(r.answers))
	}
}

// requestAnswered judges a request with one request/answer in its log.
func (c *checker) requestAnswered(r *reqLog, sr *sessionRequests, rec protocol.RequestRecord, hasRec bool, results []callResult) {
	a := r.answers[0]
	if a.d.State == protocol.RequestTimedOut {
		c.sum.RequestsTimedOut++
	} else {
		c.sum.RequestsAnswered++
	}
	if a.turn != r.turn {
		c.fail("I10", a.at, "request %s of %s was opened in turn %d and answered in turn %d: a second turn resumed", r.id, r.session, r.turn, a.turn)
	}
	if r.kind == protocol.RequestBudget {
		// A budget pause parks the turn on no call: there is no result
		// to judge, but how its turn went on (budgetPauseEnded).
		c.requestRecordHolds(r, a, rec, hasRec)
		c.budgetPauseEnded(r, a, sr)
		return
	}
	var before, after []callResult
	for _, res := range results {
		if res.seq < a.seq {
			before = append(before, res)
		} else {
			after = append(after, res)
		}
	}
	if len(before) > 0 {
		c.fail("I10", before[0].at, "request %s of %s: its call %s has a tool/result before its answer", r.id, r.session, r.callID)
	}
	switch {
	case len(after) == 0 && sr.turnEnds[r.turn] == "":
		c.sum.Stuck++
		c.fail("I10", a.at, "request %s of %s was answered (%s) at %s, and its call %s never resumed", r.id, r.session, a.d.State, c.at(a.at), r.callID)
	case len(after) != 1:
		c.sum.Duplicated++
		c.fail("I10", a.at, "request %s of %s was answered (%s), and its call %s has %d results after the answer", r.id, r.session, a.d.State, r.callID, len(after))
	case after[0].turn != r.turn:
		c.fail("I10", after[0].at, "request %s of %s: its call %s's result is in turn %d, not its turn %d", r.id, r.session, r.callID, after[0].turn, r.turn)
	case r.kind == protocol.RequestApproval && a.d.State != protocol.RequestApproved && !after[0].isError:
		c.fail("I10", after[0].at, "request %s of %s was %s, yet its call %s (%s) ran", r.id, r.session, a.d.State, r.callID, r.tool)
	}
	c.requestRecordHolds(r, a, rec, hasRec)
}

// budgetPauseEnded judges the turn of a budget pause answered in its log
// (docs/protocol.md §5.5, "Pause and raise"): approved (a raise, or an
// approval) the same turn goes on, and ends once, or pauses again on a
// new request; denied or timed out it ends error BUDGET_EXHAUSTED, unless
// something else ended it first (aborted by a dispose or an interrupt,
// interrupted after its host died), and never completed. A turn still
// open once its session runs nothing is left for the next takeover; one
// still open while its session runs, past the answer plus the grace, and
// not paused again, is stuck.
func (c *checker) budgetPauseEnded(r *reqLog, a reqAnswer, sr *sessionRequests) {
	ends := sr.endCodes[r.turn]
	if len(ends) > 1 {
		c.sum.Duplicated++
		c.fail("I10", a.at, "budget request %s of %s was answered (%s), and its turn %d ended %d times", r.id, r.session, a.d.State, r.turn, len(ends))
		return
	}
	end := sr.turnEnds[r.turn]
	if a.d.State == protocol.RequestApproved {
		c.sum.BudgetPausesApproved++
		pausedAgain := false
		for _, seq := range sr.opens[r.turn] {
			pausedAgain = pausedAgain || seq > a.seq
		}
		if end == "" && !pausedAgain && c.running(r.session) && c.faultAware(a.at, c.h.Bounds.Grace) < c.snap.TakenAt {
			c.sum.Stuck++
			c.fail("I10", a.at, "budget request %s of %s was approved at %s, and its turn %d neither ended nor paused again", r.id, r.session, c.at(a.at), r.turn)
		}
		return
	}
	c.sum.BudgetPausesDenied++
	switch {
	case end == protocol.TurnCompleted:
		c.fail("I10", a.at, "budget request %s of %s was %s at %s, yet its turn %d completed", r.id, r.session, a.d.State, c.at(a.at), r.turn)
	case end == protocol.TurnError && ends[0] != protocol.CodeBudgetExhausted:
		c.fail("I10", a.at, "budget request %s of %s was %s at %s, and its turn %d ended error %s, not %s", r.id, r.session, a.d.State, c.at(a.at), r.turn, ends[0], protocol.CodeBudgetExhausted)
	case end == "" && c.running(r.session) && c.faultAware(a.at, c.h.Bounds.Grace) < c.snap.TakenAt:
		c.sum.Stuck++
		c.fail("I10", a.at, "budget request %s of %s was %s at %s, and its turn %d never ended", r.id, r.session, a.d.State, c.at(a.at), r.turn)
	}
}

// requestRecordHolds: what the child logged of its answer is what the
// record holds.
func (c *checker) requestRecordHolds(r *reqLog, a reqAnswer, rec protocol.RequestRecord, hasRec bool) {
	if !hasRec {
		return
	}
	if rec.State != a.d.State || rec.Answer == nil || rec.Answer.By != a.d.By {
		c.sum.Duplicated++
		by := "no one"
		if rec.Answer != nil {
			by = answererText(rec.Answer.By)
		}
		c.fail("I10", a.at, "request %s of %s: the child went on with %s by %s, but the record holds %s by %s: two answers",
			r.id, r.session, a.d.State, answererText(a.d.By), rec.State, by)
	}
}

// requestUnanswered judges a request with no request/answer in its log.
func (c *checker) requestUnanswered(r *reqLog, sr *sessionRequests, rec protocol.RequestRecord, hasRec bool, results []callResult) {
	if len(results) > 0 {
		res := results[0]
		switch end := sr.turnEnds[r.turn]; {
		case !res.isError:
			c.fail("I10", res.at, "request %s of %s was never answered in its log, yet its call %s (%s) has a result that is no error", r.id, r.session, r.callID, r.tool)
		case end == "" || end == protocol.TurnCompleted:
			c.fail("I10", res.at, "request %s of %s was never answered in its log, yet its turn %d went on (%s)", r.id, r.session, r.turn, orOpen(end))
		default:
			c.sum.RequestsClosed++ // closed while parked: aborted, or interrupted after its host died
		}
		return
	}
	if end := sr.turnEnds[r.turn]; r.kind == protocol.RequestBudget && end != "" {
		// A budget pause closed with its turn (aborted, or interrupted
		// after its host died): no call to give an error result.
		if end == protocol.TurnCompleted {
			c.fail("I10", r.openAt, "budget request %s of %s was never answered in its log, yet its turn %d completed", r.id, r.session, r.turn)
		} else {
			c.sum.RequestsClosed++
		}
		return
	}
	switch {
	case !hasRec:
		c.sum.Lost++
		c.fail("I10", r.openAt, "request %s of %s (call %s) was logged open at %s, but has no record: lost", r.id, r.session, r.callID, c.at(r.openAt))
	case rec.State == protocol.RequestPending && c.running(r.session) && c.faultAware(rec.Deadline, c.h.Bounds.Grace) < c.snap.TakenAt:
		c.sum.Stuck++
		c.fail("I10", r.openAt, "request %s of %s is still pending, its call parked, past its deadline %s", r.id, r.session, c.at(rec.Deadline))
	case rec.State == protocol.RequestPending:
		c.sum.RequestsPending++
	case c.running(r.session):
		c.sum.Lost++
		c.fail("I10", r.openAt, "request %s of %s was %s by %s at %s, but its parked call %s never logged the answer: lost",
			r.id, r.session, rec.State, answererText(rec.Answer.By), c.at(rec.Answer.At), r.callID)
	default:
		// Answered after its host was lost: nothing runs it, the turn is
		// closed interrupted when the session is next taken over.
		c.sum.RequestsClosed++
	}
}

func orOpen(kind string) string {
	if kind == "" {
		return "still open"
	}
	return kind
}

func answererText(a protocol.Answerer) string {
	switch {
	case a.SessionID != "":
		return a.Kind + " " + a.SessionID
	case a.User != "":
		return a.Kind + " " + a.User
	}
	return a.Kind
}

// checkAnswers: at most one answer of each request is taken, and the one
// taken is the record's; a second one is refused.
func (c *checker) checkAnswers(reqs map[string]*reqLog, agents map[string][]agentAnswer) {
	byReq := map[string][]*Op{}
	raised := map[string][]*Op{}
	for _, op := range c.h.Ops {
		if op.Kind == OpAnswer && op.RequestID != "" {
			byReq[op.RequestID] = append(byReq[op.RequestID], op)
		}
		if op.Kind == OpRaise && op.Outcome == OutcomeOK {
			c.sum.BudgetRaises++
			for _, id := range op.Targets {
				raised[id] = append(raised[id], op)
				if byReq[id] == nil {
					byReq[id] = nil
				}
			}
		}
	}
	for id := range agents {
		if byReq[id] == nil {
			byReq[id] = nil
		}
	}
	for id, ops := range byReq {
		rec, hasRec := c.snap.Requests[id]
		var taken []string
		for _, op := range ops {
			c.checked("I10", op.Invoke)
			switch {
			case op.Outcome == OutcomeOK:
				c.sum.Answers++
				taken = append(taken, fmt.Sprintf("op %d (%s)", op.ID, op.Sender))
				if hasRec && (rec.Answer == nil || rec.Answer.ID != op.AnswerID) {
					c.fail("I10", op.Complete, "op %d: %s's answer %s (%s, id %s) to request %s was taken, but the record holds %s",
						op.ID, op.Sender, op.Verb, op.AnswerState, op.AnswerID, id, recordAnswer(rec))
				}
			case op.Code == string(protocol.CodeAlreadyAnswered):
				c.sum.AnswersRefused++
			}
		}
		for _, op := range raised[id] {
			// A raise answers each budget request paused on its ledger
			// approved, by its raiser (docs/protocol.md §5.5).
			c.checked("I10", op.Complete)
			c.sum.Answers++
			taken = append(taken, fmt.Sprintf("raise op %d (%s)", op.ID, op.Sender))
			if hasRec && (rec.Answer == nil || rec.State != protocol.RequestApproved) {
				c.fail("I10", op.Complete, "op %d: %s's raise of %s answered request %s, but the record holds %s", op.ID, op.Sender, op.Child, id, recordAnswer(rec))
			}
		}
		for _, a := range agents[id] {
			c.checked("I10", a.at)
			c.sum.Answers++
			taken = append(taken, "agent "+a.session)
			if hasRec && (rec.Answer == nil || rec.Answer.By.Kind != protocol.AnswererAgent || rec.Answer.By.SessionID != a.session) {
				c.fail("I10", a.at, "agent %s's answer_request to request %s was taken, but the record holds %s", a.session, id, recordAnswer(rec))
			}
		}
		if len(taken) > 1 {
			c.sum.Duplicated++
			at := c.snap.TakenAt
			if r := reqs[id]; r != nil {
				at = r.openAt
			}
			c.fail("I10", at, "request %s: %d answers were taken (%s); the first must win and the others be refused ALREADY_ANSWERED",
				id, len(taken), strings.Join(taken, ", "))
		}
	}
}

func recordAnswer(rec protocol.RequestRecord) string {
	if rec.Answer == nil {
		return rec.State + " and no answer"
	}
	return rec.State + " by " + answererText(rec.Answer.By) + " (id " + rec.Answer.ID + ")"
}

// checkEffects: each workload call that parks on a request and has a side
// effect (run_command appending its token to RanFile, write_file of
// WriteDir/<token>.txt) left it at most once, only with its approval in
// the log, and whenever its result says it ran.
func (c *checker) checkEffects(reqs map[string]*reqLog, logs map[string]*sessionRequests) {
	if c.h.Workspace == nil {
		return
	}
	ran := map[string]int{}
	for _, line := range strings.Split(c.h.Workspace[RanFile], "\n") {
		if line = strings.TrimSpace(line); line != "" {
			ran[line]++
		}
	}
	sessions := make([]string, 0, len(logs))
	for id := range logs {
		sessions = append(sessions, id)
	}
	sort.Strings(sessions)
	for _, sid := range sessions {
		for callID, call := range logs[sid].calls {
			if call.name != "run_command" && call.name != "write_file" {
				continue
			}
			tok := requestTokenRE.FindString(call.args)
			if tok == "" {
				continue
			}
			c.checked("I10", call.at)
			times := ran[tok]
			if call.name == "write_file" {
				content, ok := c.h.Workspace[WriteDir+"/"+tok+".txt"]
				times = 0
				if ok {
					times = 1
				}
				if ok && content != tok {
					c.fail("I10", call.at, "%s's write_file %s (call %s) left %q, not %q", sid, tok, callID, content, tok)
				}
			}
			approved := false
			if r := reqs[protocol.RequestID(sid, callID)]; r != nil && len(r.answers) > 0 {
				approved = r.answers[0].d.State == protocol.RequestApproved
			}
			ok := false
			for _, res := range call.results {
				ok = ok || !res.isError
			}
			switch {
			case times > 1:
				c.sum.Duplicated++
				c.fail("I10", call.at, "%s's %s %s (call %s) ran %d times", sid, call.name, tok, callID, times)
			case times == 1 && !approved:
				c.fail("I10", call.at, "%s's %s %s (call %s) ran without an approval in its log", sid, call.name, tok, callID)
			case times == 0 && ok:
				c.fail("I10", call.at, "%s's %s %s (call %s) has a result saying it ran, yet left nothing in the workspace", sid, call.name, tok, callID)
			}
		}
	}
}
