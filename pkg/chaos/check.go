package chaos

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/pkg/protocol"
)

// The invariants of shared/RELIABILITY.md, in the order the report prints them.
var invariantTitles = []struct{ name, title string }{
	{"I1", "every accepted message appears in its child's log exactly once"},
	{"I2", "no message becomes two turns, no run settles twice"},
	{"I3", "messages from one sender to one child keep their order"},
	{"I4", "nothing from a sender without authority reaches an inbox or a log"},
	{"I5", "descendants of a closed root or disposed run end within the bound"},
	{"I6", "every child is terminal or resumable; no record stays running"},
	{"I7", "lifecycle events pair up per run; every log replays balanced"},
	{"I8", "depth and live-children limits are never exceeded"},
	{"I10", "each request is answered at most once, an answered one resumes exactly one turn, none is lost"},
	{"I11", "budgets hold over their trees, within the in-flight bound; each reservation is charged or given back once"},
	{"I12", "a continued turn redoes nothing its log holds: no step recorded twice, no tool result without its call"},
	{"L1", "once faults heal, every accepted message is processed within the bound"},
}

// examplesMax bounds the violations a verdict lists.
const examplesMax = 8

// Verdict is one invariant's result.
type Verdict struct {
	Name       string   `json:"name"`
	Title      string   `json:"title"`
	Checked    int      `json:"checked"`
	Violations int      `json:"violations"`
	Examples   []string `json:"examples,omitempty"`
}

// Holds reports whether the invariant held.
func (v Verdict) Holds() bool { return v.Violations == 0 }

// Summary counts what a run did and what went wrong.
type Summary struct {
	Seed            int64                     `json:"seed"`
	Ops             int                       `json:"ops"`
	Accepted        int                       `json:"accepted"`
	Messages        int                       `json:"messages"`
	Unknown         int                       `json:"unknown"`
	Lost            int                       `json:"lost"`
	Discarded       int                       `json:"discarded"`
	Duplicated      int                       `json:"duplicated"`
	Stuck           int                       `json:"stuck"`
	LimitBreaches   int                       `json:"limitBreaches"`
	LongestRecovery time.Duration             `json:"longestRecovery"`
	RecoveryAfter   string                    `json:"recoveryAfter,omitempty"`
	Faults          map[string]int            `json:"faults"`
	ByKind          map[string]map[string]int `json:"byKind"`
	// Requests opened in the logs and how they ended (I10): answered
	// (approved, denied, a question's answer), timed out, closed while
	// parked (the turn aborted, or its host lost), left pending; Answers
	// taken (the workload's and agents'), AnswersRefused ALREADY_ANSWERED.
	Requests         int `json:"requests,omitempty"`
	RequestsAnswered int `json:"requestsAnswered,omitempty"`
	RequestsTimedOut int `json:"requestsTimedOut,omitempty"`
	RequestsClosed   int `json:"requestsClosed,omitempty"`
	RequestsPending  int `json:"requestsPending,omitempty"`
	Answers          int `json:"answers,omitempty"`
	AnswersRefused   int `json:"answersRefused,omitempty"`
	// Budget ledgers (I11): how many, limits reached (a named limit whose
	// ledger is charged and reserved up to it), turns of their trees that
	// ended BUDGET_EXHAUSTED, tokens over their trees' logs and charged,
	// reservations in flight at the end (of them, of settled runs: a dead
	// host's or a lost settlement's, charged by the next coordinator that
	// finds the ledger short), budgeted runs and epochs settled HOST_LOST
	// (their hosts' reservations charged in full), and breaches found.
	Budgets                int   `json:"budgets,omitempty"`
	BudgetLimitsReached    int   `json:"budgetLimitsReached,omitempty"`
	BudgetTurnsExhausted   int   `json:"budgetTurnsExhausted,omitempty"`
	BudgetTokensLogged     int64 `json:"budgetTokensLogged,omitempty"`
	BudgetTokensCharged    int64 `json:"budgetTokensCharged,omitempty"`
	BudgetReservations     int   `json:"budgetReservations,omitempty"`
	BudgetReservationsLeft int   `json:"budgetReservationsLeft,omitempty"`
	BudgetRunsHostLost     int   `json:"budgetRunsHostLost,omitempty"`
	BudgetBreaches         int   `json:"budgetBreaches,omitempty"`
	// Continuations (I12): one-shot runs continued on another worker
	// after their host died and settled there (not HOST_LOST), runs ended
	// HOST_LOST after a takeover (no instance took them within the bound,
	// or past the takeovers' bound), the takeovers of both, and the calls
	// a continued turn gave the interrupted result (a call logged without
	// its result whose tool is not idempotent).
	Continued         int `json:"continued,omitempty"`
	ContinuedHostLost int `json:"continuedHostLost,omitempty"`
	Takeovers         int `json:"takeovers,omitempty"`
	CallsInterrupted  int `json:"callsInterrupted,omitempty"`
	// Budget pauses answered in their logs (I10): approved (a raise, or
	// an approval) and denied or timed out; raises accepted.
	BudgetPausesApproved int `json:"budgetPausesApproved,omitempty"`
	BudgetPausesDenied   int `json:"budgetPausesDenied,omitempty"`
	BudgetRaises         int `json:"budgetRaises,omitempty"`
}

// Report is the checker's verdict on a History.
type Report struct {
	Verdicts []Verdict `json:"verdicts"`
	Summary  Summary   `json:"summary"`
	// ByClass attributes every check to the fault classes whose windows
	// held it (NoFault for none): class -> invariant -> cell.
	ByClass map[string]map[string]*Cell `json:"byClass"`
	// Recovery is, per fault class, the longest wait after one of its
	// faults healed (see Summary.LongestRecovery).
	Recovery map[string]time.Duration `json:"recovery"`
}

// Cell counts the checks of one invariant in one fault class's windows.
type Cell struct {
	Checked    int `json:"checked"`
	Violations int `json:"violations"`
}

// OK reports whether every invariant held.
func (r *Report) OK() bool {
	for _, v := range r.Verdicts {
		if !v.Holds() {
			return false
		}
	}
	return true
}

// Verdict returns the verdict of invariant name ("I1" ... "L1").
func (r *Report) Verdict(name string) Verdict {
	for _, v := range r.Verdicts {
		if v.Name == name {
			return v
		}
	}
	return Verdict{Name: name}
}

// Lines renders the report: one line per invariant (and its examples), then
// the summary.
func (r *Report) Lines() []string {
	var out []string
	for _, v := range r.Verdicts {
		state := "holds"
		if !v.Holds() {
			state = fmt.Sprintf("VIOLATED %d times", v.Violations)
		}
		out = append(out, fmt.Sprintf("%s %s: %s (%d checked)", v.Name, state, v.Title, v.Checked))
		for _, e := range v.Examples {
			out = append(out, "    "+e)
		}
	}
	s := r.Summary
	out = append(out, fmt.Sprintf("seed %d: %d operations, %d accepted (%d messages, %d discarded by a cascade), %d unknown; lost %d, duplicated %d, stuck %d, limit breaches %d; longest recovery %s%s",
		s.Seed, s.Ops, s.Accepted, s.Messages, s.Discarded, s.Unknown, s.Lost, s.Duplicated, s.Stuck, s.LimitBreaches,
		s.LongestRecovery.Round(time.Millisecond), after(s.RecoveryAfter)))
	var classes []string
	for c, n := range s.Faults {
		classes = append(classes, fmt.Sprintf("%s×%d", c, n))
	}
	sort.Strings(classes)
	out = append(out, fmt.Sprintf("requests: %d opened in the logs: %d answered, %d timed out, %d closed while parked, %d left pending; %d answers taken, %d refused ALREADY_ANSWERED",
		s.Requests, s.RequestsAnswered, s.RequestsTimedOut, s.RequestsClosed, s.RequestsPending, s.Answers, s.AnswersRefused))
	out = append(out, s.budgetLine())
	out = append(out, s.continuationLine())
	out = append(out, "faults: "+strings.Join(classes, ", "))
	var kinds []string
	for k, outcomes := range s.ByKind {
		var parts []string
		for _, o := range []string{OutcomeOK, OutcomeFail, OutcomeUnknown} {
			if n := outcomes[o]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, o))
			}
		}
		kinds = append(kinds, k+" "+strings.Join(parts, "/"))
	}
	sort.Strings(kinds)
	out = append(out, "operations: "+strings.Join(kinds, ", "))
	return out
}

func after(f string) string {
	if f == "" {
		return ""
	}
	return " (after " + f + ")"
}

// markerRE finds the op markers the workload puts in every message it sends.
var markerRE = regexp.MustCompile(`#op(\d+)#`)

// Marker is the text that identifies op id in a message or prompt.
func Marker(id int64) string { return "#op" + strconv.FormatInt(id, 10) + "#" }

// session is the checker's index of one session.
type session struct {
	id        string
	header    protocol.SessionHeader
	hasHeader bool
	events    []Event
	dequeues  map[string][]int64 // messageId -> times claimed
	discards  map[string]string  // messageId -> reason dropped unrun
	order     map[string]int     // messageId -> position among first claims
	pending   map[string]bool    // messageIds still in the inbox
	turns     int
	runs      []protocol.RunRecord
}

// occurrence is a message carrying an op's marker.
type occurrence struct {
	session, messageID string
}

type checker struct {
	h        *History
	snap     *Snapshot
	sessions map[string]*session
	occ      map[int64][]occurrence // op id -> messages carrying its marker
	ops      map[int64]*Op
	v        map[string]*Verdict
	sum      Summary
	// processed: accepted message -> when it was claimed and when its
	// processing bound started (for the recovery figure).
	processedAt map[string]int64
	opMessages  map[string]bool
	byClass     map[string]map[string]*Cell
	recoveries  map[string]time.Duration
	// epochStart: a continuable epoch's subagent/start time. Its settled
	// record carries the child's creation time, not its own
	// (internal/worker settles with the header's CreatedAt).
	epochStart map[string]int64
}

// Check judges a history against I1–I8, I10–I12 and L1 (shared/RELIABILITY.md).
// The bounds count from the later of the event and the end of every fault
// window that overlaps the bound (a fault extends the wait to its heal plus
// the bound); L1 also waits out drains until their lift and interrupts until
// the child's next message (its queue is parked until then,
// docs/upstream-behaviour.md §5.11).
func Check(h *History) *Report {
	c := &checker{h: h, snap: h.Snapshot, sessions: map[string]*session{}, occ: map[int64][]occurrence{},
		ops: map[int64]*Op{}, v: map[string]*Verdict{}, processedAt: map[string]int64{},
		byClass: map[string]map[string]*Cell{}, recoveries: map[string]time.Duration{}}
	if c.snap == nil {
		c.snap = &Snapshot{}
	}
	for _, t := range invariantTitles {
		c.v[t.name] = &Verdict{Name: t.name, Title: t.title}
	}
	c.sum = Summary{Seed: h.Seed, Faults: map[string]int{}, ByKind: map[string]map[string]int{}}
	for _, f := range h.Faults {
		c.sum.Faults[f.Class]++
	}
	for _, op := range h.Ops {
		c.ops[op.ID] = op
		c.sum.Ops++
		if c.sum.ByKind[op.Kind] == nil {
			c.sum.ByKind[op.Kind] = map[string]int{}
		}
		c.sum.ByKind[op.Kind][op.Outcome]++
		switch op.Outcome {
		case OutcomeOK:
			c.sum.Accepted++
		case OutcomeUnknown:
			c.sum.Unknown++
		}
	}
	c.index()
	c.checkMessages()
	c.checkRuns()
	c.checkOrder()
	c.checkForeign()
	c.checkCascades()
	c.checkRecords()
	c.checkLifecycle()
	c.checkLimits()
	c.checkRequests()
	c.checkBudgets()
	c.checkContinuation()
	c.recovery()
	r := &Report{Summary: c.sum, ByClass: c.byClass, Recovery: c.recoveries}
	for _, t := range invariantTitles {
		r.Verdicts = append(r.Verdicts, *c.v[t.name])
	}
	return r
}

// fail records a violation of invariant name by something that happened at
// at (epoch ms), which attributes it to the faults around that time.
func (c *checker) fail(name string, at int64, format string, args ...any) {
	v := c.v[name]
	v.Violations++
	if len(v.Examples) < examplesMax {
		v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
	}
	for _, class := range c.classesAt(at) {
		c.cell(class, name).Violations++
	}
}

// checked counts one check of invariant name on something at at.
func (c *checker) checked(name string, at int64) {
	c.v[name].Checked++
	for _, class := range c.classesAt(at) {
		c.cell(class, name).Checked++
	}
}

// Attribution windows: a check belongs to every fault whose window, from
// faultLead before its start to faultTail after its heal, holds the time of
// what was checked; the rest belong to NoFault.
const (
	faultLead = 2 * time.Second
	faultTail = 10 * time.Second
	// NoFault names the checks no fault window holds.
	NoFault = "no fault"
)

func (c *checker) classesAt(at int64) []string {
	var out []string
	for _, f := range c.h.Faults {
		if at >= f.Start-faultLead.Milliseconds() && at <= f.End+faultTail.Milliseconds() && !slices.Contains(out, f.Class) {
			out = append(out, f.Class)
		}
	}
	if len(out) == 0 {
		out = append(out, NoFault)
	}
	return out
}

func (c *checker) cell(class, name string) *Cell {
	row := c.byClass[class]
	if row == nil {
		row = map[string]*Cell{}
		c.byClass[class] = row
	}
	if row[name] == nil {
		row[name] = &Cell{}
	}
	return row[name]
}

// runEnd is the time of run's last subagent/end.
func (c *checker) runEnd(runID string) int64 {
	var t int64
	for _, ev := range c.snap.Lifecycle {
		if ev.RunID == runID && ev.Type == protocol.LifecycleEnd {
			t = max(t, ev.Time)
		}
	}
	return t
}

// firstTime is the time of a session's first event (its header's creation
// when it has none).
func (s *session) firstTime() int64 {
	if len(s.events) > 0 {
		return s.events[0].Time
	}
	return s.header.CreatedAt
}

func (c *checker) sess(id string) *session {
	s := c.sessions[id]
	if s == nil {
		s = &session{id: id, dequeues: map[string][]int64{}, discards: map[string]string{}, order: map[string]int{}, pending: map[string]bool{}}
		c.sessions[id] = s
	}
	return s
}

func (c *checker) index() {
	for id, h := range c.snap.Headers {
		s := c.sess(id)
		s.header, s.hasHeader = h, true
	}
	for id, evs := range c.snap.Logs {
		s := c.sess(id)
		s.events = evs
		for _, ev := range evs {
			switch ev.Type {
			case protocol.EvInboxDequeue:
				var d protocol.InboxDequeueData
				if ev.Decode(&d) == nil {
					if _, seen := s.order[d.MessageID]; !seen {
						s.order[d.MessageID] = len(s.order)
					}
					s.dequeues[d.MessageID] = append(s.dequeues[d.MessageID], ev.Time)
				}
			case protocol.EvInboxDiscard:
				var d protocol.InboxDiscardData
				if ev.Decode(&d) == nil {
					s.discards[d.MessageID] = d.Reason
				}
			case protocol.EvUserMessage:
				var d protocol.UserMessageData
				if ev.Decode(&d) == nil && !carriesOutput(d.Source) {
					c.noteMarkers(protocol.AllText(d.Content), id, d.ID)
				}
			case protocol.EvTurnStart:
				s.turns++
			}
		}
	}
	for id, items := range c.snap.Inbox {
		s := c.sess(id)
		for _, it := range items {
			s.pending[it.MessageID] = true
			if !carriesOutput(it.Source) {
				c.noteMarkers(it.Text, id, it.MessageID)
			}
		}
	}
	for _, r := range c.snap.Runs {
		s := c.sess(r.ChildID)
		s.runs = append(s.runs, r)
	}
	c.epochStart = map[string]int64{}
	for _, ev := range c.snap.Lifecycle {
		if ev.Type == protocol.LifecycleStart && ev.Mode == protocol.ModeContinuable {
			c.epochStart[ev.RunID] = ev.Time
		}
	}
}

// created is when a run or epoch began.
func (c *checker) created(r protocol.RunRecord) int64 {
	if s, ok := c.epochStart[r.RunID]; ok && s > r.CreatedAt {
		return s
	}
	return r.CreatedAt
}

// carriesOutput reports whether a message relays another agent's output
// (a settlement notice, a report): the markers in it are that agent's
// answer, not a message someone sent.
func carriesOutput(src protocol.MessageSource) bool {
	return src.Kind == protocol.SourceSubagentSettled || src.Kind == protocol.SourceSubagentReport
}

func (c *checker) noteMarkers(text, sessionID, messageID string) {
	for _, m := range markerRE.FindAllStringSubmatch(text, -1) {
		id, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			continue
		}
		o := occurrence{session: sessionID, messageID: messageID}
		dup := false
		for _, x := range c.occ[id] {
			if x == o {
				dup = true
			}
		}
		if !dup {
			c.occ[id] = append(c.occ[id], o)
		}
	}
}

// isRoot reports whether a session is a root (no parent): its inbox is read
// by its client, never claimed by an agent.
func (c *checker) isRoot(id string) bool {
	s := c.sessions[id]
	return s != nil && s.hasHeader && s.header.ParentSession == ""
}

// messageOps are the operations that put a message in a child's inbox.
func isMessageOp(op *Op) bool { return op.Kind == OpStart || op.Kind == OpFollowup }

// checkMessages: I1 (each accepted message claimed once, none lost; a
// refused one never delivered), I2 (none claimed twice, no marker in two
// messages), L1 (claimed within the bound, none left pending).
func (c *checker) checkMessages() {
	for _, op := range c.h.Ops {
		if !isMessageOp(op) {
			continue
		}
		occ := c.occ[op.ID]
		ids := map[string]bool{}
		for _, o := range occ {
			ids[o.messageID] = true
		}
		if len(ids) > 1 {
			c.sum.Duplicated++
			c.fail("I2", op.Invoke, "op %d (%s to %s): its message was accepted %d times as %v", op.ID, op.Kind, op.Child, len(ids), keys(ids))
		}
		switch op.Outcome {
		case OutcomeOK:
			c.sum.Messages++
			c.checked("I1", op.Complete)
			c.checked("L1", op.Complete)
			c.checkAccepted(op, op.MessageID)
		case OutcomeUnknown:
			for id := range ids {
				c.checkAccepted(op, id)
			}
		case OutcomeFail:
			c.checked("I1", op.Invoke)
			for id := range ids {
				c.fail("I1", op.Invoke, "op %d (%s to %s) was refused (%s) yet its message %s was accepted", op.ID, op.Kind, op.Child, op.Code, id)
			}
		}
	}
	// Every other claim (notices, reports) once at most; nothing left pending
	// for a session that has an agent to claim it.
	for _, s := range c.sessions {
		for mid, times := range s.dequeues {
			if len(times) > 1 && !c.isOpMessage(mid) {
				c.sum.Duplicated++
				c.fail("I2", times[0], "message %s claimed %d times by %s", mid, len(times), s.id)
			}
		}
		if c.isRoot(s.id) {
			continue
		}
		for mid := range s.pending {
			if len(s.dequeues[mid]) > 0 || c.isOpMessage(mid) {
				continue
			}
			if c.undeliverableNotice(s, mid) {
				continue
			}
			c.sum.Stuck++
			c.fail("L1", c.snap.TakenAt, "inbox item %s of %s is still pending after the bound", mid, s.id)
		}
	}
}

// undeliverableNotice reports whether a pending item is a notice or report
// to a one-shot session that has ended: nothing will ever run it, and the
// sender was told nothing else (notices to a parent that is gone are
// dropped, docs/design.md §7).
func (c *checker) undeliverableNotice(s *session, mid string) bool {
	for _, it := range c.snap.Inbox[s.id] {
		if it.MessageID != mid {
			continue
		}
		if it.Source.Kind != protocol.SourceSubagentSettled && it.Source.Kind != protocol.SourceSubagentReport {
			return false
		}
	}
	for _, r := range s.runs {
		if r.Mode == protocol.ModeOneShot && r.State == protocol.RunSettled {
			return true
		}
	}
	return false
}

func (c *checker) isOpMessage(mid string) bool {
	if c.opMessages == nil {
		c.opMessages = map[string]bool{}
		for _, op := range c.h.Ops {
			if isMessageOp(op) && op.MessageID != "" {
				c.opMessages[op.MessageID] = true
			}
			for _, o := range c.occ[op.ID] {
				if isMessageOp(op) {
					c.opMessages[o.messageID] = true
				}
			}
		}
	}
	return c.opMessages[mid]
}

// checkAccepted judges one accepted message id of op.
func (c *checker) checkAccepted(op *Op, mid string) {
	s := c.sessions[op.Child]
	var times []int64
	pending, discarded := false, false
	reason := ""
	if s != nil {
		times, pending = s.dequeues[mid], s.pending[mid]
		reason, discarded = s.discards[mid]
	}
	switch {
	case len(times) == 1 && discarded:
		c.sum.Duplicated++
		c.fail("I2", op.Complete, "op %d (%s to %s): message %s both claimed and discarded", op.ID, op.Kind, op.Child, mid)
	case len(times) == 1:
		c.processed(op, mid, times[0])
	case len(times) > 1:
		c.sum.Duplicated++
		c.fail("I2", op.Complete, "op %d (%s to %s): message %s claimed %d times", op.ID, op.Kind, op.Child, mid, len(times))
	case discarded && c.underEndedRun(op.Child):
		// Dropped unrun, and logged so, because a one-shot ancestor ended:
		// its descendants end with it (I5), their queues with them.
		c.sum.Discarded++
	case discarded:
		c.sum.Lost++
		c.fail("I1", op.Complete, "op %d (%s to %s): message %s accepted at %s was discarded unrun (%s) with no ended ancestor", op.ID, op.Kind, op.Child, mid, c.at(op.Complete), reason)
	case pending:
		c.sum.Stuck++
		c.fail("L1", op.Complete, "op %d (%s to %s): message %s accepted at %s is still pending", op.ID, op.Kind, op.Child, mid, c.at(op.Complete))
	case op.Outcome == OutcomeOK:
		c.sum.Lost++
		c.fail("I1", op.Complete, "op %d (%s to %s): message %s accepted at %s is neither in the log nor in the inbox: lost", op.ID, op.Kind, op.Child, mid, c.at(op.Complete))
	}
}

// underEndedRun reports whether id descends from a one-shot child whose
// run settled.
func (c *checker) underEndedRun(id string) bool {
	for i := 0; i < 64; i++ {
		s := c.sessions[id]
		if s == nil || !s.hasHeader || s.header.ParentSession == "" {
			return false
		}
		id = s.header.ParentSession
		if p := c.sessions[id]; p != nil {
			for _, r := range p.runs {
				if r.Mode == protocol.ModeOneShot && r.State == protocol.RunSettled {
					return true
				}
			}
		}
	}
	return false
}

// processed judges the delay of a claimed message (L1).
func (c *checker) processed(op *Op, mid string, at int64) {
	c.processedAt[mid] = at
	accepted := op.Complete
	if op.Outcome != OutcomeOK || accepted == 0 {
		return
	}
	from := c.waitStart(op, accepted, at)
	deadline := c.faultAware(from, c.h.Bounds.Process)
	if at > deadline {
		c.fail("L1", accepted, "op %d (%s to %s): message %s accepted at %s claimed at %s, past the bound (%s after %s)",
			op.ID, op.Kind, op.Child, mid, c.at(accepted), c.at(at), c.h.Bounds.Process, c.at(from))
	}
}

// waitStart is when a message's processing bound starts: its acceptance,
// or the lift of a drain over its child, or the next message after an
// interrupt that parked it.
func (c *checker) waitStart(op *Op, accepted, claimed int64) int64 {
	from := accepted
	for _, d := range c.h.Ops {
		if d.Kind != OpDrain || d.Outcome != OutcomeOK || d.Invoke > claimed || !c.drainCovers(d, op.Child) {
			continue
		}
		end := c.liftAfter(d)
		if end > accepted {
			from = max(from, end)
		}
	}
	for _, in := range c.h.Ops {
		if in.Kind != OpInterrupt || in.Child != op.Child || in.Outcome == OutcomeFail || in.Invoke < accepted-1 || in.Invoke > claimed {
			continue
		}
		from = max(from, c.nextSend(op.Child, in.Invoke))
	}
	return from
}

// liftAfter is when the drain d was lifted (the end of the history if never).
func (c *checker) liftAfter(d *Op) int64 {
	for _, l := range c.h.Ops {
		if l.Kind == OpLift && l.Outcome == OutcomeOK && l.Invoke >= d.Invoke && l.Scope == d.Scope && sameSet(l.Targets, d.Targets) {
			return l.Complete
		}
	}
	return c.snap.TakenAt
}

// nextSend is when the next message to child after t was sent.
func (c *checker) nextSend(child string, t int64) int64 {
	best := c.snap.TakenAt
	for _, op := range c.h.Ops {
		if isMessageOp(op) && op.Child == child && op.Invoke > t && op.Outcome != OutcomeFail && op.Complete < best {
			best = op.Complete
		}
	}
	return best
}

// drainCovers reports whether drain op d holds child's queue.
func (c *checker) drainCovers(d *Op, child string) bool {
	switch d.Scope {
	case "all":
		return true
	case "parent":
		for _, p := range d.Targets {
			if c.descends(child, p) {
				return true
			}
		}
	}
	// A drain of given children leaves no marker: nothing waits for a lift.
	return false
}

// descends reports whether id is a strict descendant of ancestor.
func (c *checker) descends(id, ancestor string) bool {
	for i := 0; i < 64; i++ {
		s := c.sessions[id]
		if s == nil || !s.hasHeader || s.header.ParentSession == "" {
			return false
		}
		id = s.header.ParentSession
		if id == ancestor {
			return true
		}
	}
	return false
}

// faultAware is t0 plus bound, extended past every fault window that
// overlaps it to that window's end plus bound.
func (c *checker) faultAware(t0 int64, bound time.Duration) int64 {
	b := bound.Milliseconds()
	d := t0 + b
	for _, f := range c.h.Faults {
		if f.Start <= d && f.End >= t0 {
			d = max(d, f.End+b)
		}
	}
	return d
}

// checkRuns: I2 for one-shot runs (one turn, one notice, one end event).
func (c *checker) checkRuns() {
	ends := map[string]int{}
	for _, ev := range c.snap.Lifecycle {
		if ev.Type == protocol.LifecycleEnd {
			ends[ev.RunID]++
		}
	}
	for runID, n := range ends {
		if n > 1 {
			c.sum.Duplicated++
			c.fail("I2", c.runEnd(runID), "run %s has %d subagent/end events: settled more than once", runID, n)
		}
	}
	for _, op := range c.h.Ops {
		if op.Kind != OpRun {
			continue
		}
		c.checked("I2", op.Invoke)
		// A notice may come again (a coordinator publishes a dead winner's
		// result once more: at least once); two different results are two
		// settlements.
		results := map[string]bool{}
		for _, n := range op.Notices {
			results[n.StopReason+"/"+n.ErrorCode] = true
		}
		if len(results) > 1 {
			c.sum.Duplicated++
			c.fail("I2", op.Invoke, "op %d: run %s was announced settled %d times with %d results (%v)", op.ID, op.RunID, len(op.Notices), len(results), op.Notices)
		}
		if op.Outcome == OutcomeFail {
			c.checked("I1", op.Invoke)
			for _, o := range c.occ[op.ID] {
				c.fail("I1", op.Invoke, "op %d (run) was refused (%s) yet child %s got its prompt", op.ID, op.Code, o.session)
			}
		}
		children := map[string]bool{}
		for _, o := range c.occ[op.ID] {
			if s := c.sessions[o.session]; s != nil && s.hasHeader && s.header.ParentSession == op.Parent {
				children[o.session] = true
			}
		}
		if len(children) > 1 {
			c.sum.Duplicated++
			c.fail("I2", op.Invoke, "op %d: one runs.start made %d children %v", op.ID, len(children), keys(children))
		}
	}
	for _, s := range c.sessions {
		oneShot := false
		for _, r := range s.runs {
			if r.Mode == protocol.ModeOneShot {
				oneShot = true
			}
		}
		if oneShot && s.turns > 1 {
			c.sum.Duplicated++
			c.fail("I2", s.firstTime(), "one-shot child %s ran %d turns", s.id, s.turns)
		}
	}
}

// checkOrder: I3, per sender and child, claims follow the order of the
// sender's accepted messages (a sender sends one at a time).
func (c *checker) checkOrder() {
	type key struct{ child, sender string }
	bySender := map[key][]*Op{}
	for _, op := range c.h.Ops {
		if isMessageOp(op) && op.Outcome == OutcomeOK && op.Sender != "" {
			k := key{op.Child, op.Sender}
			bySender[k] = append(bySender[k], op)
		}
	}
	for k, ops := range bySender {
		sort.Slice(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
		s := c.sessions[k.child]
		if s == nil {
			continue
		}
		last, lastOp := -1, int64(0)
		for _, op := range ops {
			pos, ok := s.order[op.MessageID]
			if !ok {
				continue
			}
			c.checked("I3", op.Invoke)
			if pos < last {
				c.fail("I3", op.Invoke, "child %s claimed op %d's message before op %d's, sent earlier by %s", k.child, op.ID, lastOp, k.sender)
			}
			last, lastOp = pos, op.ID
		}
	}
}

// checkForeign: I4, a request without authority is refused and leaves no
// trace in any inbox or log.
func (c *checker) checkForeign() {
	for _, op := range c.h.Ops {
		if op.Kind != OpForeign {
			continue
		}
		c.checked("I4", op.Invoke)
		if op.Outcome == OutcomeOK {
			c.fail("I4", op.Invoke, "op %d (%s, acting on %s) was accepted", op.ID, op.ForeignKind, op.Child)
		}
		for _, o := range c.occ[op.ID] {
			c.fail("I4", op.Invoke, "op %d (%s): its message reached %s as %s", op.ID, op.ForeignKind, o.session, o.messageID)
		}
	}
}

// checkCascades: I5, after an accepted root close or run dispose at T,
// every run or epoch record of every descendant that existed at T settles
// by T plus the bound, and every one-shot descendant created later settles
// within the bound of its creation.
func (c *checker) checkCascades() {
	for _, op := range c.h.Ops {
		var top string
		switch {
		case op.Kind == OpCloseRoot && op.Outcome == OutcomeOK:
			top = op.Root
		case op.Kind == OpDispose && op.Outcome == OutcomeOK:
			top = op.Child
		default:
			continue
		}
		t := op.Complete
		for id, s := range c.sessions {
			if id != top && !c.descends(id, top) {
				continue
			}
			if id == top && op.Kind == OpCloseRoot {
				continue
			}
			for _, r := range s.runs {
				var from int64
				switch {
				case r.Mode == protocol.ModeOneShot:
					from = max(t, r.CreatedAt)
				case c.created(r) <= t:
					from = t
				default:
					continue
				}
				c.checked("I5", t)
				deadline := c.faultAware(from, c.h.Bounds.Cascade)
				switch {
				case r.State != protocol.RunSettled:
					c.fail("I5", t, "op %d (%s of %s at %s): descendant %s run %s never settled", op.ID, op.Kind, top, c.at(t), id, r.RunID)
				case r.SettledAt > deadline:
					c.fail("I5", t, "op %d (%s of %s at %s): descendant %s run %s settled at %s, past the bound", op.ID, op.Kind, top, c.at(t), id, r.RunID, c.at(r.SettledAt))
				}
			}
		}
	}
}

// checkRecords: I6, no run or epoch record stays running past host expiry
// plus the grace; every accepted continuable child can be resumed from its
// log (its descriptor is there).
func (c *checker) checkRecords() {
	limit := (c.h.Bounds.HostExpiry + c.h.Bounds.Grace).Milliseconds()
	for _, r := range c.snap.Runs {
		c.checked("I6", c.created(r))
		if r.State != protocol.RunSettled && c.faultAware(c.created(r), 0)+limit < c.snap.TakenAt {
			c.sum.Stuck++
			c.fail("I6", c.created(r), "run %s (%s child %s) is still running, created at %s", r.RunID, r.Mode, r.ChildID, c.at(c.created(r)))
		}
	}
	for _, op := range c.h.Ops {
		if op.Kind != OpStart || op.Outcome != OutcomeOK {
			continue
		}
		c.checked("I6", op.Invoke)
		s := c.sessions[op.Child]
		if s == nil || !s.hasHeader {
			c.fail("I6", op.Invoke, "op %d: continuable child %s has no header", op.ID, op.Child)
			continue
		}
		found := false
		for _, ev := range s.events {
			if ev.Type == protocol.EvSubagentDescriptor {
				found = true
				break
			}
		}
		if !found {
			c.fail("I6", op.Invoke, "op %d: continuable child %s has no descriptor in its log: not resumable", op.ID, op.Child)
		}
	}
}

// checkLifecycle: I7, per run one subagent/start and one subagent/end, in
// that order; every log replays as balanced with no turn left open.
func (c *checker) checkLifecycle() {
	type pair struct {
		starts, ends     int
		startAt, endAt   int64
		child, parentSes string
	}
	runs := map[string]*pair{}
	for _, ev := range c.snap.Lifecycle {
		p := runs[ev.RunID]
		if p == nil {
			p = &pair{child: ev.ID, parentSes: ev.ParentSession}
			runs[ev.RunID] = p
		}
		switch ev.Type {
		case protocol.LifecycleStart:
			p.starts++
			p.startAt = ev.Time
		case protocol.LifecycleEnd:
			p.ends++
			p.endAt = ev.Time
		}
	}
	for runID, p := range runs {
		c.checked("I7", p.startAt)
		switch {
		case p.starts != 1 || p.ends != 1:
			c.fail("I7", max(p.startAt, p.endAt), "run %s of %s: %d subagent/start and %d subagent/end", runID, p.child, p.starts, p.ends)
		case p.endAt < p.startAt:
			c.fail("I7", p.startAt, "run %s of %s: subagent/end at %s before its start at %s", runID, p.child, c.at(p.endAt), c.at(p.startAt))
		}
	}
	for id, s := range c.sessions {
		if len(s.events) == 0 {
			continue
		}
		c.checked("I7", s.firstTime())
		evs := make([]protocol.SessionEvent, len(s.events))
		for i, e := range s.events {
			evs[i] = e.session()
		}
		if err := sessionlog.ValidateReplay(evs, false); err != nil {
			c.fail("I7", s.firstTime(), "log of %s does not replay: %v", id, err)
		}
	}
}

// checkLimits: I8, no header deeper than its cap or the deployment's, and
// no child admitted while its parent already had the limit of live children.
func (c *checker) checkLimits() {
	for id, s := range c.sessions {
		if !s.hasHeader {
			continue
		}
		c.checked("I8", s.header.CreatedAt)
		d := s.header.DelegationDepth
		if s.header.DepthCap != nil && d > *s.header.DepthCap {
			c.sum.LimitBreaches++
			c.fail("I8", s.header.CreatedAt, "session %s at depth %d exceeds its cap %d", id, d, *s.header.DepthCap)
		} else if c.h.Limits.DepthMax > 0 && d > c.h.Limits.DepthMax {
			c.sum.LimitBreaches++
			c.fail("I8", s.header.CreatedAt, "session %s at depth %d exceeds the deployment's %d", id, d, c.h.Limits.DepthMax)
		}
	}
	if c.h.Limits.LiveChildrenMax <= 0 {
		return
	}
	// A child is live from its run or epoch record's creation to its
	// settlement; it is admitted at its first record's creation. No
	// admission may find the limit reached. (A child made live again by a
	// cold resume is not admitted: an accepted message is never refused.)
	type span struct {
		child    string
		from, to int64
	}
	ended := map[string]int64{} // run -> its subagent/end
	for _, ev := range c.snap.Lifecycle {
		if ev.Type == protocol.LifecycleEnd {
			ended[ev.RunID] = ev.Time
		}
	}
	byParent := map[string][]span{}
	first := map[string]int64{}
	for _, r := range c.snap.Runs {
		if r.NotStarted && r.HostID == "" {
			// Settled never started with no instance's claim (a start no
			// instance took, a queued start disposed or orphaned by its
			// parent's end, docs/protocol.md §5.5): no child was ever live.
			continue
		}
		from, to := c.created(r), r.SettledAt
		if r.State != protocol.RunSettled {
			to = c.snap.TakenAt
		}
		if e, ok := ended[r.RunID]; ok && e < to {
			to = e // a record left running (I6) does not keep its child live
		}
		byParent[r.ParentSession] = append(byParent[r.ParentSession], span{r.ChildID, from, to})
		if f, ok := first[r.ChildID]; !ok || from < f {
			first[r.ChildID] = from
		}
	}
	for parent, spans := range byParent {
		admitted := map[string]bool{}
		for _, sp := range spans {
			if admitted[sp.child] || first[sp.child] != sp.from {
				continue
			}
			admitted[sp.child] = true
			c.checked("I8", sp.from)
			live := map[string]bool{}
			for _, o := range spans {
				if o.child != sp.child && o.from <= sp.from && sp.from < o.to {
					live[o.child] = true
				}
			}
			if len(live) >= c.h.Limits.LiveChildrenMax {
				c.sum.LimitBreaches++
				c.fail("I8", sp.from, "parent %s admitted child %s at %s with %d children live; the limit is %d", parent, sp.child, c.at(sp.from), len(live), c.h.Limits.LiveChildrenMax)
			}
		}
	}
}

// recovery finds the longest wait after a fault healed: for each fault, the
// latest claim of a message accepted before its heal and the latest
// settlement of a one-shot run created before it, measured from the heal.
func (c *checker) recovery() {
	for _, f := range c.h.Faults {
		var worst int64
		for _, op := range c.h.Ops {
			if !isMessageOp(op) || op.Outcome != OutcomeOK || op.Complete > f.End {
				continue
			}
			at, ok := c.processedAt[op.MessageID]
			if !ok || at <= f.End {
				continue
			}
			if from := c.waitStart(op, op.Complete, at); from > f.End {
				continue // it waited for a drain's lift or its next message
			}
			worst = max(worst, at-f.End)
		}
		for _, r := range c.snap.Runs {
			if r.Mode == protocol.ModeOneShot && r.CreatedAt < f.End && r.State == protocol.RunSettled && r.SettledAt > f.End {
				worst = max(worst, r.SettledAt-f.End)
			}
		}
		d := time.Duration(worst) * time.Millisecond
		if d > c.sum.LongestRecovery {
			c.sum.LongestRecovery, c.sum.RecoveryAfter = d, f.Class+" "+f.Target
		}
		c.recoveries[f.Class] = max(c.recoveries[f.Class], d)
	}
}

// at renders an epoch-ms time as an offset from the history's start.
func (c *checker) at(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return "+" + (time.Duration(ms-c.h.Start) * time.Millisecond).Round(time.Millisecond).String()
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}
