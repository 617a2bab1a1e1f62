package chaos

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Operation kinds of the workload (one per client call it makes).
const (
	OpOpenRoot  = "open-root"  // agents.open
	OpCloseRoot = "close-root" // agents.close: a cascade cancel when the root has descendants
	OpRun       = "run"        // runs.start of a one-shot child (its result is recorded on the op)
	OpStart     = "start"      // continuable.start with a caller-chosen child id
	OpFollowup  = "followup"   // continuable.followup
	OpInterrupt = "interrupt"  // continuable.interrupt
	OpDispose   = "dispose"    // runs.dispose of a one-shot run
	OpDrain     = "drain"      // continuable.drain
	OpLift      = "lift"       // continuable.drain with Lift
	OpGrant     = "grant"      // authority.user
	OpForeign   = "foreign"    // a request from a sender without authority (ForeignKind says which)
	OpAnswer    = "answer"     // requests.answer of a child's request (RequestID, Verb; the reply's AnswerID, AnswerState)
	OpRaise     = "raise"      // budget.raise of Child's own budget, for budget request RequestID (the reply's resumed requests: Targets)
)

// Outcomes of an operation (Jepsen's ok, fail, info).
const (
	// OutcomeOK: the call was answered with success.
	OutcomeOK = "ok"
	// OutcomeFail: the call was refused with an error that says it did
	// nothing (UNAUTHORIZED, DRAINING, LIMIT_EXCEEDED, INVALID_ARGUMENT ...).
	OutcomeFail = "fail"
	// OutcomeUnknown: no answer within the deadline, or an error after which
	// the effect may or may not have happened (UNAVAILABLE, DURABILITY_FAILED,
	// INTERNAL): it may appear once or not at all.
	OutcomeUnknown = "unknown"
)

// Op is one recorded client operation: invoked, then completed with an
// outcome, with every id it names. Times are epoch milliseconds.
type Op struct {
	ID     int64  `json:"id"`
	Client string `json:"client"`
	Kind   string `json:"kind"`
	// ForeignKind says which authority a foreign op lacks or forges
	// ("followup-other-root", "followup-dead-root", "followup-forged",
	// "interrupt-other-root", "dispose-other-root", "run-dead-root",
	// "answer-other-root").
	ForeignKind string `json:"foreignKind,omitempty"`
	// Sender is who acts: a root session id, or "grant:<client>".
	Sender string `json:"sender,omitempty"`
	Root   string `json:"root,omitempty"`
	// Parent is the acting parent session (the root of the op's tree).
	Parent string `json:"parent,omitempty"`
	Child  string `json:"child,omitempty"`
	RunID  string `json:"runId,omitempty"`
	// MessageID is the accepted message's id (start, followup).
	MessageID string `json:"messageId,omitempty"`
	// Key is the followup's idempotency key (retried with it).
	Key string `json:"key,omitempty"`
	// Marker is a text unique to the op, carried in its message or prompt.
	Marker string `json:"marker,omitempty"`
	Script string `json:"script,omitempty"`
	// Scope of a drain or lift: "all", "parent", "children".
	Scope string `json:"scope,omitempty"`
	// Targets of a drain or lift (parents, or children of Parent); of a
	// raise, the budget requests it answered (approved, the paused turns
	// it woke).
	Targets []string `json:"targets,omitempty"`
	// RequestID is the request an answer names; Verb its answer verb
	// (approve, deny, answer). An accepted answer's reply: AnswerID (the
	// record's answer.id) and AnswerState (approved, denied, answered).
	RequestID   string `json:"requestId,omitempty"`
	Verb        string `json:"verb,omitempty"`
	AnswerID    string `json:"answerId,omitempty"`
	AnswerState string `json:"answerState,omitempty"`
	// Budget a start (run, start) named for its child and subtree (I11;
	// nil: none, the child draws on its parent's, if any); of a raise, by
	// how much each limit was raised.
	Budget *protocol.Budget `json:"budget,omitempty"`

	Invoke   int64  `json:"invoke"`
	Complete int64  `json:"complete,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Code     string `json:"code,omitempty"`
	Error    string `json:"error,omitempty"`
	Attempts int    `json:"attempts,omitempty"`

	// One-shot runs: the result as the client saw it, and every settlement
	// notice that reached the client (more than one is a double settlement).
	ResultAt   int64    `json:"resultAt,omitempty"`
	StopReason string   `json:"stopReason,omitempty"`
	ResultCode string   `json:"resultCode,omitempty"`
	Notices    []Notice `json:"notices,omitempty"`
}

// Notice is one run notice received on the client's notify subject.
type Notice struct {
	At         int64  `json:"at"`
	StopReason string `json:"stopReason"`
	ErrorCode  string `json:"errorCode,omitempty"`
}

// FaultRecord is one fault the nemesis injected, from its start to its heal.
type FaultRecord struct {
	Class  string `json:"class"`
	Target string `json:"target"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Note   string `json:"note,omitempty"`
}

// Bounds are the stated bounds the checker holds Brood to, counted from the
// later of the event and the end of the faults around it (see Check).
type Bounds struct {
	// HostExpiry of the deployment, and Grace beyond it: no run or epoch
	// record stays running longer than HostExpiry+Grace once faults heal (I6).
	HostExpiry time.Duration `json:"hostExpiry"`
	Grace      time.Duration `json:"grace"`
	// Cascade: every descendant of a closed root or disposed run is
	// terminal within it (I5).
	Cascade time.Duration `json:"cascade"`
	// Process: every accepted message is claimed within it (L1).
	Process time.Duration `json:"process"`
}

// Limits are the deployment's limits the checker verifies (I8).
type Limits struct {
	LiveChildrenMax int   `json:"liveChildrenMax"`
	DepthMax        int64 `json:"depthMax"`
}

// History is a whole recorded run: the seed, every operation, every fault,
// and the durable state read once the faults healed. Check judges it.
type History struct {
	Seed     int64         `json:"seed"`
	Bounds   Bounds        `json:"bounds"`
	Limits   Limits        `json:"limits"`
	Start    int64         `json:"start"`
	Healed   int64         `json:"healed"`
	Ops      []*Op         `json:"ops"`
	Faults   []FaultRecord `json:"faults"`
	Snapshot *Snapshot     `json:"snapshot"`
	// Workspace holds the files the children's tools wrote in the
	// workspace every root works in (path relative to it -> content), read
	// with the snapshot: the side effects of approved calls (I10). Nil in
	// histories recorded before requests were in the workload.
	Workspace map[string]string `json:"workspace,omitempty"`
}

// Save writes the history as gzipped JSON (creating its directory).
func (h *History) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	enc := json.NewEncoder(zw)
	if err := enc.Encode(h); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// LoadHistory reads a history written by Save.
func LoadHistory(path string) (*History, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	var h History
	if err := json.NewDecoder(io.Reader(zr)).Decode(&h); err != nil {
		return nil, fmt.Errorf("decode history %s: %w", path, err)
	}
	return &h, nil
}

// Recorder records operations as the workload makes them. Safe for
// concurrent use.
type Recorder struct {
	mu     sync.Mutex
	ops    []*Op
	faults []FaultRecord
	now    func() int64
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{now: func() int64 { return time.Now().UnixMilli() }}
}

// Invoke records op as invoked now and gives it its id.
func (r *Recorder) Invoke(op *Op) *Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.ID = int64(len(r.ops)) + 1
	op.Invoke = r.now()
	r.ops = append(r.ops, op)
	return op
}

// Update runs f on op under the recorder's lock (ids learnt later, results).
func (r *Recorder) Update(op *Op, f func(*Op)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(op)
}

// Complete records op's outcome from err: nil is ok; a protocol error with
// a definite code is fail; anything else (timeouts, UNAVAILABLE) is unknown.
func (r *Recorder) Complete(op *Op, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Complete = r.now()
	op.Outcome, op.Code, op.Error = Classify(err)
}

// Fault records an injected fault.
func (r *Recorder) Fault(f FaultRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
}

// Ops returns a copy of the recorded operations, by id.
func (r *Recorder) Ops() []*Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Op, len(r.ops))
	for i, op := range r.ops {
		c := *op
		c.Notices = append([]Notice(nil), op.Notices...)
		out[i] = &c
	}
	return out
}

// Faults returns the recorded faults, by start.
func (r *Recorder) Faults() []FaultRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]FaultRecord(nil), r.faults...)
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out
}

// definiteCodes are the error codes that say the request changed nothing.
var definiteCodes = map[protocol.Code]bool{
	protocol.CodeUnauthorized:          true,
	protocol.CodeDraining:              true,
	protocol.CodeLimitExceeded:         true,
	protocol.CodeInvalidArgument:       true,
	protocol.CodeNotFound:              true,
	protocol.CodeNoProvider:            true,
	protocol.CodeNotResumable:          true,
	protocol.CodeDuplicateChild:        true,
	protocol.CodeDepthExceeded:         true,
	protocol.CodeUnsupportedCapability: true,
	protocol.CodeActivationClosing:     true,
	protocol.CodeParentUnavailable:     true,
	protocol.CodeAlreadyAnswered:       true,
	protocol.CodeBudgetExhausted:       true,
}

// Classify maps a call's error to an outcome, its code and text.
func Classify(err error) (outcome, code, text string) {
	if err == nil {
		return OutcomeOK, "", ""
	}
	text = err.Error()
	if len(text) > 300 {
		text = text[:300]
	}
	c := protocol.CodeOf(err)
	if c != "" && definiteCodes[c] {
		return OutcomeFail, string(c), text
	}
	if c == "" && (errors.Is(err, errTimeout) || strings.Contains(strings.ToLower(text), "timeout") || strings.Contains(text, "deadline")) {
		return OutcomeUnknown, "TIMEOUT", text
	}
	return OutcomeUnknown, string(c), text
}

// errTimeout marks a call the workload gave up waiting for.
var errTimeout = errors.New("chaos: no answer within the operation's deadline")
