package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// ContentBlock is one block of message content: {type: "text", text}. Framing
// marks text the runtime added around the caller's words (for example a fork
// child's note about inherited context); the scripted model ignores framing
// blocks, every other adapter sends them as ordinary text of the same message.
type ContentBlock struct {
	Type    string `msgpack:"type" json:"type"`
	Text    string `msgpack:"text" json:"text"`
	Framing bool   `msgpack:"framing,omitempty" json:"framing,omitempty"`
}

// BlockText is the only block type today.
const BlockText = "text"

// Text returns content made of one text block, or an empty (non-nil) list for "".
func Text(s string) []ContentBlock {
	if s == "" {
		return []ContentBlock{}
	}
	return []ContentBlock{{Type: BlockText, Text: s}}
}

// PlainText joins the text of every non-framing block with newlines.
func PlainText(blocks []ContentBlock) string {
	var parts []string
	for _, b := range blocks {
		if b.Type == BlockText && !b.Framing {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// AllText joins the text of every block, framing included.
func AllText(blocks []ContentBlock) string {
	var parts []string
	for _, b := range blocks {
		if b.Type == BlockText {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// Seq is a JetStream sequence or KV revision. It travels as a decimal string,
// because sequences may exceed 2^53 and JavaScript decoders would round them
// (docs/design.md §12).
type Seq uint64

func (s Seq) String() string { return strconv.FormatUint(uint64(s), 10) }

func (s Seq) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeString(s.String()) }

func (s *Seq) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterfaceLoose()
	if err != nil {
		return err
	}
	return s.set(v)
}

func (s Seq) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// UnmarshalJSON takes a decimal string, an unsigned integer or null. It
// reads b in place: a decoder per sequence would cost kilobytes for each
// few bytes of a request (an inbox.ack of many seqs).
func (s *Seq) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) == 0:
		return fmt.Errorf("sequence is empty")
	case string(b) == "null":
		return s.set(nil)
	case b[0] == '"':
		if len(b) >= 2 && b[len(b)-1] == '"' && !bytes.ContainsAny(b[1:len(b)-1], `"\`) {
			return s.set(string(b[1 : len(b)-1]))
		}
		var str string // escapes: let encoding/json read them
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		return s.set(str)
	case b[0] == '-' || (b[0] >= '0' && b[0] <= '9'):
		return s.set(json.Number(b))
	}
	return fmt.Errorf("sequence %.20s is not a decimal string or an unsigned integer", b)
}

func (s *Seq) set(v any) error {
	switch x := v.(type) {
	case nil:
		*s = 0
	case string:
		u, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return fmt.Errorf("sequence %q is not a decimal unsigned integer", x)
		}
		*s = Seq(u)
	case json.Number:
		u, err := strconv.ParseUint(string(x), 10, 64)
		if err != nil {
			return fmt.Errorf("sequence %s is not an unsigned integer", x)
		}
		*s = Seq(u)
	case int64:
		if x < 0 {
			return fmt.Errorf("sequence %d is negative", x)
		}
		*s = Seq(x)
	case uint64:
		*s = Seq(x)
	default:
		return fmt.Errorf("sequence has type %T, want a decimal string", v)
	}
	return nil
}

// Capabilities are the start-time features of a provider (seed: SubagentCapabilities).
// Each maps one-to-one to a start option: DepthLimit to maxDepth, the others by name.
type Capabilities struct {
	OutputSchema bool `msgpack:"outputSchema" json:"outputSchema"`
	DepthLimit   bool `msgpack:"depthLimit" json:"depthLimit"`
	ToolFilter   bool `msgpack:"toolFilter" json:"toolFilter"`
	Persona      bool `msgpack:"persona" json:"persona"`
}

// ProviderDescriptor is the static description of a provider (docs/design.md §3, §6).
// Tools names the global tools its agents offer, so a tool filter is validated
// before anything is created. All instances of one provider have equal
// descriptors (else DUPLICATE_PROVIDER).
type ProviderDescriptor struct {
	Name                  string       `msgpack:"name" json:"name"`
	Capabilities          Capabilities `msgpack:"capabilities" json:"capabilities"`
	InheritsParentContext bool         `msgpack:"inheritsParentContext" json:"inheritsParentContext"`
	Continuable           bool         `msgpack:"continuable" json:"continuable"`
	Tools                 []string     `msgpack:"tools" json:"tools"`
	// Remote marks a provider whose child is not a Brood agent of the host
	// (ACP): its runId is a fresh id distinct from the child id (seed:
	// SubagentRun.id). Brood's addition to the descriptor.
	Remote bool `msgpack:"remote,omitempty" json:"remote,omitempty"`
	// Models are the models the provider's agents answer with, the
	// default first (docs/protocol.md §9.1); absent when the provider does
	// not say (an ACP agent's model is the agent's business).
	Models []ModelInfo `msgpack:"models,omitempty" json:"models,omitempty"`
	// Limits are the turn limits the provider's workers are set to
	// (docs/protocol.md §9.1, §10): a start may ask for less, never more;
	// absent when the provider does not describe them (a start's `limits`
	// is then UNSUPPORTED_CAPABILITY).
	Limits *TurnLimits `msgpack:"limits,omitempty" json:"limits,omitempty"`
	// ApproveTools names tools of Tools that every session of the provider
	// asks approval for before each call, whatever its start says (a
	// deployment's choice: an MCP server's tools, subagent); sorted,
	// absent when none (docs/protocol.md §5.5, §9.1). Brood's addition.
	ApproveTools []string `msgpack:"approveTools,omitempty" json:"approveTools,omitempty"`
}

// ModelInfo names a model: the adapter that speaks to it (scripted,
// openai) and the model's id there (deepseek-chat; the scripted model's
// id is "scripted").
type ModelInfo struct {
	Adapter string `msgpack:"adapter" json:"adapter"`
	ID      string `msgpack:"id" json:"id"`
}

// String is "adapter/id".
func (m ModelInfo) String() string { return m.Adapter + "/" + m.ID }

// Equal reports whether two descriptors describe the same provider.
func (d ProviderDescriptor) Equal(o ProviderDescriptor) bool {
	if d.Name != o.Name || d.Capabilities != o.Capabilities ||
		d.InheritsParentContext != o.InheritsParentContext || d.Continuable != o.Continuable ||
		d.Remote != o.Remote || len(d.Tools) != len(o.Tools) || !slices.Equal(d.ApproveTools, o.ApproveTools) {
		return false
	}
	for i := range d.Tools {
		if d.Tools[i] != o.Tools[i] {
			return false
		}
	}
	if d.Limits != nil && o.Limits != nil && *d.Limits != *o.Limits {
		return false // absent limits agree with any, as absent models do
	}
	if len(d.Models) == 0 || len(o.Models) == 0 {
		// A descriptor that names no model (a host built as a library
		// whose model factory does not say, an older worker) agrees with
		// any: only two that both name their models can disagree.
		return true
	}
	if len(d.Models) != len(o.Models) {
		return false
	}
	for i := range d.Models {
		if d.Models[i] != o.Models[i] {
			return false
		}
	}
	return true
}

// HasTool reports whether the provider's agents offer the global tool name.
func (d ProviderDescriptor) HasTool(name string) bool {
	for _, t := range d.Tools {
		if t == name {
			return true
		}
	}
	return false
}

// ToolFilter restricts a child's global tools (docs/upstream-behaviour.md §1.7): allow
// is applied before deny; at least one must be present. A nil list is absent;
// an empty allow list hides every global tool.
type ToolFilter struct {
	Allow []string `msgpack:"allow" json:"allow"`
	Deny  []string `msgpack:"deny" json:"deny"`
}

// StopReason says why a run ended (seed: SubagentStopReason). Consumers branch
// on the known values and treat any other as a failure.
type StopReason string

const (
	StopCompleted StopReason = "completed"
	StopAborted   StopReason = "aborted"
	StopError     StopReason = "error"
	StopMaxTokens StopReason = "max-tokens"
	StopRefusal   StopReason = "refusal"
)

// DiagnosticBytesMax bounds SubagentResult.Diagnostic (docs/upstream-behaviour.md §1.10).
const DiagnosticBytesMax = 4096

// SubagentResult is the terminal outcome of a run or epoch (seed: SubagentResult).
// Output is the child's final assistant output (docs/upstream-behaviour.md §3.8), never
// nil on the wire; OutputFrom names the message it came from (absent when
// Output is empty); Structured is present only after a requested outputSchema
// was satisfied; Diagnostic (≤ 4096 bytes, never secrets or payloads) and
// ErrorCode explain non-completed results.
type SubagentResult struct {
	Output     []ContentBlock `msgpack:"output" json:"output"`
	OutputFrom *OutputSource  `msgpack:"outputFrom,omitempty" json:"outputFrom,omitempty"`
	Structured any            `msgpack:"structured" json:"structured,omitempty"`
	StopReason StopReason     `msgpack:"stopReason" json:"stopReason"`
	Diagnostic string         `msgpack:"diagnostic,omitempty" json:"diagnostic,omitempty"`
	ErrorCode  Code           `msgpack:"errorCode,omitempty" json:"errorCode,omitempty"`
	// Permissions counts the permission requests an ACP child made and how
	// they were answered (acp/permission events); absent when none.
	Permissions *PermissionCounts `msgpack:"permissions,omitempty" json:"permissions,omitempty"`
	// Usage is what the run or epoch spent, its own and its subtree's
	// (docs/protocol.md §6.6); absent from a worker that predates it and
	// for a child never started.
	Usage *UsageSummary `msgpack:"usage,omitempty" json:"usage,omitempty"`
}

// PermissionCounts counts a child's permission requests (ACP
// `session/request_permission`): Requested = Granted + Denied.
type PermissionCounts struct {
	Requested int64 `msgpack:"requested" json:"requested"`
	Granted   int64 `msgpack:"granted" json:"granted"`
	Denied    int64 `msgpack:"denied" json:"denied"`
}

// OutputSource names the assistant/message a result's output came from: its
// seq in the child's log, its turn and step, and Last, whether it is the
// child's last assistant message. The output rule skips empty messages
// (docs/upstream-behaviour.md §3.8), so when the child's last message was empty the
// output is an earlier one (a preamble such as "Let me look first.") and
// Last is false: a parent can tell it is not a final answer (issue 14).
type OutputSource struct {
	Seq  int64 `msgpack:"seq" json:"seq"`
	Turn int64 `msgpack:"turn" json:"turn"`
	Step int64 `msgpack:"step" json:"step"`
	Last bool  `msgpack:"last" json:"last"`
}

// TruncateDiagnostic cuts s to at most DiagnosticBytesMax bytes at a UTF-8
// boundary, marking the cut (docs/upstream-behaviour.md §1.10).
func TruncateDiagnostic(s string) string {
	if len(s) <= DiagnosticBytesMax {
		return s
	}
	const marker = " …[truncated]"
	cut := DiagnosticBytesMax - len(marker)
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// ParentRef names the acting parent: its session id and the credential of its
// current live agent (docs/design.md §7).
type ParentRef struct {
	SessionID  string `msgpack:"sessionId" json:"sessionId"`
	Credential string `msgpack:"credential" json:"credential"`
}

// StartOptions are the optional start-time features of a one-shot run
// (seed: SubagentStartRequest; docs/upstream-behaviour.md §1.3–§1.8). Each needs the
// matching provider capability. MaxDepth is kept untyped so that -1, 1.5, NaN
// and 2^53 reach validation and get INVALID_ARGUMENT instead of a decode error.
type StartOptions struct {
	OutputSchema any         `msgpack:"outputSchema" json:"outputSchema,omitempty"`
	MaxDepth     any         `msgpack:"maxDepth" json:"maxDepth,omitempty"`
	ToolFilter   *ToolFilter `msgpack:"toolFilter,omitempty" json:"toolFilter,omitempty"`
	Persona      *string     `msgpack:"persona,omitempty" json:"persona,omitempty"`
	// AutoApprove names tools that need approval which the child may run
	// without asking (ResolveAutoApprove; docs/protocol.md §5.5); nil when
	// absent. Any provider takes it: a name outside its tools is refused.
	AutoApprove []string `msgpack:"autoApprove,omitempty" json:"autoApprove,omitempty"`
	// ApproveTools names more tools the child (and every descendant) must
	// ask approval for before each call, beyond those that always ask
	// (ResolveApproveTools; docs/protocol.md §5.5); nil when absent. Any
	// provider takes it: a name outside its tools is refused.
	ApproveTools []string `msgpack:"approveTools,omitempty" json:"approveTools,omitempty"`
	// Label is a short display label (the subagent tool's description).
	// Deprecated: send the request's top-level label (documented in both
	// runs.start and continuable.start); this place is still accepted.
	Label string `msgpack:"label,omitempty" json:"label,omitempty"`
	// Model chooses among the models the provider's descriptor offers
	// ("adapter/id", or an id one model has); absent: the parent's chosen
	// model when the provider offers it, else the provider's default
	// (docs/protocol.md §5.5, ResolveChildChoice).
	Model string `msgpack:"model,omitempty" json:"model,omitempty"`
	// Limits tighten the child's turn limits below its parent's and its
	// worker's; a limit above them is INVALID_ARGUMENT (ResolveChildChoice).
	Limits *TurnLimits `msgpack:"limits,omitempty" json:"limits,omitempty"`
	// RequestTimeoutMs is how long each request of the child and its
	// descendants waits for an answer, in milliseconds (1 to
	// RequestTimeoutMsMax, 24 hours); absent (0): its parent's, else the
	// coordinator's default (5 minutes). It is never above the parent's
	// (ResolveRequestTimeout: INVALID_ARGUMENT above it, LIMIT_EXCEEDED
	// above the maximum). Any provider takes it.
	RequestTimeoutMs int64 `msgpack:"requestTimeoutMs,omitempty" json:"requestTimeoutMs,omitempty"`
	// Budget caps what the child and its whole subtree spend (Budget;
	// docs/protocol.md §5.5, "Budgets"): at most what remains of the
	// budgets its parent draws on (else LIMIT_EXCEEDED); nil draws on the
	// parent's alone.
	Budget *Budget `msgpack:"budget,omitempty" json:"budget,omitempty"`
}

// RunStartRequest is the body of runs.start (docs/design.md §7). Notify is the
// subject the settled RunNotice is published to; the caller subscribes to it
// before starting (one wildcard subscription per connection).
type RunStartRequest struct {
	Provider string         `msgpack:"provider" json:"provider"`
	Parent   ParentRef      `msgpack:"parent" json:"parent"`
	Label    string         `msgpack:"label,omitempty" json:"label,omitempty"`
	Prompt   []ContentBlock `msgpack:"prompt" json:"prompt"`
	Notify   string         `msgpack:"notify,omitempty" json:"notify,omitempty"`
	Options  StartOptions   `msgpack:"options" json:"options"`
}

// LabelBytesMax bounds a child's label (a continuable child's is required
// and not blank); a longer one is INVALID_ARGUMENT.
const LabelBytesMax = 256

// NotifySubjectBytesMax bounds a runs.start notify subject; a longer one is
// INVALID_ARGUMENT.
const NotifySubjectBytesMax = 512

// OneLabel merges a request's top-level label with one sent under options
// (both places are accepted; the top level is the documented one): either
// alone, or both equal. Two different labels are INVALID_ARGUMENT.
func OneLabel(top, inOptions string) (string, error) {
	switch {
	case inOptions == "" || inOptions == top:
		return top, nil
	case top == "":
		return inOptions, nil
	}
	return "", Errorf(CodeInvalidArgument, "label %q and options.label %q differ: send one (the top-level label)", top, inOptions)
}

func (r *RunStartRequest) normalizeNumbers() {
	r.Options.OutputSchema = NormalizeNumbers(r.Options.OutputSchema)
	r.Options.MaxDepth = NormalizeNumbers(r.Options.MaxDepth)
}

// RunStartReply answers runs.start at publication. RunID equals ChildID for
// local providers and is a fresh id for remote ones (seed: SubagentRun.id).
//
// State is RunQueued when the parent was at its live-children limit and the
// start waits in the parent's start queue (docs/protocol.md §5.5, "The start
// queue"): the run starts once a slot frees, in the order the starts were
// queued, and its RunNotice comes as for any run; absent (""), the child was
// published.
type RunStartReply struct {
	RunID   string `msgpack:"runId" json:"runId"`
	ChildID string `msgpack:"childId" json:"childId"`
	State   string `msgpack:"state,omitempty" json:"state,omitempty"`
}

// RunNotice is published on a run's notify subject once it settled.
type RunNotice struct {
	RunID         string         `msgpack:"runId" json:"runId"`
	ChildID       string         `msgpack:"childId" json:"childId"`
	ParentSession string         `msgpack:"parentSession" json:"parentSession"`
	Provider      string         `msgpack:"provider" json:"provider"`
	Result        SubagentResult `msgpack:"result" json:"result"`
}

// RunRef names a run and the authority acting on it: the parent's credential
// or a user grant (docs/design.md §7, Settlement 4). WaitMs (runs.await only) is how
// long to wait for settlement, 0 for an immediate answer; capped by the
// coordinator's RunAwaitWaitMax.
type RunRef struct {
	RunID  string     `msgpack:"runId" json:"runId"`
	Parent *ParentRef `msgpack:"parent,omitempty" json:"parent,omitempty"`
	Grant  string     `msgpack:"grant,omitempty" json:"grant,omitempty"`
	WaitMs int64      `msgpack:"waitMs,omitempty" json:"waitMs,omitempty"`
}

// Run states in brood_runs.
const (
	RunRunning = "running"
	RunSettled = "settled"
	// RunQueued is a run whose start waits in its parent's start queue
	// (StartQueueRecord): it has no run record yet; runs.await and
	// children.list say it, runs.dispose cancels it.
	RunQueued = "queued"
)

// RunStatus answers runs.await and runs.dispose.
type RunStatus struct {
	RunID   string          `msgpack:"runId" json:"runId"`
	ChildID string          `msgpack:"childId" json:"childId"`
	State   string          `msgpack:"state" json:"state"`
	Result  *SubagentResult `msgpack:"result,omitempty" json:"result,omitempty"`
}

// AgentsOpenRequest opens a root agent for a client (docs/design.md §7). Cwd must be
// an absolute path; it becomes the root session's workspace.
type AgentsOpenRequest struct {
	Cwd   string `msgpack:"cwd" json:"cwd"`
	Label string `msgpack:"label,omitempty" json:"label,omitempty"`
	// Reopenable roots (origin OriginReopenable) may be reopened later by
	// SessionID; Lineage narrows a new root to a delegation; SessionID
	// reopens an existing reopenable root with a fresh credential (Cwd and
	// Lineage are then ignored). See acp.go.
	Reopenable bool         `msgpack:"reopenable,omitempty" json:"reopenable,omitempty"`
	Lineage    *RootLineage `msgpack:"lineage,omitempty" json:"lineage,omitempty"`
	SessionID  string       `msgpack:"sessionId,omitempty" json:"sessionId,omitempty"`
	// Grant is a user grant (authority.user): reopening a root takes over its
	// identity, so only a trusted host acting for the user may do it.
	Grant string `msgpack:"grant,omitempty" json:"grant,omitempty"`
	// RequestTimeoutMs is how long each request in the new root's tree
	// waits for an answer, in milliseconds, as StartOptions.RequestTimeoutMs
	// (CheckRequestTimeout); its children may only tighten it. Ignored on a
	// reopen (SessionID), which keeps the root's header.
	RequestTimeoutMs int64 `msgpack:"requestTimeoutMs,omitempty" json:"requestTimeoutMs,omitempty"`
	// Budget caps what the root's whole tree spends (Budget;
	// docs/protocol.md §5.2); nil: no budget. Not with SessionID (a
	// reopened root keeps the budget it had).
	Budget *Budget `msgpack:"budget,omitempty" json:"budget,omitempty"`
}

// AgentsOpenReply carries the root's session id and credential. The root is
// live until ExpiresAt (epoch ms) unless renewed with agents.renew.
type AgentsOpenReply struct {
	SessionID  string `msgpack:"sessionId" json:"sessionId"`
	Credential string `msgpack:"credential" json:"credential"`
	LeaseMs    int64  `msgpack:"leaseMs" json:"leaseMs"`
	ExpiresAt  int64  `msgpack:"expiresAt" json:"expiresAt"`
}

// AgentsRenewReply answers agents.renew with the new expiry (epoch ms).
type AgentsRenewReply struct {
	ExpiresAt int64 `msgpack:"expiresAt" json:"expiresAt"`
}

// ProvidersListReply lists the live providers, sorted by name, with the number
// of live instances of each.
type ProvidersListReply struct {
	Providers []ProviderDescriptor `msgpack:"providers" json:"providers"`
	Instances map[string]int       `msgpack:"instances" json:"instances"`
}

// Empty is the body of requests and replies that carry nothing.
type Empty struct{}

// LifecycleEvent is a subagent/start or subagent/end event on BROOD_EVENTS
// under the parent's id (seed: SubagentRunInfo, SubagentRunEndInfo;
// docs/upstream-behaviour.md §3.7). ID is the child id (or the remote run id).
type LifecycleEvent struct {
	Type                 string         `msgpack:"type" json:"type"`
	RunID                string         `msgpack:"runId" json:"runId"`
	Provider             string         `msgpack:"provider" json:"provider"`
	ID                   string         `msgpack:"id" json:"id"`
	ParentSession        string         `msgpack:"parentSession" json:"parentSession"`
	Local                bool           `msgpack:"local" json:"local"`
	Mode                 string         `msgpack:"mode" json:"mode"`
	Time                 int64          `msgpack:"time" json:"time"`
	StopReason           StopReason     `msgpack:"stopReason,omitempty" json:"stopReason,omitempty"`
	LastAssistantMessage []ContentBlock `msgpack:"lastAssistantMessage,omitempty" json:"lastAssistantMessage,omitempty"`
	ErrorCode            Code           `msgpack:"errorCode,omitempty" json:"errorCode,omitempty"`
	// Usage, on end events, is the run's or epoch's result's usage
	// (docs/protocol.md §6.6).
	Usage *UsageSummary `msgpack:"usage,omitempty" json:"usage,omitempty"`
	// Label is the child's display label (its descriptor's: the
	// subagent tool's description, a continuable child's label), on start
	// events whose host knew it; absent otherwise (docs/protocol.md §7.5).
	Label string `msgpack:"label,omitempty" json:"label,omitempty"`
	// Takeovers, on the end event of a one-shot run or of a continuable
	// child's epoch, counts the times its host was lost and the session
	// taken over (continued on another host, or ended HOST_LOST)
	// (RunRecord.Takeovers; docs/protocol.md §8.4); absent when none.
	Takeovers int64 `msgpack:"takeovers,omitempty" json:"takeovers,omitempty"`
	// Seq is the event's BROOD_EVENTS stream sequence: absent in the stored
	// body, set when the event is read through events.read or events.follow.
	Seq Seq `msgpack:"seq,omitempty" json:"seq,omitempty"`
}

// Lifecycle event types.
const (
	LifecycleStart = "subagent/start"
	LifecycleEnd   = "subagent/end"
)

// Descriptor modes.
const (
	ModeOneShot     = "one-shot"
	ModeContinuable = "continuable"
)

func (r *SubagentResult) normalizeNumbers() {
	if r != nil {
		r.Structured = NormalizeNumbers(r.Structured)
	}
}

func (n *RunNotice) normalizeNumbers() { n.Result.normalizeNumbers() }
func (s *RunStatus) normalizeNumbers() { s.Result.normalizeNumbers() }
func (r *RunRecord) normalizeNumbers() { r.Result.normalizeNumbers() }
