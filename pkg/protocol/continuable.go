package protocol

// Continuable children (docs/design.md §7; the seed's SubagentService).

// Authority is who acts on a continuable child: the credential of the exact
// live parent agent, or a user grant minted by authority.user (docs/design.md §7).
// Source and SenderSessionID of a message are provenance only.
type Authority struct {
	Parent *ParentRef `msgpack:"parent,omitempty" json:"parent,omitempty"`
	Grant  string     `msgpack:"grant,omitempty" json:"grant,omitempty"`
}

// ContinuableOptions are a continuable child's composition: recorded in its
// descriptor and used again on every cold resume. (No outputSchema: that is
// a one-shot result contract, docs/upstream-behaviour.md §3.5.)
type ContinuableOptions struct {
	MaxDepth   any         `msgpack:"maxDepth" json:"maxDepth,omitempty"`
	ToolFilter *ToolFilter `msgpack:"toolFilter,omitempty" json:"toolFilter,omitempty"`
	Persona    *string     `msgpack:"persona,omitempty" json:"persona,omitempty"`
	// AutoApprove is as in StartOptions.
	AutoApprove []string `msgpack:"autoApprove,omitempty" json:"autoApprove,omitempty"`
	// ApproveTools is as in StartOptions.
	ApproveTools []string `msgpack:"approveTools,omitempty" json:"approveTools,omitempty"`
	// Label is accepted here too, as in runs.start's options; the request's
	// top-level label is the documented place (protocol.OneLabel).
	Label string `msgpack:"label,omitempty" json:"label,omitempty"`
	// Model and Limits are as in StartOptions; recorded in the child's
	// header, so they hold for every turn and survive cold resume.
	Model  string      `msgpack:"model,omitempty" json:"model,omitempty"`
	Limits *TurnLimits `msgpack:"limits,omitempty" json:"limits,omitempty"`
	// RequestTimeoutMs is as in StartOptions; recorded in the child's header.
	RequestTimeoutMs int64 `msgpack:"requestTimeoutMs,omitempty" json:"requestTimeoutMs,omitempty"`
	// Budget is as in StartOptions.
	Budget *Budget `msgpack:"budget,omitempty" json:"budget,omitempty"`
}

// ContinuableStartRequest is the body of continuable.start. Label is
// required; ChildID reserves a caller-chosen id (^[A-Za-z0-9_-]{1,64}$; an id
// ever used is DUPLICATE_CHILD).
type ContinuableStartRequest struct {
	Provider string             `msgpack:"provider" json:"provider"`
	Parent   ParentRef          `msgpack:"parent" json:"parent"`
	Label    string             `msgpack:"label" json:"label"`
	ChildID  string             `msgpack:"childId,omitempty" json:"childId,omitempty"`
	Prompt   []ContentBlock     `msgpack:"prompt" json:"prompt"`
	Options  ContinuableOptions `msgpack:"options" json:"options"`
}

func (r *ContinuableStartRequest) normalizeNumbers() {
	r.Options.MaxDepth = NormalizeNumbers(r.Options.MaxDepth)
}

// ContinuableStartReply answers once the child's inbox accepted the prompt,
// or once the start waits in its parent's start queue (State StateQueued:
// the parent was at its live-children limit; docs/protocol.md §5.5, "The
// start queue"). A queued child's ChildID and MessageID are the ids its
// session and its first message will have once it starts; until then it
// has no session (no header, log or inbox).
type ContinuableStartReply struct {
	ChildID   string `msgpack:"childId" json:"childId"`
	MessageID string `msgpack:"messageId" json:"messageId"`
	State     string `msgpack:"state,omitempty" json:"state,omitempty"`
}

// FollowupRequest is the body of continuable.followup. IdempotencyKey
// (^[A-Za-z0-9_-]{1,64}$) makes a retry inside the 2-minute window answer the
// original messageId.
type FollowupRequest struct {
	ChildID        string         `msgpack:"childId" json:"childId"`
	Authority      Authority      `msgpack:"authority" json:"authority"`
	Message        []ContentBlock `msgpack:"message" json:"message"`
	Source         *MessageSource `msgpack:"source,omitempty" json:"source,omitempty"`
	IdempotencyKey string         `msgpack:"idempotencyKey,omitempty" json:"idempotencyKey,omitempty"`
}

// FollowupReply carries the accepted message's id. Held, when set, says why
// the accepted message waits instead of running now (a drain holds the
// child's admission closed: it runs once the drain is lifted).
type FollowupReply struct {
	MessageID string `msgpack:"messageId" json:"messageId"`
	Held      string `msgpack:"held,omitempty" json:"held,omitempty"`
}

// Activation states (seed: ActivationState; `none` is the seed's undefined).
const (
	StateRunning = "running"
	StateWaiting = "waiting"
	StateSettled = "settled"
	StateNone    = "none"
	// StatePaused: a continuable child's turn waits at its budget's cap
	// for a raise (budget.raise; docs/protocol.md §5.5, "Pause and
	// raise"). The turn is open and continues the same turn once raised.
	StatePaused = "paused"
	// StateQueued: a continuable child whose start waits in its parent's
	// start queue (continuable.state, continuable.start's reply; the same
	// word as RunQueued).
	StateQueued = RunQueued
)

// ChildRef names a continuable child and the authority asking about it.
type ChildRef struct {
	ChildID   string    `msgpack:"childId" json:"childId"`
	Authority Authority `msgpack:"authority" json:"authority"`
}

// StateReply answers continuable.state. Queued counts the accepted messages
// still waiting in the child's inbox (unclaimed), answered by the coordinator.
// ModelRetry, with state running, says the running turn is paused until
// the next attempt of a model request that failed temporarily (the data of
// its last model/retry event); absent otherwise.
type StateReply struct {
	ChildID    string          `msgpack:"childId" json:"childId"`
	State      string          `msgpack:"state" json:"state"`
	HostID     string          `msgpack:"hostId,omitempty" json:"hostId,omitempty"`
	RunID      string          `msgpack:"runId,omitempty" json:"runId,omitempty"`
	Queued     uint64          `msgpack:"queued,omitempty" json:"queued,omitempty"`
	ModelRetry *ModelRetryData `msgpack:"modelRetry,omitempty" json:"modelRetry,omitempty"`
	// BudgetPause, with state paused, is the budget request the turn
	// waits on (its request/open data; the request record says which
	// limit: requests.get).
	BudgetPause *RequestOpenData `msgpack:"budgetPause,omitempty" json:"budgetPause,omitempty"`
}

// InterruptRequest is the body of continuable.interrupt: it stops the
// target's current turn only and keeps its queue parked until the next send
// (docs/upstream-behaviour.md §5.11). Authority: a user grant, or the credential of a
// live ancestor of the target.
type InterruptRequest struct {
	ChildID   string    `msgpack:"childId" json:"childId"`
	Authority Authority `msgpack:"authority" json:"authority"`
}

// InterruptReply answers continuable.interrupt: Interrupted is true when a
// live activation of the child got the interrupt, false when there was none
// (an accepted no-op).
type InterruptReply struct {
	ChildID     string `msgpack:"childId" json:"childId"`
	Interrupted bool   `msgpack:"interrupted" json:"interrupted"`
}

// ReportRequest is the body of continuable.report: the child (by its own
// credential) sends content to its live parent, joining the parent's next
// step (docs/upstream-behaviour.md §5.13).
type ReportRequest struct {
	Child   ParentRef      `msgpack:"child" json:"child"`
	Content []ContentBlock `msgpack:"content" json:"content"`
}

// DrainRequest is the body of continuable.drain. No parents and no children:
// every activation, and admission to continuable children stays closed
// until a drain with Lift reopens it. Parents: the descendants of each
// (admission below them stays closed while they stay live, or until lifted).
// Parent plus Children: those direct children of one parent and their
// subtrees (admission untouched). Children without Parent (user grant only):
// those children, whoever their parent, and their subtrees. While admission
// is closed, continuable.start answers DRAINING and followups are accepted
// but held (FollowupReply.Held): accepted inbox items are never dropped, they
// wait and run once admission reopens. Turns a drain ends are logged
// `aborted` with cause `drain`. Authority: a user grant, or (for the children
// of one parent) that parent's credential. Lift (with a grant) removes the
// drain markers of the given scope instead of draining.
type DrainRequest struct {
	Authority Authority `msgpack:"authority" json:"authority"`
	Parents   []string  `msgpack:"parents,omitempty" json:"parents,omitempty"`
	Parent    string    `msgpack:"parent,omitempty" json:"parent,omitempty"`
	Children  []string  `msgpack:"children,omitempty" json:"children,omitempty"`
	Lift      bool      `msgpack:"lift,omitempty" json:"lift,omitempty"`
}

// DescendantsDisposeRequest is the body of descendants.dispose: the agent
// (with its own credential; its lease may be ending) whose live continuable
// descendants are to be disposed, child first. A one-shot run's host sends it
// when the run's turn is over, before the run settles (issue 14). Answered
// with a DrainReply.
type DescendantsDisposeRequest struct {
	Agent ParentRef `msgpack:"agent" json:"agent"`
}

// DrainReply lists the activations the drain disposed, child-first.
type DrainReply struct {
	Disposed []string `msgpack:"disposed" json:"disposed"`
	Failed   []string `msgpack:"failed,omitempty" json:"failed,omitempty"`
}

// DrainsListRequest is the body of continuable.drains (user grant).
type DrainsListRequest struct {
	Authority Authority `msgpack:"authority" json:"authority"`
}

// DrainMarker is one drain marker: Root is empty for the global drain.
// CreatedAt is epoch ms (0 for a marker written before it was recorded);
// Holds says what it keeps closed now: "until lifted", "while ROOT stays
// live, or until lifted", or "nothing" once its root ended.
type DrainMarker struct {
	Root      string `msgpack:"root,omitempty" json:"root,omitempty"`
	CreatedAt int64  `msgpack:"createdAt,omitempty" json:"createdAt,omitempty"`
	Holds     string `msgpack:"holds" json:"holds"`
	Active    bool   `msgpack:"active" json:"active"`
}

// DrainsListReply lists the drain markers, the global one first, then by root.
type DrainsListReply struct {
	Drains []DrainMarker `msgpack:"drains" json:"drains"`
}

// ChildrenListRequest is the body of children.list. Parent "" (user grant
// only) lists every continuable child with a live activation, whoever its
// parent, with parentId and depth set.
type ChildrenListRequest struct {
	Parent      string    `msgpack:"parent,omitempty" json:"parent,omitempty"`
	Authority   Authority `msgpack:"authority" json:"authority"`
	Descendants bool      `msgpack:"descendants,omitempty" json:"descendants,omitempty"`
}

// Child row kinds and activities (docs/upstream-behaviour.md §5.15).
const (
	RowChild      = "child"
	RowDiagnostic = "diagnostic"

	ActivityRunning  = "running"
	ActivityInactive = "inactive"

	DiagnosticCorrupt     = "corrupt"
	DiagnosticUnavailable = "unavailable"
	// DiagnosticCreating: a live child whose descriptor is not logged yet.
	DiagnosticCreating = "creating"
	// DiagnosticNotStarted: a child with no live agent and an empty log, a
	// start refused or given up after its header was written (the run's
	// result says why; docs/protocol.md §5.14). Not a damaged child.
	DiagnosticNotStarted = "not-started"
)

// ChildRow is one row of children.list: a child, or a diagnostic for a child
// whose identity cannot be read (a damaged child never fails the list).
type ChildRow struct {
	Kind        string `msgpack:"kind" json:"kind"`
	ID          string `msgpack:"id" json:"id"`
	Activity    string `msgpack:"activity,omitempty" json:"activity,omitempty"`
	State       string `msgpack:"state,omitempty" json:"state,omitempty"`
	HasChildren bool   `msgpack:"hasChildren,omitempty" json:"hasChildren,omitempty"`
	Mode        string `msgpack:"mode,omitempty" json:"mode,omitempty"`
	Label       string `msgpack:"label,omitempty" json:"label,omitempty"`
	Provider    string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Reason      string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	ParentID    string `msgpack:"parentId,omitempty" json:"parentId,omitempty"`
	Depth       int    `msgpack:"depth,omitempty" json:"depth,omitempty"`
	CreatedAt   int64  `msgpack:"createdAt,omitempty" json:"createdAt,omitempty"`
	// Usage, on child rows, is what the child spent over its whole log so
	// far, every run or epoch: its own and its subtree's (docs/protocol.md
	// §6.6).
	Usage *UsageSummary `msgpack:"usage,omitempty" json:"usage,omitempty"`
}

// ChildrenListReply lists rows ordered by createdAt then id (pre-order for descendants).
type ChildrenListReply struct {
	Rows []ChildRow `msgpack:"rows" json:"rows"`
}

// UserGrantReply carries a user grant and its expiry (epoch ms). User is
// its scope: the grant acts only on the trees of roots that NATS user
// opened; absent, it acts on every session (minted on the permission-gated
// <p>.v1.coord.authority.user; docs/security.md).
type UserGrantReply struct {
	Grant     string `msgpack:"grant" json:"grant"`
	ExpiresAt int64  `msgpack:"expiresAt" json:"expiresAt"`
	User      string `msgpack:"user,omitempty" json:"user,omitempty"`
}

// UserGrantRecord is a minted grant in brood_agents under `grant.<hash>`;
// User is its scope as in UserGrantReply.
type UserGrantRecord struct {
	ExpiresAt int64  `msgpack:"expiresAt" json:"expiresAt"`
	MintedBy  string `msgpack:"mintedBy" json:"mintedBy"`
	User      string `msgpack:"user,omitempty" json:"user,omitempty"`
}

// OwnershipRecord is the set of live continuable children a continuable
// parent owns, in brood_agents under `owns.<parentSession>`. A parent with
// any is `waiting` and cannot settle (docs/design.md §7, Ownership).
type OwnershipRecord struct {
	Children []string `msgpack:"children" json:"children"`
}

// EpochEndRequest is what a host sends on
// `<prefix>.v1.epochend.<provider>.<childId>` (Subjects.EpochEnd) once it
// settled run RunID, an epoch of continuable child childId of provider
// provider (docs/protocol.md §9.4 step 6). A coordinator then, in this
// order: enqueues the subagent-settled notice of the run's result into the
// inbox of the run's parent (idempotency key settled-<runId>) if the
// parent's lease is live and not ending and AncestorEnded is false; removes
// the edge Owner → childId from Owner's ownership record; wakes Owner. The
// reply is Empty once all of that landed, or an error: INVALID_ARGUMENT (no
// child, owner or run id), UNAUTHORIZED (run RunID is not, by its spec, an
// epoch of the child of that provider, or its state is not settled;
// nothing is done), UNAVAILABLE (retry: every step is idempotent).
type EpochEndRequest struct {
	Owner string `msgpack:"owner" json:"owner"`
	RunID string `msgpack:"runId" json:"runId"`
	// AncestorEnded: an ancestor of the child is an ended one-shot run,
	// whose end disposes the parent too: the parent gets no notice
	// (store.EpochEnd.AncestorEnded).
	AncestorEnded bool `msgpack:"ancestorEnded,omitempty" json:"ancestorEnded,omitempty"`
}

// ChildSlotsRecord is a parent's live-children slots, in brood_agents under
// `slots.<parentSession>` (docs/protocol.md §7.6): the children admitted
// under the live-children limit and those resumed cold, written by
// coordinators by compare-and-set.
type ChildSlotsRecord struct {
	Slots []ChildSlot `msgpack:"slots" json:"slots"`
}

// ChildSlot is one admitted child; ReservedAt is epoch ms. RunID names the
// epoch of a cold resume ("" for an admission): the slot is free once that
// run ended.
type ChildSlot struct {
	ChildID    string `msgpack:"childId" json:"childId"`
	ReservedAt int64  `msgpack:"reservedAt" json:"reservedAt"`
	RunID      string `msgpack:"runId,omitempty" json:"runId,omitempty"`
}

// StartQueueRecord is a parent's start queue, in brood_agents under
// `startqueue.<parentSession>` (docs/protocol.md §5.5, "The start queue";
// §7.6), written only by coordinators by compare-and-set: the runs.start
// requests that found the parent at its live-children limit, oldest first.
// A coordinator admits the first entry when a slot frees (it takes the
// child's slot, marks the entry admitting, writes the run, then removes the
// entry), so every entry starts once whichever replica admits it. At most
// the coordinator's StartQueueMax entries (DefaultStartQueueMax) and
// StartQueueBytesMax bytes encoded.
type StartQueueRecord struct {
	Entries []QueuedStart `msgpack:"entries" json:"entries"`
}

// QueuedStart is one queued runs.start or continuable.start (Mode
// ModeContinuable; "" is a one-shot run): what the admission needs of the
// request, with the parent's credential kept only as its hash
// (HashCredential: the credential itself is never stored). QueuedAt is
// epoch ms. AdmittingBy names the coordinator replica admitting it since
// AdmittingAt (epoch ms), "" while it waits; another replica takes it over
// once that replica is dead (its heartbeat record expired) or the claim is
// older than a start's budget.
type QueuedStart struct {
	RunID          string         `msgpack:"runId" json:"runId"`
	ChildID        string         `msgpack:"childId" json:"childId"`
	Provider       string         `msgpack:"provider" json:"provider"`
	CredentialHash string         `msgpack:"credentialHash" json:"credentialHash"`
	Prompt         []ContentBlock `msgpack:"prompt" json:"prompt"`
	Notify         string         `msgpack:"notify,omitempty" json:"notify,omitempty"`
	NotifyJSON     bool           `msgpack:"notifyJson,omitempty" json:"notifyJson,omitempty"`
	Options        StartOptions   `msgpack:"options" json:"options"`
	QueuedAt       int64          `msgpack:"queuedAt" json:"queuedAt"`
	AdmittingBy    string         `msgpack:"admittingBy,omitempty" json:"admittingBy,omitempty"`
	AdmittingAt    int64          `msgpack:"admittingAt,omitempty" json:"admittingAt,omitempty"`
	// Mode is ModeContinuable for a continuable.start, "" for a runs.start.
	// A continuable start's RunID is its first epoch's run id, and
	// MessageID its prompt's message id in the child's inbox, both drawn
	// when it is queued (Options.Label is its label).
	Mode      string `msgpack:"mode,omitempty" json:"mode,omitempty"`
	MessageID string `msgpack:"messageId,omitempty" json:"messageId,omitempty"`
}

// Continuable reports whether e is a queued continuable.start.
func (e QueuedStart) Continuable() bool { return e.Mode == ModeContinuable }

// DefaultStartQueueMax is how many starts may wait in one parent's start
// queue (StartQueueRecord) unless the coordinator is configured otherwise:
// one more is refused LIMIT_EXCEEDED naming the bound.
const DefaultStartQueueMax = 1024

// StartQueueBytesMax bounds one parent's start queue record, encoded (its
// queued prompts mostly): 512 KiB, below the streams' smallest maximum
// message size. A start that would pass it is refused LIMIT_EXCEEDED naming
// the bound.
const StartQueueBytesMax = 512 << 10

// UserRootsRecord is the roots one NATS user opened under its open-roots
// quota, in brood_agents under `userroots.<user>` (docs/protocol.md §7.6),
// written by coordinators by compare-and-set: every agents.open on the
// user's subject takes a slot here before its root exists, so opens served
// by any number of replicas never pass the quota.
type UserRootsRecord struct {
	Roots []RootSlot `msgpack:"roots" json:"roots"`
}

// RootSlot is one root opened under a user's quota; ReservedAt is epoch ms.
type RootSlot struct {
	SessionID  string `msgpack:"sessionId" json:"sessionId"`
	ReservedAt int64  `msgpack:"reservedAt" json:"reservedAt"`
}

// ClosedRootRecord marks a root that was closed (agents.close) or whose
// lease lapsed, in brood_agents under `closed.<sessionId>` (docs/protocol.md
// §7.6), written by coordinators before they delete the root's lease:
// the collector's list of trees to collect once idle for their retention
// (docs/security.md, "Garbage collection"). ClosedAt is epoch ms.
type ClosedRootRecord struct {
	ClosedAt int64 `msgpack:"closedAt" json:"closedAt"`
}

// DrainRecord marks a drain in brood_agents under `drain.<scope>`:
// `drain.all.sessions` for everything (until lifted), `drain.<root>` below
// one live root (held while that exact root agent, by its credential hash,
// stays live, or until lifted).
type DrainRecord struct {
	Root           string `msgpack:"root,omitempty" json:"root,omitempty"`
	CredentialHash string `msgpack:"credentialHash,omitempty" json:"credentialHash,omitempty"`
	Until          int64  `msgpack:"until,omitempty" json:"until,omitempty"`
	CreatedAt      int64  `msgpack:"createdAt,omitempty" json:"createdAt,omitempty"`
}

// ChildIndexRecord is a child's entry in the parent's child index
// (BROOD_SESSIONS subject `children.<parent>.<child>`), written when the
// child's header is: listing needs no scan of every header.
type ChildIndexRecord struct {
	ChildID   string `msgpack:"childId" json:"childId"`
	CreatedAt int64  `msgpack:"createdAt" json:"createdAt"`
	Mode      string `msgpack:"mode" json:"mode"`
	Provider  string `msgpack:"provider" json:"provider"`
}

// ActivateRequest asks a provider host to materialize an activation of a
// continuable child (`provider.<name>.<hostId>.activate`): its first (Fresh: write the
// descriptor after any seed) or a cold resume (read the log, fold the
// descriptor). RunRevision is the brood_runs revision of the epoch's record.
//
// Run is the epoch's record as created at RunRevision, claimed by the host
// before it writes anything else, and Deadline (epoch ms) when the
// coordinator stops waiting, as in ProviderStartRequest.
type ActivateRequest struct {
	ChildID     string          `msgpack:"childId" json:"childId"`
	Header      SessionHeader   `msgpack:"header" json:"header"`
	RunID       string          `msgpack:"runId" json:"runId"`
	RunRevision Seq             `msgpack:"runRevision" json:"runRevision"`
	Run         RunRecord       `msgpack:"run" json:"run"`
	Deadline    int64           `msgpack:"deadline" json:"deadline"`
	Fresh       bool            `msgpack:"fresh,omitempty" json:"fresh,omitempty"`
	Descriptor  *DescriptorData `msgpack:"descriptor,omitempty" json:"descriptor,omitempty"`
	Owner       string          `msgpack:"owner,omitempty" json:"owner,omitempty"`
	Ancestry    []string        `msgpack:"ancestry,omitempty" json:"ancestry,omitempty"`
}

// ActivateReply answers once the activation is resident and listening.
type ActivateReply struct {
	HostID string `msgpack:"hostId" json:"hostId"`
	RunID  string `msgpack:"runId" json:"runId"`
}

// HostChildRequest asks a host about or to act on a resident activation.
type HostChildRequest struct {
	ChildID string `msgpack:"childId" json:"childId"`
	Cause   string `msgpack:"cause,omitempty" json:"cause,omitempty"`
}

// OpProviderActivate materializes a continuable child's activation.
const OpProviderActivate = "activate"

// Host operations for activations.
const (
	OpHostState = "state"
)
