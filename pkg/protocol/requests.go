package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Requests (docs/protocol.md §5.21): a child asks for the approval of a
// tool call, or asks a question (the ask tool), and whoever may answer for it — the user (a grant over its
// tree) or one of its ancestors (a live agent's credential), never the
// child itself nor a sibling — answers once. The record lives in
// brood_agents under request.<requestId>, written only by coordinators;
// the answer moves it out of pending by compare-and-set, so the first
// answer wins and every later one is ALREADY_ANSWERED.

// Request kinds.
const (
	// RequestApproval asks to run a tool call that needs approval
	// (Tool, Arguments).
	RequestApproval = "approval"
	// RequestQuestion asks a question (Question), to be answered with free
	// text, with one of its Choices, or with JSON its AnswerSchema accepts.
	RequestQuestion = "question"
	// RequestBudget is a continuable child paused at its budget's cap
	// (docs/protocol.md §5.5, "Pause and raise"): its turn waits, before a
	// model request, for a raise (budget.raise answers it approved, and the
	// turn reserves again) or a denial (the turn ends BUDGET_EXHAUSTED, as
	// a timeout does). Exhausted says which budget and limit; BudgetOf is
	// the ledger that refused.
	RequestBudget = "budget"
)

// Request states: pending until answered; then one of the others, for good.
const (
	RequestPending  = "pending"
	RequestApproved = "approved"
	RequestDenied   = "denied"
	// RequestAnswered: a question got its answer (RequestAnswer.Text or
	// RequestAnswer.JSON).
	RequestAnswered = "answered"
	// RequestTimedOut: no answer came by the deadline; its declared outcome
	// is a denial, logged as a timeout, never as a user's denial.
	RequestTimedOut = "timed-out"
	// RequestCancelled: the asking turn ended before an answer came (its
	// one-shot run settled, or the turn was closed: interrupted, disposed,
	// its parent ended, its time ran out); no answer can reach the call
	// any more, so none is taken (ALREADY_ANSWERED). By.Kind is
	// AnswererEnded and Reason says how the turn ended. A continuable
	// child's turn left open when its host died is not ended: its next
	// activation continues it.
	RequestCancelled = "cancelled"
)

// Answerer kinds (RequestAnswer.By.Kind).
const (
	AnswererUser    = "user"
	AnswererAgent   = "agent"
	AnswererTimeout = "timeout"
	// AnswererEnded: the asking turn ended (RequestCancelled).
	AnswererEnded = "ended"
)

// Answer verbs of requests.answer: approve and deny answer an approval,
// answer (with text or json) a question.
const (
	AnswerApprove = "approve"
	AnswerDeny    = "deny"
	AnswerAnswer  = "answer"
	// AnswerPassUp is no answer: an ancestor agent passes the request up
	// to the next ancestor above it that takes requests, or to the user
	// when none does (RequestRecord.Handler, PassedBy); the request stays
	// pending.
	AnswerPassUp = "pass_up"
)

// Bounds of a question and of its answer (INVALID_ARGUMENT past them).
const (
	// RequestQuestionBytesMax bounds a question's text (16 KiB).
	RequestQuestionBytesMax = 16 << 10
	// RequestChoicesMax bounds a question's choices (32).
	RequestChoicesMax = 32
	// RequestChoiceBytesMax bounds one choice (1 KiB).
	RequestChoiceBytesMax = 1 << 10
	// RequestAnswerSchemaBytesMax bounds a question's answerSchema, as
	// JSON text (64 KiB).
	RequestAnswerSchemaBytesMax = 64 << 10
	// RequestAnswerBytesMax bounds an answer's text or json (64 KiB).
	RequestAnswerBytesMax = 64 << 10
)

// Bounds of an approval's fields at requests.open (docs/protocol.md §5.21):
// its callId and tool (INVALID_ARGUMENT past them) and its arguments
// (LIMIT_EXCEEDED past it).
const (
	// RequestCallIDBytesMax bounds a request's callId (256 bytes).
	RequestCallIDBytesMax = 256
	// RequestToolBytesMax bounds an approval's tool name (256 bytes).
	RequestToolBytesMax = 256
	// RequestArgumentsBytesMax bounds an approval's arguments, UTF-8 text
	// (64 KiB).
	RequestArgumentsBytesMax = 64 << 10
)

// RequestTimeout is how long a request waits for its answer (5 minutes):
// inside the turn's own limit (10 minutes by default), since the turn
// waits for it. Past it the request is timed-out (a denial).
const RequestTimeout = 5 * time.Minute

// RequestReasonBytesMax bounds a denial's reason (the same as a diagnostic).
const RequestReasonBytesMax = DiagnosticBytesMax

// ToolAnswerRequest is the name of the answer_request tool of the built-in
// agents: an agent answers a descendant's request with it (requests.answer
// with its own credential). A provider whose descriptor lists it, under a
// session whose tool filter and ceiling let it through, takes requests: the
// nearest such live continuable ancestor of an asking session gets a
// notice of each of its requests (§5.21, "Who is told").
const ToolAnswerRequest = "answer_request"

// RequestsListMax bounds the records one requests.list answers.
const RequestsListMax = 256

// RequestRecord is a request as brood_agents holds it (request.<id>).
// Times are epoch ms of the coordinator's clock.
type RequestRecord struct {
	Version   int    `msgpack:"version" json:"version"`
	ID        string `msgpack:"id" json:"id"`
	SessionID string `msgpack:"sessionId" json:"sessionId"`
	Kind      string `msgpack:"kind" json:"kind"`
	// CallID, Turn and Step name the tool call in the child's log.
	CallID string `msgpack:"callId" json:"callId"`
	Turn   int64  `msgpack:"turn" json:"turn"`
	Step   int64  `msgpack:"step" json:"step"`
	// Tool and Arguments (raw JSON text) are the call asked about.
	Tool      string `msgpack:"tool,omitempty" json:"tool,omitempty"`
	Arguments string `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	// Question, Choices and AnswerSchema (canonical JSON text) are a
	// question's (kind question).
	Question     string         `msgpack:"question,omitempty" json:"question,omitempty"`
	Choices      []string       `msgpack:"choices,omitempty" json:"choices,omitempty"`
	AnswerSchema string         `msgpack:"answerSchema,omitempty" json:"answerSchema,omitempty"`
	State        string         `msgpack:"state" json:"state"`
	CreatedAt    int64          `msgpack:"createdAt" json:"createdAt"`
	Deadline     int64          `msgpack:"deadline" json:"deadline"`
	Answer       *RequestAnswer `msgpack:"answer,omitempty" json:"answer,omitempty"`
	// Handler is the ancestor agent told of the request (its notice), the
	// one it waits on; absent, none was told and it waits on the user
	// (any ancestor and the user may answer it either way).
	Handler string `msgpack:"handler,omitempty" json:"handler,omitempty"`
	// PassedBy lists the ancestor agents that passed the request up
	// (answer_request pass_up), in order; each at most once.
	PassedBy []string `msgpack:"passedBy,omitempty" json:"passedBy,omitempty"`
	// BudgetOf and Exhausted are a budget pause's (kind budget): the
	// session whose ledger refused the reservation, and the refusal's
	// BUDGET_EXHAUSTED message (the limit, its value and the usage).
	BudgetOf  string `msgpack:"budgetOf,omitempty" json:"budgetOf,omitempty"`
	Exhausted string `msgpack:"exhausted,omitempty" json:"exhausted,omitempty"`
}

// RequestVersion is the current RequestRecord version.
const RequestVersion = 1

// RequestAnswer is how a request left pending.
type RequestAnswer struct {
	State  string `msgpack:"state" json:"state"`
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// Text or JSON (canonical JSON text) is a question's answer.
	Text string   `msgpack:"text,omitempty" json:"text,omitempty"`
	JSON string   `msgpack:"json,omitempty" json:"json,omitempty"`
	By   Answerer `msgpack:"by" json:"by"`
	At   int64    `msgpack:"at" json:"at"`
	// ID is a fresh id of this answer (a ULID), so two answers never
	// write equal records: the compare-and-set tells the second from a
	// retry of the first (records written before it lack it).
	ID string `msgpack:"id,omitempty" json:"id,omitempty"`
}

// Answerer is who answered: the user (User, when the grant names one), an
// ancestor agent (SessionID), or the timeout.
type Answerer struct {
	Kind      string `msgpack:"kind" json:"kind"`
	SessionID string `msgpack:"sessionId,omitempty" json:"sessionId,omitempty"`
	User      string `msgpack:"user,omitempty" json:"user,omitempty"`
}

// RequestID is the id of the request of the tool call callID of session
// sessionID: "r" and 24 hex digits of their SHA-256, so opening the same
// call's request again finds the one already open.
func RequestID(sessionID, callID string) string {
	sum := sha256.Sum256([]byte(sessionID + "\x00" + callID))
	return "r" + hex.EncodeToString(sum[:12])
}

// RequestOpenRequest is the body of requests.open: the child (its own
// live credential, Self) asks about its tool call (kind approval: Tool,
// Arguments) or asks a question through it (kind question: Question,
// Choices or AnswerSchema).
type RequestOpenRequest struct {
	Self         ParentRef `msgpack:"self" json:"self"`
	Kind         string    `msgpack:"kind" json:"kind"`
	CallID       string    `msgpack:"callId" json:"callId"`
	Turn         int64     `msgpack:"turn" json:"turn"`
	Step         int64     `msgpack:"step" json:"step"`
	Tool         string    `msgpack:"tool,omitempty" json:"tool,omitempty"`
	Arguments    string    `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
	Question     string    `msgpack:"question,omitempty" json:"question,omitempty"`
	Choices      []string  `msgpack:"choices,omitempty" json:"choices,omitempty"`
	AnswerSchema string    `msgpack:"answerSchema,omitempty" json:"answerSchema,omitempty"`
	// BudgetOf and Exhausted are a budget pause's (kind budget; Exhausted
	// at most RequestReasonBytesMax bytes).
	BudgetOf  string `msgpack:"budgetOf,omitempty" json:"budgetOf,omitempty"`
	Exhausted string `msgpack:"exhausted,omitempty" json:"exhausted,omitempty"`
	// BudgetRaises is a budget pause's: the raise count of BudgetOf's
	// ledger that its refusal saw (BUDGET_EXHAUSTED's detail `raises`).
	// When the ledger has had more raises by the time the request is
	// open, the request is answered approved at once: the raise landed
	// before the pause existed (docs/protocol.md §5.5, "Pause and raise").
	// Absent: not checked.
	BudgetRaises *int64 `msgpack:"budgetRaises,omitempty" json:"budgetRaises,omitempty"`
}

// RequestGetRequest is the body of requests.get: the child itself (Self)
// or one who may answer (Authority) reads a request.
type RequestGetRequest struct {
	RequestID string     `msgpack:"requestId" json:"requestId"`
	Self      *ParentRef `msgpack:"self,omitempty" json:"self,omitempty"`
	Authority Authority  `msgpack:"authority" json:"authority"`
}

// RequestAnswerRequest is the body of requests.answer: Answer is approve
// or deny for an approval, with Reason (deny only, at most
// RequestReasonBytesMax bytes) shown to the child; it is answer for a
// question, with Text or JSON (JSON text), one of them.
type RequestAnswerRequest struct {
	RequestID string    `msgpack:"requestId" json:"requestId"`
	Authority Authority `msgpack:"authority" json:"authority"`
	Answer    string    `msgpack:"answer" json:"answer"`
	Reason    string    `msgpack:"reason,omitempty" json:"reason,omitempty"`
	Text      string    `msgpack:"text,omitempty" json:"text,omitempty"`
	JSON      string    `msgpack:"json,omitempty" json:"json,omitempty"`
}

// RequestsListRequest is the body of requests.list: the requests the
// authority may answer (a grant: its users' trees; an agent: its
// descendants'), of the subtree of Under when set, pending only unless All.
type RequestsListRequest struct {
	Authority Authority `msgpack:"authority" json:"authority"`
	Under     string    `msgpack:"under,omitempty" json:"under,omitempty"`
	All       bool      `msgpack:"all,omitempty" json:"all,omitempty"`
}

// RequestsListReply lists requests, oldest first; More says some were
// left out (RequestsListMax).
type RequestsListReply struct {
	Requests []RequestRecord `msgpack:"requests" json:"requests"`
	More     bool            `msgpack:"more,omitempty" json:"more,omitempty"`
}

// RequestOpenData is the data of the log event request/open: the child
// parked the tool call CallID on request RequestID until Deadline.
type RequestOpenData struct {
	RequestID string `msgpack:"requestId" json:"requestId"`
	Kind      string `msgpack:"kind" json:"kind"`
	Turn      int64  `msgpack:"turn" json:"turn"`
	Step      int64  `msgpack:"step" json:"step"`
	CallID    string `msgpack:"callId" json:"callId"`
	Tool      string `msgpack:"tool,omitempty" json:"tool,omitempty"`
	Deadline  int64  `msgpack:"deadline" json:"deadline"`
}

// RequestAnswerData is the data of the log event request/answer: how the
// request ended (state approved, denied, answered or timed-out) and who
// said so.
type RequestAnswerData struct {
	RequestID string `msgpack:"requestId" json:"requestId"`
	CallID    string `msgpack:"callId" json:"callId"`
	State     string `msgpack:"state" json:"state"`
	Reason    string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// Text or JSON is a question's answer (state answered).
	Text string   `msgpack:"text,omitempty" json:"text,omitempty"`
	JSON string   `msgpack:"json,omitempty" json:"json,omitempty"`
	By   Answerer `msgpack:"by" json:"by"`
}

// Log event types of requests.
const (
	EvRequestOpen   = "request/open"
	EvRequestAnswer = "request/answer"
)
