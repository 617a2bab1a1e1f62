package protocol

import (
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// SessionHeaderVersion is the on-stream format version of SessionHeader.
const SessionHeaderVersion = 1

// OriginSubagent marks a session created as a child (docs/upstream-behaviour.md §3.1).
const OriginSubagent = "subagent"

// SessionHeader is a session's immutable metadata, stored once in
// BROOD_SESSIONS (docs/design.md §4; docs/upstream-behaviour.md §3.1). CreatedAt is epoch
// ms. DelegationDepth is absent (0) for roots and parent depth + 1 for a
// child. SeedLength counts the events inherited from a fork parent (absent
// when unseeded). ToolCeiling is the intersection of every ancestor's tool
// filter and DepthCap the absolute depth cap, so both survive fork and cold
// resume (docs/design.md §7).
type SessionHeader struct {
	Version         int         `msgpack:"version" json:"version"`
	ID              string      `msgpack:"id" json:"id"`
	CreatedAt       int64       `msgpack:"createdAt" json:"createdAt"`
	Cwd             string      `msgpack:"cwd,omitempty" json:"cwd,omitempty"`
	ParentSession   string      `msgpack:"parentSession,omitempty" json:"parentSession,omitempty"`
	SeedLength      int64       `msgpack:"seedLength,omitempty" json:"seedLength,omitempty"`
	Origin          string      `msgpack:"origin,omitempty" json:"origin,omitempty"`
	DelegationDepth int64       `msgpack:"delegationDepth,omitempty" json:"delegationDepth,omitempty"`
	ToolCeiling     *ToolFilter `msgpack:"toolCeiling,omitempty" json:"toolCeiling,omitempty"`
	DepthCap        *int64      `msgpack:"depthCap,omitempty" json:"depthCap,omitempty"`
	// User is the NATS user that opened a root (agents.open on its own
	// subject <p>.v1.user.<user>.agents.open; docs/security.md): a grant
	// scoped to that user acts on the root's tree. A child carries its
	// parent's, copied by the coordinator, so a worker can fence the
	// workspace per user (docs/protocol.md, "Workspace tools";
	// docs/security.md, "The workspace is fenced"); authority is still
	// decided from the root's. Absent for roots opened without a user and
	// their trees.
	User string `msgpack:"user,omitempty" json:"user,omitempty"`
	// Provider is the provider a child was started on, written by the
	// coordinator when it admits the child; absent for roots. It is the
	// session's scope (Scope): the token of its log subject that a
	// deployment's permissions give only that provider's workers
	// (docs/security.md).
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	// AutoApprove names the tools that need approval (write_file,
	// edit_file, run_command) this session runs without asking, sorted;
	// absent, it asks for each. Written by the coordinator from the start's
	// autoApprove option and the parent's own (ResolveAutoApprove): it only
	// narrows down the tree (docs/protocol.md §5.5).
	AutoApprove []string `msgpack:"autoApprove,omitempty" json:"autoApprove,omitempty"`
	// ApproveTools names the further tools this session asks approval for
	// before each call (beyond write_file, edit_file and run_command, which
	// ask unless AutoApprove names them), sorted; absent: none. Written by
	// the coordinator from the start's approveTools, the parent's own and
	// the provider's (ResolveApproveTools): it only grows down the tree,
	// and no tool in it is in AutoApprove (docs/protocol.md §5.5).
	ApproveTools []string `msgpack:"approveTools,omitempty" json:"approveTools,omitempty"`
	// Model is the model chosen for a child (a start's `model`, or its
	// parent's choice when its provider offers it), written by the
	// coordinator; absent: the provider's default (docs/protocol.md §5.5).
	Model *ModelInfo `msgpack:"model,omitempty" json:"model,omitempty"`
	// Limits are a child's effective turn limits, written by the
	// coordinator: its parent's, its worker's settings and its start's
	// request, field by field the smallest (ResolveChildChoice); a worker
	// runs the child's turns within them and its own settings.
	Limits *TurnLimits `msgpack:"limits,omitempty" json:"limits,omitempty"`
	// RequestTimeoutMs is how long a request of this session waits for its
	// answer, in milliseconds, written by the coordinator: its start's
	// requestTimeoutMs (agents.open's, for a root), else its parent's
	// (ResolveRequestTimeout: at most its parent's); absent, the
	// coordinator's default (5 minutes) holds (docs/protocol.md §5.21).
	RequestTimeoutMs int64 `msgpack:"requestTimeoutMs,omitempty" json:"requestTimeoutMs,omitempty"`
	// Budgets are the ledgers this session draws on (brood_agents
	// budget.<id>, BudgetRecord), root-most first, written by the
	// coordinator: its parent's, and its own when its start named a
	// budget (then its id is last). Each model request, tool call and
	// child start of the session reserves against every one of them
	// (docs/protocol.md §5.5, "Budgets"). Absent: no budget.
	Budgets []string `msgpack:"budgets,omitempty" json:"budgets,omitempty"`
	// BudgetDeadlineAt is the earliest deadline of those budgets, epoch
	// ms (absent: none): a turn running past it ends BUDGET_EXHAUSTED.
	BudgetDeadlineAt int64 `msgpack:"budgetDeadlineAt,omitempty" json:"budgetDeadlineAt,omitempty"`
	// BudgetStartTokens, when set, says the coordinator took the first
	// model request's reservation at admission, in the ledger write it did
	// anyway (a one-shot child whose own budget is the only one it draws
	// on): that many tokens and one model request, reservation id the
	// session id. The child's first step uses it when its input estimate
	// fits, else releases it (docs/protocol.md §5.5, "Budgets").
	BudgetStartTokens int64 `msgpack:"budgetStartTokens,omitempty" json:"budgetStartTokens,omitempty"`
}

// ScopeRoot is the scope of a root session (Scope): roots' logs are
// written by their client or trusted host, never by a worker. No provider
// may be named so (MayOffer).
const ScopeRoot = "root"

// Scope is the scope of the session: the provider a child was started on,
// ScopeRoot for a session without one, a root (a lineage root, opened with
// a parent, too). Only coordinators write headers, and every child's names
// its provider, so a worker cannot make a child pass for a root or for
// another provider's. Subjects.Log takes it.
func (h SessionHeader) Scope() string {
	if h.Provider == "" {
		return ScopeRoot
	}
	return h.Provider
}

// ToolStructuredOutput is the name of the child-only tool that captures a
// structured output: its tool/call and tool/result events carry this name,
// and a run's structured value is read from them (docs/protocol.md §8).
const ToolStructuredOutput = "structured_output"

// Event types of the session log (docs/design.md §5; docs/upstream-behaviour.md §3.2).
const (
	EvTurnStart          = "turn/start"
	EvTurnEnd            = "turn/end"
	EvStepStart          = "step/start"
	EvStepEnd            = "step/end"
	EvUserMessage        = "user/message"
	EvAssistantMessage   = "assistant/message"
	EvToolCall           = "tool/call"
	EvToolResult         = "tool/result"
	EvInboxEnqueue       = "agent/inbox/enqueue"
	EvInboxDequeue       = "agent/inbox/dequeue"
	EvInboxDiscard       = "agent/inbox/discard"
	EvSessionEndSeed     = "session/end-seed"
	EvSubagentDescriptor = "subagent/descriptor"
	// EvAgentTakeover is log-only: a coordinator took the session over from
	// a host that stopped heartbeating while no turn was open. Being a write
	// fenced on the log's last record, it fences the lost host out of the
	// log: a host that comes back from a pause cannot append a claim (or a
	// first turn) after the takeover (docs/design.md §4, one writer per log).
	EvAgentTakeover = "agent/takeover"
	// EvModelRetry is log-only: a model request of the turn failed
	// temporarily (ModelRetryData) and the turn pauses until its next
	// attempt, inside the turn and before the step's step/start
	// (docs/protocol.md §8.3). Replay skips it.
	EvModelRetry = "model/retry"
)

// SessionEvent is one log entry {seq, type, time, data}; Seq is contiguous
// from 0 within a session; Time is epoch ms; Data is the MessagePack encoding
// of the type's data struct (TurnData, TurnEndData, ...), kept raw so a log
// round-trips byte for byte.
type SessionEvent struct {
	Seq  int64              `msgpack:"seq" json:"seq"`
	Type string             `msgpack:"type" json:"type"`
	Time int64              `msgpack:"time" json:"time"`
	Data msgpack.RawMessage `msgpack:"data" json:"-"`
}

// NewEvent encodes data into an event of type typ. Seq is assigned by the
// appender.
func NewEvent(typ string, timeMs int64, data any) (SessionEvent, error) {
	raw, err := Marshal(Msgpack, data)
	if err != nil {
		return SessionEvent{}, fmt.Errorf("encode %s data: %w", typ, err)
	}
	return SessionEvent{Type: typ, Time: timeMs, Data: raw}, nil
}

// Decode decodes the event's data into v.
func (e SessionEvent) Decode(v any) error {
	if len(e.Data) == 0 {
		return fmt.Errorf("event %d (%s) has no data", e.Seq, e.Type)
	}
	return Unmarshal(Msgpack, e.Data, v)
}

// MarshalJSON renders the event with its data decoded, for `brood log --json`.
func (e SessionEvent) MarshalJSON() ([]byte, error) {
	var data any
	if len(e.Data) > 0 {
		if err := Unmarshal(Msgpack, e.Data, &data); err != nil {
			return nil, err
		}
	}
	return json.Marshal(struct {
		Seq  int64  `json:"seq"`
		Type string `json:"type"`
		Time int64  `json:"time"`
		Data any    `json:"data"`
	}{e.Seq, e.Type, e.Time, ToJSONValue(data)})
}

// LogRecord is one message on a session's BROOD_LOG subject: one or more
// consecutive events, typically a whole step. Readers flatten records.
type LogRecord struct {
	Events []SessionEvent `msgpack:"events" json:"events"`
}

// TurnData is the data of turn/start.
type TurnData struct {
	Turn int64 `msgpack:"turn" json:"turn"`
}

// Turn-end reason kinds (docs/design.md §5).
const (
	TurnCompleted   = "completed"
	TurnAborted     = "aborted"
	TurnBlocked     = "blocked"
	TurnError       = "error"
	TurnMaxTokens   = "max-tokens"
	TurnInterrupted = "interrupted"
)

// Cancel causes recorded with an aborted turn.
const (
	CauseUser     = "user"
	CauseParent   = "parent"
	CauseDisposed = "disposed"
	CauseDrain    = "drain"
	CauseHostLost = "host-lost"
	// CauseDeadline is a host dispose's cause (HostRunRequest.Cause) when
	// a coordinator ends the subtree of a budget whose deadline passed
	// (docs/protocol.md §5.5, "Budgets"): the turn it cuts ends `error`,
	// code BUDGET_EXHAUSTED, naming the deadline, not `aborted`, and an
	// epoch it ends settles the same way.
	CauseDeadline = "deadline"
)

// TurnEndReason is {kind, cause?, error?, code?}: cause for aborted, error (a
// short diagnostic) for error, and code, the catalogue code of an error's
// class (MODEL_ERROR, LIMIT_EXCEEDED, DURABILITY_FAILED, INTERNAL), which a
// run's result carries as its errorCode (docs/protocol.md §8.4, §8.9).
type TurnEndReason struct {
	Kind  string `msgpack:"kind" json:"kind"`
	Cause string `msgpack:"cause,omitempty" json:"cause,omitempty"`
	Error string `msgpack:"error,omitempty" json:"error,omitempty"`
	Code  Code   `msgpack:"code,omitempty" json:"code,omitempty"`
}

// TurnEndData is the data of turn/end.
type TurnEndData struct {
	Turn   int64         `msgpack:"turn" json:"turn"`
	Reason TurnEndReason `msgpack:"reason" json:"reason"`
}

// StepData is the data of step/start and step/end.
type StepData struct {
	Turn int64 `msgpack:"turn" json:"turn"`
	Step int64 `msgpack:"step" json:"step"`
	// Model names the model that answered the step ("adapter/id"), on
	// step/start of an in-process agent's steps; absent on step/end and in
	// logs written before it was recorded.
	Model string `msgpack:"model,omitempty" json:"model,omitempty"`
}

// Message source kinds (docs/upstream-behaviour.md §3.4). A source is provenance,
// never authority.
const (
	SourceUser            = "user"
	SourceCoordinator     = "coordinator"
	SourceSubagentReport  = "subagent-report"
	SourceSubagentSettled = "subagent-settled"
	// SourceSubagentRequest is the notice of a descendant's request
	// (docs/protocol.md §5.21) to the nearest ancestor that takes requests.
	SourceSubagentRequest = "subagent-request"
)

// MessageSource records who produced a user message.
type MessageSource struct {
	Kind            string `msgpack:"kind" json:"kind"`
	Form            string `msgpack:"form,omitempty" json:"form,omitempty"`
	SenderSessionID string `msgpack:"senderSessionId,omitempty" json:"senderSessionId,omitempty"`
	Summary         string `msgpack:"summary,omitempty" json:"summary,omitempty"`
	// Usage, on a subagent-settled notice, is the settled epoch's usage:
	// the parent's log counts it into its subtree once, by the item's
	// messageId (docs/protocol.md §6.6).
	Usage *UsageSummary `msgpack:"usage,omitempty" json:"usage,omitempty"`
}

// UserMessageData is the data of user/message.
type UserMessageData struct {
	ID      string         `msgpack:"id" json:"id"`
	Turn    int64          `msgpack:"turn" json:"turn"`
	Content []ContentBlock `msgpack:"content" json:"content"`
	Source  MessageSource  `msgpack:"source" json:"source"`
}

// ToolCall is one tool call of an assistant message. Arguments is the raw JSON
// text exactly as the model produced it, never re-encoded (docs/design.md §3).
type ToolCall struct {
	ID        string `msgpack:"id" json:"id"`
	Name      string `msgpack:"name" json:"name"`
	Arguments string `msgpack:"arguments" json:"arguments"`
}

// AssistantMessage is what a model answered in one step. ReasoningContent is
// kept exactly as received: nil (absent) and "" differ (DeepSeek echoes it).
type AssistantMessage struct {
	Content          []ContentBlock `msgpack:"content" json:"content"`
	ToolCalls        []ToolCall     `msgpack:"toolCalls,omitempty" json:"toolCalls,omitempty"`
	ReasoningContent *string        `msgpack:"reasoningContent,omitempty" json:"reasoningContent,omitempty"`
}

// Usage is a model's token accounting for one step (one model request).
// Unknown marks a step whose source reported no token counts (an ACP agent
// that sends no usage with its answer): its InputTokens and OutputTokens
// are then 0 and mean nothing, never "spent nothing" (docs/protocol.md §6.6).
type Usage struct {
	InputTokens  int64 `msgpack:"inputTokens" json:"inputTokens"`
	OutputTokens int64 `msgpack:"outputTokens" json:"outputTokens"`
	Unknown      bool  `msgpack:"unknown,omitempty" json:"unknown,omitempty"`
}

// AssistantMessageData is the data of assistant/message. Interrupted marks the
// text streamed before a step was cut (cancel, max-tokens).
type AssistantMessageData struct {
	Turn        int64            `msgpack:"turn" json:"turn"`
	Step        int64            `msgpack:"step" json:"step"`
	Message     AssistantMessage `msgpack:"message" json:"message"`
	Usage       *Usage           `msgpack:"usage,omitempty" json:"usage,omitempty"`
	Interrupted bool             `msgpack:"interrupted,omitempty" json:"interrupted,omitempty"`
}

// ToolCallData is the data of tool/call. CallID is unique in the session
// (the id the call, this event and its result share); ModelCallID is the id
// the model gave, present only when the runtime had to rename a repeated one.
type ToolCallData struct {
	Turn        int64  `msgpack:"turn" json:"turn"`
	Step        int64  `msgpack:"step" json:"step"`
	CallID      string `msgpack:"callId" json:"callId"`
	Name        string `msgpack:"name" json:"name"`
	Arguments   string `msgpack:"arguments" json:"arguments"`
	ModelCallID string `msgpack:"modelCallId,omitempty" json:"modelCallId,omitempty"`
}

// ToolResultData is the data of tool/result.
type ToolResultData struct {
	Turn    int64          `msgpack:"turn" json:"turn"`
	Step    int64          `msgpack:"step" json:"step"`
	CallID  string         `msgpack:"callId" json:"callId"`
	Name    string         `msgpack:"name" json:"name"`
	Content []ContentBlock `msgpack:"content" json:"content"`
	IsError bool           `msgpack:"isError,omitempty" json:"isError,omitempty"`
	// Meta carries the tool's own facts about the call, log-only (the
	// subagent tool records the child's runId and childId).
	Meta map[string]string `msgpack:"meta,omitempty" json:"meta,omitempty"`
	// ChildUsage, log-only, is the usage of the child a foreground
	// delegation waited for (its result's): the parent's log counts its
	// subtree once (docs/protocol.md §6.6).
	ChildUsage *UsageSummary `msgpack:"childUsage,omitempty" json:"childUsage,omitempty"`
}

// InboxEnqueueData is the data of agent/inbox/enqueue: the agent saw an inbox
// item accepted (InboxSeq is its BROOD_INBOX stream sequence).
type InboxEnqueueData struct {
	MessageID string        `msgpack:"messageId" json:"messageId"`
	InboxSeq  Seq           `msgpack:"inboxSeq" json:"inboxSeq"`
	Source    MessageSource `msgpack:"source" json:"source"`
}

// TakeoverData is the data of agent/takeover: the host that was lost, the
// coordinator that took the session over, and the lease epoch it took.
type TakeoverData struct {
	HostID string `msgpack:"hostId" json:"hostId"`
	By     string `msgpack:"by" json:"by"`
	Epoch  int64  `msgpack:"epoch" json:"epoch"`
}

// ModelRetryData is the data of model/retry, and what continuable.state
// shows of a turn paused on a model retry (StateReply.ModelRetry): attempt
// Attempt of step Step's model request failed temporarily and the next
// attempt starts at NextAt (epoch ms), WaitMs (milliseconds) after the
// failure. Status is the endpoint's HTTP status (429, 5xx), 0 for a failure
// without one (a connection reset, an attempt's timeout); RetryAfterMs is
// its Retry-After in milliseconds, 0 when it sent none. Diagnostic is the
// failure's short diagnostic (no payloads, no secrets; cut as
// TruncateDiagnostic cuts).
type ModelRetryData struct {
	Turn         int64  `msgpack:"turn" json:"turn"`
	Step         int64  `msgpack:"step" json:"step"`
	Attempt      int64  `msgpack:"attempt" json:"attempt"`
	Status       int64  `msgpack:"status,omitempty" json:"status,omitempty"`
	RetryAfterMs int64  `msgpack:"retryAfterMs,omitempty" json:"retryAfterMs,omitempty"`
	WaitMs       int64  `msgpack:"waitMs" json:"waitMs"`
	NextAt       int64  `msgpack:"nextAt" json:"nextAt"`
	Diagnostic   string `msgpack:"diagnostic" json:"diagnostic"`
}

// InboxDequeueData is the data of agent/inbox/dequeue: the claim of one inbox
// item by a turn, logged before the turn uses it (docs/design.md §4).
type InboxDequeueData struct {
	MessageID string `msgpack:"messageId" json:"messageId"`
	InboxSeq  Seq    `msgpack:"inboxSeq" json:"inboxSeq"`
	Turn      int64  `msgpack:"turn" json:"turn"`
}

// InboxDiscardData is the data of agent/inbox/discard: accepted work dropped unrun.
type InboxDiscardData struct {
	MessageID string `msgpack:"messageId" json:"messageId"`
	InboxSeq  Seq    `msgpack:"inboxSeq" json:"inboxSeq"`
	Reason    string `msgpack:"reason" json:"reason"`
}

// DescriptorVersion is the current subagent/descriptor version (docs/upstream-behaviour.md §3.5).
const DescriptorVersion = 2

// DescriptorData is the hidden subagent/descriptor event (docs/upstream-behaviour.md
// §3.5, §1.9): how to rebuild a continuable child. Undeclared fields are
// omitted, never null.
type DescriptorData struct {
	Version       int         `msgpack:"version" json:"version"`
	Mode          string      `msgpack:"mode" json:"mode"`
	Provider      string      `msgpack:"provider" json:"provider"`
	Label         string      `msgpack:"label,omitempty" json:"label,omitempty"`
	AgentProvider string      `msgpack:"agentProvider,omitempty" json:"agentProvider,omitempty"`
	AgentModel    string      `msgpack:"agentModel,omitempty" json:"agentModel,omitempty"`
	Persona       *string     `msgpack:"persona,omitempty" json:"persona,omitempty"`
	ToolFilter    *ToolFilter `msgpack:"toolFilter,omitempty" json:"toolFilter,omitempty"`
	// OutputSchema is a one-shot child's requested output schema
	// (canonical JSON text, ResolvedOptions.OutputSchema), logged so a
	// host that continues the run after a host loss composes the child as
	// its first host did (docs/protocol.md §8.4); absent when none.
	OutputSchema string `msgpack:"outputSchema,omitempty" json:"outputSchema,omitempty"`
}

// PromptSource is the provenance of a child's first prompt, judged from the
// parent's header: a client's root (no parent, no origin: `brood run`, `brood
// start`, a program holding a root) speaks for the user; any other parent is
// an agent whose model wrote the prompt (the subagent tool, also in a Brood
// ACP agent's root), relayed by the coordinator as a parent's followup is.
func PromptSource(parent SessionHeader) MessageSource {
	if parent.ParentSession == "" && parent.Origin == "" {
		return MessageSource{Kind: SourceUser}
	}
	return MessageSource{Kind: SourceCoordinator, Form: "relay", SenderSessionID: parent.ID}
}
