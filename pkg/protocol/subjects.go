package protocol

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// DefaultPrefix is the subject prefix of a deployment unless configured.
const DefaultPrefix = "brood"

// Version is the wire version token that follows the prefix in every subject.
const Version = "v1"

// Coordinator endpoints (docs/design.md §3, §7). Each is served on
// `<prefix>.v1.coord.<endpoint>` by the micro service CoordinatorService in the
// queue group CoordinatorQueue, so replicas share the load.
const (
	EpProvidersList        = "providers.list"
	EpAgentsOpen           = "agents.open"
	EpAgentsRenew          = "agents.renew"
	EpAgentsClose          = "agents.close"
	EpRunsStart            = "runs.start"
	EpRunsAwait            = "runs.await"
	EpRunsDispose          = "runs.dispose"
	EpContinuableStart     = "continuable.start"
	EpContinuableFollowup  = "continuable.followup"
	EpContinuableState     = "continuable.state"
	EpContinuableDrain     = "continuable.drain"
	EpContinuableDrains    = "continuable.drains"
	EpContinuableInterrupt = "continuable.interrupt"
	EpContinuableReport    = "continuable.report"
	EpChildrenList         = "children.list"
	EpDescendantsDispose   = "descendants.dispose"
	EpAuthorityUser        = "authority.user"
	// Requests for approval (docs/protocol.md §5.21).
	EpRequestsOpen   = "requests.open"
	EpRequestsGet    = "requests.get"
	EpRequestsAnswer = "requests.answer"
	EpRequestsList   = "requests.list"
	// Budgets (docs/protocol.md §5.22): a worker reserves and settles its
	// hosted session's spend with the session's credential.
	EpBudgetReserve = "budget.reserve"
	EpBudgetSettle  = "budget.settle"
	// The ledgers of a child, and a raise of its own budget, by its parent
	// or a user grant (authorised as continuable.followup is).
	EpBudgetGet   = "budget.get"
	EpBudgetRaise = "budget.raise"
)

// Provider operations, served by each instance of a provider on its own
// subject `<prefix>.v1.provider.<name>.<hostId>.<op>` (in the queue group
// ProviderQueue, of which it is the one member): the coordinator picks a live
// instance and moves to another when one does not answer in time, which a
// queue group shared by every instance could not do (it keeps delivering to
// a paused member).
const (
	OpProviderStart   = "start"
	OpProviderPrepare = "prepare"
)

// Host operations, served by one host process on `<prefix>.v1.host.<hostId>.<op>`
// (no queue group: exactly the process that runs the agent answers).
const (
	OpHostDispose   = "dispose"
	OpHostCancel    = "cancel"
	OpHostInterrupt = "interrupt"
)

// HostDisposeWaitMax bounds how long a host's dispose (and cancel) waits for
// the run to settle or the activation to end before it answers UNAVAILABLE
// or ACTIVATION_TEARDOWN_FAILED (docs/protocol.md §10, "host dispose wait");
// a coordinator waits this long plus a margin for the answer.
const HostDisposeWaitMax = 15 * time.Second

// Micro service names and queue groups.
const (
	CoordinatorService    = "brood-coordinator"
	ProviderServicePrefix = "brood-provider-"
	CoordinatorQueue      = "brood-coordinator"
	// CoordinatorUnknownQueue is the queue group of the coordinators'
	// catch-all on <p>.v1.coord.> that answers a mistyped endpoint NOT_FOUND.
	CoordinatorUnknownQueue = "brood-coordinator-unknown-endpoints"
	ProviderQueue           = "brood-provider"
)

// Lifecycle event kinds, the last token of an events subject.
const (
	EventKindStart = "start"
	EventKindEnd   = "end"
)

var (
	prefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
)

// idLenMax is the longest caller-chosen id, in bytes (docs/design.md §4).
const idLenMax = 64

// ValidID reports whether s may be used as a caller-chosen id or provider name:
// `^[A-Za-z0-9_-]{1,64}$` (docs/design.md §4), so it is always one subject token.
// A loop over the bytes, not a regexp: every request checks several ids
// (issue 12's profile).
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > idLenMax {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// HostScopeShared is the scope of a worker host that serves several
// providers (a test stack, an ACP bridge of several agents): such a host may
// offer any provider. A deployment with users gives no worker user this scope
// (docs/security.md), so there every worker host serves one provider.
const HostScopeShared = "shared"

// WorkerHostID is the host id of a worker host: <scope>.<unique>, where
// scope is the name of the one provider it serves (or HostScopeShared) and
// unique a ValidID (a ULID by default). The scope, a token of its own, is
// the first token after <prefix>.v1.host of its host subjects and of its
// brood_hosts key, so a NATS permission can give a provider's workers only
// their own hosts (docs/security.md).
func WorkerHostID(scope, unique string) string { return scope + "." + unique }

// ValidWorkerHostID reports whether id is <scope>.<unique>, both ValidIDs.
func ValidWorkerHostID(id string) bool {
	scope, unique, ok := strings.Cut(id, ".")
	return ok && ValidID(scope) && ValidID(unique)
}

// HostScope returns the scope of a worker host id (its first token), ""
// for an id that is not a worker host id (a coordinator's).
func HostScope(hostID string) string {
	if !ValidWorkerHostID(hostID) {
		return ""
	}
	scope, _, _ := strings.Cut(hostID, ".")
	return scope
}

// MayOffer reports whether the host hostID may offer provider: a worker
// host offers only the provider its scope names, or any from the shared
// scope, and none is named ScopeRoot (the scope of roots' logs).
// Coordinators (and a new worker checking for duplicates) ignore a
// descriptor a host record offers outside its scope: a worker may write only
// its own scope's records, so it cannot replace another provider's
// descriptor.
func MayOffer(hostID, provider string) bool {
	scope := HostScope(hostID)
	return scope != "" && provider != ScopeRoot && (scope == provider || scope == HostScopeShared)
}

// UserInboxPrefix is the inbox prefix of the connections of NATS user user,
// _INBOX.<user>: a deployment with users lets each subscribe only under its
// own (docs/security.md), so no user sees another's replies, run notices or
// followed events.
func UserInboxPrefix(user string) string { return "_INBOX." + user }

// Subjects builds every subject, stream and bucket name of one deployment.
// The zero value is not valid; use NewSubjects.
type Subjects struct {
	prefix string
}

// NewSubjects validates prefix (`^[A-Za-z0-9_-]{1,32}$`, "" means
// DefaultPrefix) and returns the deployment's names.
func NewSubjects(prefix string) (Subjects, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixRE.MatchString(prefix) {
		return Subjects{}, fmt.Errorf("subject prefix %q must match %s", prefix, prefixRE)
	}
	return Subjects{prefix: prefix}, nil
}

// MustSubjects is NewSubjects that panics on an invalid prefix; for constants
// and tests.
func MustSubjects(prefix string) Subjects {
	s, err := NewSubjects(prefix)
	if err != nil {
		panic(err)
	}
	return s
}

// Prefix returns the deployment prefix, e.g. "brood".
func (s Subjects) Prefix() string { return s.prefix }

func (s Subjects) root() string { return s.prefix + "." + Version }

// Coord is the subject of a coordinator endpoint, e.g. brood.v1.coord.runs.start.
func (s Subjects) Coord(endpoint string) string { return s.root() + ".coord." + endpoint }

// UserFollowCredit is FollowCredit for a follow opened by user (on its own
// subject): <p>.v1.user.<user>.follow.<coordinatorId>.
func (s Subjects) UserFollowCredit(user, coordinatorID string) string {
	return s.User(user, "follow."+coordinatorID)
}

// FollowCredit is the subject on which one coordinator replica takes the
// credit requests of the follows it streams (events.follow), e.g.
// brood.v1.coord.follow.<coordinatorId>: a follow lives in one replica, so
// its credit must reach that replica, not any member of the queue group.
func (s Subjects) FollowCredit(coordinatorID string) string {
	return s.root() + ".coord.follow." + coordinatorID
}

// CoordGroup is the subject group of all coordinator endpoints.
func (s Subjects) CoordGroup() string { return s.root() + ".coord" }

// User is the subject on which NATS user user calls a coordinator endpoint,
// e.g. brood.v1.user.alice.runs.start. The coordinator serves every endpoint
// on both forms; on this one it knows who calls, because a deployment lets
// each user publish only under its own <p>.v1.user.<user>.> (docs/security.md):
// notify subjects must lie under that user's inbox prefix, roots record
// their user, grants minted here act only on that user's trees, and
// per-user quotas apply. user must be a ValidID.
func (s Subjects) User(user, endpoint string) string {
	return s.root() + ".user." + user + "." + endpoint
}

// UserGroup is the subject group of every user's coordinator calls
// (<p>.v1.user); a coordinator serves <p>.v1.user.*.<endpoint>.
func (s Subjects) UserGroup() string { return s.root() + ".user" }

// Call is the subject of endpoint for caller user: User(user, endpoint),
// or Coord(endpoint) when user is "" (a connection without a user, as in
// `brood dev`).
func (s Subjects) Call(user, endpoint string) string {
	if user == "" {
		return s.Coord(endpoint)
	}
	return s.User(user, endpoint)
}

// CallerOf splits a coordinator subject into its caller and endpoint:
// <p>.v1.user.<user>.<endpoint> gives user; <p>.v1.coord.<endpoint> gives
// "" (anonymous). ok is false for any other subject.
func (s Subjects) CallerOf(subject string) (user, endpoint string, ok bool) {
	if ep, found := strings.CutPrefix(subject, s.CoordGroup()+"."); found && ep != "" {
		return "", ep, true
	}
	rest, found := strings.CutPrefix(subject, s.UserGroup()+".")
	if !found {
		return "", "", false
	}
	user, ep, found := strings.Cut(rest, ".")
	if !found || !ValidID(user) || ep == "" {
		return "", "", false
	}
	return user, ep, true
}

// ProviderInstance is the subject of an operation of one instance (host) of a
// provider, e.g. brood.v1.provider.spawn.<hostId>.start.
func (s Subjects) ProviderInstance(name, hostID, op string) string {
	return s.root() + ".provider." + name + "." + hostID + "." + op
}

// ProviderGroup is the subject group of one provider's operations.
func (s Subjects) ProviderGroup(name string) string { return s.root() + ".provider." + name }

// Host is the subject of a host operation, e.g.
// brood.v1.host.<scope>.<unique>.dispose for the worker host id
// <scope>.<unique> (WorkerHostID).
func (s Subjects) Host(hostID, op string) string { return s.root() + ".host." + hostID + "." + op }

// HostAll is the wildcard subject of every operation of one host.
func (s Subjects) HostAll(hostID string) string { return s.root() + ".host." + hostID + ".*" }

// Session is the BROOD_SESSIONS subject holding one session's header.
func (s Subjects) Session(id string) string { return s.root() + ".session." + id }

// Log is the subject holding one session's event records,
// <p>.v1.log.<scope>.<sessionId>, in the stream StreamLog(scope), scope
// the session's (SessionHeader.Scope: its provider, or ScopeRoot): a
// deployment lets a provider's workers publish only under
// <p>.v1.log.<provider>.> and read only their own scope's streams
// (docs/security.md). Every reader takes the scope from the session's
// immutable header, which only coordinators write, so a record under
// another scope is never read.
func (s Subjects) Log(scope, id string) string { return s.root() + ".log." + scope + "." + id }

// LogAll is the wildcard over every session's log subject, of every scope.
func (s Subjects) LogAll() string { return s.root() + ".log.*.*" }

// LogsOf is the wildcard over the log subjects of one scope,
// <p>.v1.log.<scope>.*: the subject of the stream StreamLog(scope).
func (s Subjects) LogsOf(scope string) string { return s.root() + ".log." + scope + ".*" }

// Wake is a core-only subject (no stream, empty body) that wakes a
// session's resident activation when an item was accepted into its inbox
// or a child it owns released its ownership,
// <p>.v1.wake.<scope>.<sessionId>, scope the session's
// (SessionHeader.Scope: its provider, or ScopeRoot). Only coordinators
// publish it; a deployment lets a provider's workers subscribe only to
// <p>.v1.wake.<provider>.* (docs/security.md), and never to the inbox
// subjects, whose copies of the items would show them every session's
// prompts and results: a woken activation reads its own inbox.
func (s Subjects) Wake(scope, id string) string { return s.root() + ".wake." + scope + "." + id }

// Notice is a core-only subject (no stream) on which a host asks the
// coordinators to publish the settlement notice of run runID of provider
// provider, <p>.v1.notice.<provider>.<runId>, with no payload: a coordinator
// (queue group CoordinatorQueue) reads the run's records and publishes the
// RunNotice they hold to the run's notify subject (docs/protocol.md §7.8).
// A deployment lets a provider's workers publish only under
// <p>.v1.notice.<provider>.> and on no client's inbox (docs/security.md).
func (s Subjects) Notice(provider, runID string) string {
	return s.root() + ".notice." + provider + "." + runID
}

// NoticeAll is the wildcard over every notice request.
func (s Subjects) NoticeAll() string { return s.root() + ".notice.*.*" }

// NoticeOf returns the provider and run id a Notice subject names; ok is
// false for any other subject.
func (s Subjects) NoticeOf(subject string) (provider, runID string, ok bool) {
	return s.twoIDs(subject, ".notice.")
}

// twoIDs returns the two id tokens that follow s.root()+kind in subject.
func (s Subjects) twoIDs(subject, kind string) (a, b string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.root()+kind)
	if !found {
		return "", "", false
	}
	a, b, found = strings.Cut(rest, ".")
	if !found || !ValidID(a) || !ValidID(b) {
		return "", "", false
	}
	return a, b, true
}

// EpochEnd is the request-reply subject on which the host that settled an
// epoch of continuable child childID of provider provider asks the
// coordinators (queue group CoordinatorQueue) to carry out the epoch's end
// in the records only they write, <p>.v1.epochend.<provider>.<childId>
// (EpochEndRequest): the settlement notice into the parent's inbox, the
// removal of the ownership edge, the owner's wake-up. A deployment lets a
// provider's workers publish only under <p>.v1.epochend.<provider>.>
// (docs/security.md).
func (s Subjects) EpochEnd(provider, childID string) string {
	return s.root() + ".epochend." + provider + "." + childID
}

// EpochEndAll is the wildcard over every epoch end request.
func (s Subjects) EpochEndAll() string { return s.root() + ".epochend.*.*" }

// EpochEndOf returns the provider and child id an EpochEnd subject names;
// ok is false for any other subject.
func (s Subjects) EpochEndOf(subject string) (provider, childID string, ok bool) {
	return s.twoIDs(subject, ".epochend.")
}

// Read is the request-reply subject on which a host of provider provider
// asks the coordinators (queue group CoordinatorQueue) for a read that
// crosses providers, answered only for what its own child childID allows,
// <p>.v1.read.<provider>.<kind>.<childId>: ReadForkSeed (ForkSeedRequest,
// answered with a LogPage of the fork parent's log below the fork point)
// and ReadAncestry (Empty, answered with an AncestryReply). A deployment
// lets a provider's workers publish only under <p>.v1.read.<provider>.>
// and read no session header nor another provider's log itself
// (docs/security.md).
func (s Subjects) Read(provider, kind, childID string) string {
	return s.root() + ".read." + provider + "." + kind + "." + childID
}

// ReadAll is the wildcard over every read request of kind.
func (s Subjects) ReadAll(kind string) string { return s.root() + ".read.*." + kind + ".*" }

// ReadOf returns the provider and child id a Read subject of kind names; ok
// is false for any other subject.
func (s Subjects) ReadOf(subject, kind string) (provider, childID string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.root()+".read.")
	if !found {
		return "", "", false
	}
	provider, rest, found = strings.Cut(rest, ".")
	if !found {
		return "", "", false
	}
	childID, found = strings.CutPrefix(rest, kind+".")
	if !found || !ValidID(provider) || !ValidID(childID) {
		return "", "", false
	}
	return provider, childID, true
}

// The kinds of Read.
const (
	// ReadForkSeed reads a fork child's seed: its parent's log below the
	// fork point (the child's header's seedLength).
	ReadForkSeed = "forkseed"
	// ReadAncestry answers whether an ancestor of the child is an ended
	// one-shot run.
	ReadAncestry = "ancestry"
	// ReadKVLatest reads one of the provider's own KV records as the
	// bucket's leader has it (Subjects.KVLatest: its last token is the
	// bucket, not a child).
	ReadKVLatest = "kvlatest"
)

// InboxRemove is the request-reply subject on which a host asks the
// coordinators (queue group CoordinatorQueue) to delete items of the inbox
// of child sessionID of provider provider whose claim or discard the
// child's log records, <p>.v1.inboxremove.<provider>.<sessionId>
// (InboxRemoveRequest). Only coordinators delete inbox items; a deployment
// lets a provider's workers publish only under
// <p>.v1.inboxremove.<provider>.> (docs/security.md).
func (s Subjects) InboxRemove(provider, sessionID string) string {
	return s.root() + ".inboxremove." + provider + "." + sessionID
}

// InboxRemoveAll is the wildcard over every inbox removal request.
func (s Subjects) InboxRemoveAll() string { return s.root() + ".inboxremove.*.*" }

// InboxRemoveOf returns the provider and session id an InboxRemove subject
// names; ok is false for any other subject.
func (s Subjects) InboxRemoveOf(subject string) (provider, sessionID string, ok bool) {
	return s.twoIDs(subject, ".inboxremove.")
}

// KVLatest is the request-reply subject on which a worker host asks the
// coordinators (queue group CoordinatorQueue) for a key of bucket (its
// name: Subjects.BucketAgents or BucketRuns) as the bucket stream's leader
// has it, <p>.v1.read.<provider>.kvlatest.<bucket> (KVLatestRequest): the
// reads a decision on the latest value rests on (a refused
// compare-and-set's check, a claim's lease, whether a parent may settle).
// A leader get ($JS.API.STREAM.MSG.GET) names its key in its body, so no
// NATS permission can scope it to a provider's keys; a coordinator answers
// only keys under provider's prefixes (store.ScopeOfKey), and a deployment
// lets a provider's workers publish only under <p>.v1.read.<provider>.>
// (docs/security.md).
func (s Subjects) KVLatest(provider, bucket string) string {
	return s.Read(provider, ReadKVLatest, bucket)
}

// KVLatestAll is the wildcard over every KVLatest request.
func (s Subjects) KVLatestAll() string { return s.ReadAll(ReadKVLatest) }

// KVLatestOf returns the provider and bucket a KVLatest subject names; ok
// is false for any other subject.
func (s Subjects) KVLatestOf(subject string) (provider, bucket string, ok bool) {
	return s.ReadOf(subject, ReadKVLatest)
}

// Children is the BROOD_SESSIONS subject of one child's entry in its
// parent's child index; ChildrenOf is the wildcard over a parent's entries.
func (s Subjects) Children(parent, child string) string {
	return s.root() + ".children." + parent + "." + child
}

// ChildrenOf matches every child index entry of parent ("*" for all parents).
func (s Subjects) ChildrenOf(parent string) string { return s.root() + ".children." + parent + ".*" }

// Inbox is the subject holding one session's pending inbox items,
// <p>.v1.inbox.<scope>.<sessionId>, in the stream StreamInbox(scope),
// scope the session's (SessionHeader.Scope: its provider, or ScopeRoot),
// as for Log: only coordinators publish it, and a deployment lets a
// provider's workers read only their own scope's inbox stream
// (docs/security.md).
func (s Subjects) Inbox(scope, id string) string { return s.root() + ".inbox." + scope + "." + id }

// InboxAll is the wildcard over every session's inbox subject, of every scope.
func (s Subjects) InboxAll() string { return s.root() + ".inbox.*.*" }

// InboxesOf is the wildcard over the inbox subjects of one scope,
// <p>.v1.inbox.<scope>.*: the subject of the stream StreamInbox(scope).
func (s Subjects) InboxesOf(scope string) string { return s.root() + ".inbox." + scope + ".*" }

// Events is the BROOD_EVENTS subject of the lifecycle events of provider
// provider's children of one parent,
// <p>.v1.events.<provider>.<parentSession>.<kind> (kind EventKindStart or
// EventKindEnd): a deployment lets a provider's workers publish only under
// <p>.v1.events.<provider>.> (docs/security.md), and readers keep an event
// only when its provider and parent are its subject's (EventsOf).
func (s Subjects) Events(provider, parentSession, kind string) string {
	return s.root() + ".events." + provider + "." + parentSession + "." + kind
}

// EventsAll is the wildcard over every lifecycle event of one parent ("*" for all parents), of every provider.
func (s Subjects) EventsAll(parentSession string) string {
	return s.root() + ".events.*." + parentSession + ".*"
}

// EventsOf returns the provider, parent session and kind an Events subject
// names; ok is false for any other subject.
func (s Subjects) EventsOf(subject string) (provider, parentSession, kind string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.root()+".events.")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || !ValidID(parts[0]) || !ValidID(parts[1]) || (parts[2] != EventKindStart && parts[2] != EventKindEnd) {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// SessionIDFromSubject returns the last token of a session, log or inbox subject.
func SessionIDFromSubject(subject string) string {
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		return subject[i+1:]
	}
	return subject
}

func (s Subjects) upper() string { return strings.ToUpper(strings.ReplaceAll(s.prefix, "-", "_")) }
func (s Subjects) lower() string { return strings.ToLower(strings.ReplaceAll(s.prefix, "-", "_")) }

// Stream names: BROOD_SESSIONS, BROOD_EVENTS for the default prefix.
func (s Subjects) StreamSessions() string { return s.upper() + "_SESSIONS" }
func (s Subjects) StreamEvents() string   { return s.upper() + "_EVENTS" }

// StreamLog is the stream of the logs of one scope (a provider's name, or
// ScopeRoot), BROOD_LOG_<scope> for the default prefix (e.g. BROOD_LOG_spawn,
// BROOD_LOG_root), on LogsOf(scope). Logs and inboxes live in a stream per
// scope because a batch direct get ($JS.API.DIRECT.GET.<stream>) and a
// leader get ($JS.API.STREAM.MSG.GET.<stream>) name their subject in the
// request's body, which no NATS permission sees, but their stream in the API
// subject: so a permission can give a provider's workers the reads of their
// own scope's streams only (docs/security.md). scope must be a ValidID (it
// is then a valid stream name token: no dot, wildcard or space).
func (s Subjects) StreamLog(scope string) string { return s.upper() + "_LOG_" + scope }

// StreamInbox is the stream of the inboxes of one scope, BROOD_INBOX_<scope>
// for the default prefix, on InboxesOf(scope); see StreamLog.
func (s Subjects) StreamInbox(scope string) string { return s.upper() + "_INBOX_" + scope }

// KV bucket names: brood_agents, brood_hosts, brood_runs for the default prefix.
func (s Subjects) BucketAgents() string { return s.lower() + "_agents" }
func (s Subjects) BucketHosts() string  { return s.lower() + "_hosts" }
func (s Subjects) BucketRuns() string   { return s.lower() + "_runs" }
