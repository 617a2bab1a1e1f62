package protocol

import "time"

// Liveness of hosts (docs/design.md §4): every host (worker or coordinator)
// rewrites its brood_hosts record each heartbeat interval, and a host whose
// record has not changed for longer than the host expiry is dead: its
// sessions are taken over (HOST_LOST). These are the defaults of every
// component and of `brood --heartbeat` / `--host-expiry`; a deployment that
// changes one sets it alike everywhere, the expiry longer than the interval.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultHostExpiry        = 5 * time.Second
)

// Host kinds recorded in brood_hosts.
const (
	HostWorker      = "worker"
	HostCoordinator = "coordinator"
)

// HostRecord is a live host in KV brood_hosts (docs/design.md §4), rewritten by the
// host every heartbeat interval. Heartbeat is the host's epoch ms at writing;
// coordinators judge liveness by when they last saw the record change, so a
// skewed host clock cannot keep a dead host alive.
type HostRecord struct {
	HostID      string               `msgpack:"hostId" json:"hostId"`
	Kind        string               `msgpack:"kind" json:"kind"`
	Providers   []ProviderDescriptor `msgpack:"providers" json:"providers"`
	Heartbeat   int64                `msgpack:"heartbeat" json:"heartbeat"`
	StartedAt   int64                `msgpack:"startedAt" json:"startedAt"`
	HeartbeatMs int64                `msgpack:"heartbeatMs" json:"heartbeatMs"`
	Draining    bool                 `msgpack:"draining,omitempty" json:"draining,omitempty"`
}

// Agent kinds recorded in brood_agents.
const (
	AgentRoot        = "root"
	AgentOneShot     = "one-shot"
	AgentContinuable = "continuable"
)

// AgentRecord is the lease of one live agent in KV brood_agents, keyed by
// session id (docs/design.md §4). Whoever holds it is the session log's one writer.
// Epoch increases by one on every takeover (CAS). CredentialHash is the
// hex SHA-256 of the agent's credential. ExpiresAt (epoch ms) bounds a root's
// lease; worker-hosted agents live as long as their host heartbeats.
type AgentRecord struct {
	SessionID      string   `msgpack:"sessionId" json:"sessionId"`
	Kind           string   `msgpack:"kind" json:"kind"`
	HostID         string   `msgpack:"hostId" json:"hostId"`
	Epoch          int64    `msgpack:"epoch" json:"epoch"`
	RunID          string   `msgpack:"runId,omitempty" json:"runId,omitempty"`
	Provider       string   `msgpack:"provider,omitempty" json:"provider,omitempty"`
	CredentialHash string   `msgpack:"credentialHash" json:"credentialHash"`
	ParentSession  string   `msgpack:"parentSession,omitempty" json:"parentSession,omitempty"`
	Ancestry       []string `msgpack:"ancestry,omitempty" json:"ancestry,omitempty"`
	Notify         string   `msgpack:"notify,omitempty" json:"notify,omitempty"`
	ExpiresAt      int64    `msgpack:"expiresAt,omitempty" json:"expiresAt,omitempty"`
	CreatedAt      int64    `msgpack:"createdAt" json:"createdAt"`
	// Owner is the continuable parent that owns this continuable child (its
	// activation waits for it); EpochStart is the index of the first event
	// of this activation's epoch (its result is read from there on).
	Owner      string `msgpack:"owner,omitempty" json:"owner,omitempty"`
	EpochStart int64  `msgpack:"epochStart,omitempty" json:"epochStart,omitempty"`
	// TakenOverBy names the coordinator that took the lease from a dead host.
	TakenOverBy string `msgpack:"takenOverBy,omitempty" json:"takenOverBy,omitempty"`
	// Ending marks a one-shot agent whose turn is over and whose descendants
	// are being disposed before its run settles (issue 14): it authorizes
	// nothing any more, and no descendant of it starts work again.
	Ending bool `msgpack:"ending,omitempty" json:"ending,omitempty"`
	// User is the NATS user that opened a root (agents.open on its own
	// subject; SessionHeader.User): its open roots count against
	// UserOpenRootsMax. Absent for children and anonymous roots.
	User string `msgpack:"user,omitempty" json:"user,omitempty"`
	// HeaderDigest is a root's header as its coordinator wrote it
	// (HeaderDigest): a coordinator takes a live root's header only when
	// it matches, so a header purged and published again by another role
	// (the collector) does not pass for it (docs/security.md, "A
	// collector"). Absent for children and for roots' leases written
	// before it.
	HeaderDigest string `msgpack:"headerDigest,omitempty" json:"headerDigest,omitempty"`
}

// RunRecord is one run (or continuable epoch) in KV brood_runs (docs/design.md §4).
// Created `running` by the coordinator; settled exactly once by a CAS at the
// record's revision (docs/design.md §7, Settlement 1).
type RunRecord struct {
	RunID         string `msgpack:"runId" json:"runId"`
	ChildID       string `msgpack:"childId" json:"childId"`
	ParentSession string `msgpack:"parentSession" json:"parentSession"`
	Provider      string `msgpack:"provider" json:"provider"`
	Mode          string `msgpack:"mode" json:"mode"`
	Notify        string `msgpack:"notify,omitempty" json:"notify,omitempty"`
	// NotifyJSON: the start request was JSON, so the notice on Notify is
	// JSON too (otherwise MessagePack).
	NotifyJSON bool `msgpack:"notifyJson,omitempty" json:"notifyJson,omitempty"`
	// Structured records that an outputSchema was requested, so whoever
	// settles derives the result the same way.
	Structured bool `msgpack:"structured,omitempty" json:"structured,omitempty"`
	// Remote marks a run of a remote provider (ACP): no Brood agent of the
	// host runs it, so its lifecycle events say local false.
	Remote    bool   `msgpack:"remote,omitempty" json:"remote,omitempty"`
	State     string `msgpack:"state" json:"state"`
	CreatedAt int64  `msgpack:"createdAt" json:"createdAt"`
	// HostID and StartedAt are written by the host that claimed the run (a
	// compare-and-set at the revision the coordinator created it at, before
	// the host writes anything else): at most one host ever starts a run,
	// and a coordinator that gave up on it fences every late host out.
	HostID    string `msgpack:"hostId,omitempty" json:"hostId,omitempty"`
	StartedAt int64  `msgpack:"startedAt,omitempty" json:"startedAt,omitempty"`
	// NotStarted marks a run settled without its child ever being published
	// (its result says why): it has no subagent/start and no subagent/end.
	NotStarted bool            `msgpack:"notStarted,omitempty" json:"notStarted,omitempty"`
	SettledAt  int64           `msgpack:"settledAt,omitempty" json:"settledAt,omitempty"`
	SettledBy  string          `msgpack:"settledBy,omitempty" json:"settledBy,omitempty"`
	Result     *SubagentResult `msgpack:"result,omitempty" json:"result,omitempty"`
	// Descriptor is a continuable child's descriptor, on the record of its
	// first epoch only (the coordinator has it from continuable.start). Its
	// host logs it as the child's first own event; a coordinator that takes
	// the epoch over, or settles it orphaned, before the host logged it
	// logs it instead, so the child stays resumable (chaos seed 2: a worker
	// paused between its lease and its first append left a child that could
	// never run its first message).
	Descriptor *DescriptorData `msgpack:"descriptor,omitempty" json:"descriptor,omitempty"`
	// Takeovers counts the times a one-shot run's turn, or a continuable
	// child's epoch, was continued on another host after its host died
	// (docs/protocol.md §8.4, "Continued after a host loss"): set by the
	// host that settles a continued run, from the agent/takeover records
	// its log holds (an epoch's: those of the epoch's events); absent for
	// a run that never changed hosts. Its subagent/end carries it too.
	Takeovers int64 `msgpack:"takeovers,omitempty" json:"takeovers,omitempty"`
}

// ResolvedOptions are the start options after the coordinator validated them,
// as a provider receives them. OutputSchema is canonical JSON text.
type ResolvedOptions struct {
	OutputSchema string      `msgpack:"outputSchema,omitempty" json:"outputSchema,omitempty"`
	ToolFilter   *ToolFilter `msgpack:"toolFilter,omitempty" json:"toolFilter,omitempty"`
	Persona      *string     `msgpack:"persona,omitempty" json:"persona,omitempty"`
	Label        string      `msgpack:"label,omitempty" json:"label,omitempty"`
}

// ProviderStartRequest is what a coordinator sends to one provider instance,
// `provider.<name>.<hostId>.start`, after it validated a runs.start and wrote
// the child's header and run record. Run is that record as created, at
// brood_runs revision RunRevision: the host claims it by writing it back
// with its hostId at that revision, before anything else, and settles it
// at the claim's revision. Deadline (epoch ms, the coordinator's clock) is
// when the coordinator stops waiting: a host that receives the request later
// drops it unanswered.
type ProviderStartRequest struct {
	RunID      string         `msgpack:"runId" json:"runId"`
	Header     SessionHeader  `msgpack:"header" json:"header"`
	Provider   string         `msgpack:"provider" json:"provider"`
	Prompt     []ContentBlock `msgpack:"prompt" json:"prompt"`
	Notify     string         `msgpack:"notify,omitempty" json:"notify,omitempty"`
	NotifyJSON bool           `msgpack:"notifyJson,omitempty" json:"notifyJson,omitempty"`
	// Source is the prompt's provenance as the coordinator judged it
	// (PromptSource); absent means the user.
	Source      *MessageSource  `msgpack:"source,omitempty" json:"source,omitempty"`
	RunRevision Seq             `msgpack:"runRevision" json:"runRevision"`
	Run         RunRecord       `msgpack:"run" json:"run"`
	Deadline    int64           `msgpack:"deadline" json:"deadline"`
	Options     ResolvedOptions `msgpack:"options" json:"options"`
	Ancestry    []string        `msgpack:"ancestry,omitempty" json:"ancestry,omitempty"`
}

// ProviderContinueRequest is what a coordinator sends to one live
// instance of a provider, `provider.<name>.<hostId>.continue`, to continue
// a one-shot run whose host died in the middle of its turn
// (docs/protocol.md §8.4, "Continued after a host loss", §9.3): the
// coordinator took the session's lease over at LeaseRevision (the lease
// names it, TakenOverBy, at the run's next epoch) and fenced the log with
// agent/takeover, leaving the turn open. The instance takes the lease by
// compare-and-set at LeaseRevision (NOT_PENDING when it moved: another
// instance took it, or the coordinator gave up), builds the child over its
// log and continues the turn; it settles the run as its first host would
// have. Deadline (epoch ms) is when the coordinator stops waiting for the
// answer; a host that receives it later drops it.
type ProviderContinueRequest struct {
	RunID         string `msgpack:"runId" json:"runId"`
	ChildID       string `msgpack:"childId" json:"childId"`
	Provider      string `msgpack:"provider" json:"provider"`
	LeaseRevision Seq    `msgpack:"leaseRevision" json:"leaseRevision"`
	Deadline      int64  `msgpack:"deadline" json:"deadline"`
	// Header is the child's session header, as the coordinator read it (a
	// worker reads no header itself: docs/security.md).
	Header SessionHeader `msgpack:"header" json:"header"`
}

// OpProviderContinue continues a one-shot run whose host died
// (ProviderContinueRequest); answered with a ProviderStartReply once the
// instance holds the lease and the turn goes on.
const OpProviderContinue = "continue"

// ProviderStartReply answers a provider start once the child is published:
// lease held, first turn logged.
type ProviderStartReply struct {
	HostID string `msgpack:"hostId" json:"hostId"`
}

// HostRunRequest asks a host to act on one run it hosts (dispose, cancel).
type HostRunRequest struct {
	RunID   string `msgpack:"runId" json:"runId"`
	ChildID string `msgpack:"childId" json:"childId"`
	Cause   string `msgpack:"cause,omitempty" json:"cause,omitempty"`
}

// ProviderPrepareRequest asks a provider that inherits parent context for a
// child's creation spec before the child's header is written (seed:
// prepareContinuable), served on `provider.<name>.<hostId>.prepare`.
// ParentCompleted is the length, in events, of the parent's balanced
// completed-turn prefix, which the coordinator read and checked to replay
// (a worker reads no log of another provider's session, nor any header:
// docs/security.md). Deadline is as in ProviderStartRequest.
type ProviderPrepareRequest struct {
	ParentSession   string `msgpack:"parentSession" json:"parentSession"`
	ChildID         string `msgpack:"childId" json:"childId"`
	Provider        string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	ParentCompleted int64  `msgpack:"parentCompleted,omitempty" json:"parentCompleted,omitempty"`
	Deadline        int64  `msgpack:"deadline,omitempty" json:"deadline,omitempty"`
}

// ProviderPrepareReply is the provider's creation spec: how many leading
// events of the parent's log seed the child (the balanced completed-turn
// prefix; 0 for an unseeded child). The header's seedLength records it.
type ProviderPrepareReply struct {
	SeedLength int64 `msgpack:"seedLength" json:"seedLength"`
}
