package store

import (
	"strings"

	"github.com/brood-dev/brood/pkg/protocol"
)

// The key layout of Brood's KV buckets (docs/protocol.md §7.6-§7.8), in one
// place: every key a service reads or writes is built by a function of this
// file, and every key a watcher sees is told apart by KindOf, so a change of
// layout (issue 17 lays keys out by provider, so that a NATS permission on
// $KV.<bucket>.<prefix>.> can scope a role) is a change of this file only.
//
//	bucket        key                      value
//	brood_agents  lease.<provider>.<sessionId>  protocol.AgentRecord: a child's lease (its provider's workers)
//	              root.<sessionId>         protocol.AgentRecord: a root's lease (coordinator)
//	              owns.<scope>.<parentSession>  protocol.OwnershipRecord: live continuable children it owns (coordinator; read by its scope's workers)
//	              slots.<parentSession>    protocol.ChildSlotsRecord: the children admitted under the live-children limit (coordinator)
//	              userroots.<user>         protocol.UserRootsRecord: the roots a user opened under its open-roots quota (coordinator)
//	              closed.<sessionId>       protocol.ClosedRootRecord: a root closed or lapsed, for the collector (coordinator; the collector deletes it)
//	              grant.<hex-sha256>       protocol.UserGrantRecord: a minted user grant
//	              drain.all.sessions       protocol.DrainRecord: the global drain
//	              drain.<sessionId>        protocol.DrainRecord: a drain at and below one agent
//	              budget.<sessionId>       protocol.BudgetRecord: the ledger of the budget a session named (coordinator)
//	              startqueue.<parentSession>  protocol.StartQueueRecord: the starts waiting for a live-children slot (coordinator)
//	brood_runs    spec.<provider>.<runId>  protocol.RunRecord as created: what the coordinator decided (coordinator; read by its provider's workers)
//	              state.<provider>.<runId> protocol.RunRecord: its claim and settlement (its provider's workers)
//	brood_hosts   <scope>.<unique>         protocol.HostRecord of a worker host (protocol.WorkerHostID)
//	              <coordinatorId>          protocol.HostRecord of a coordinator
//
// Session, run, host ids and provider names never hold a dot (protocol ids
// are ^[A-Za-z0-9_-]+$), so a bare id can never name a prefixed key, every
// prefixed key holds one, and lease.<provider>.<sessionId> splits one way.
//
// Every key a worker reads names its provider (scope) as its second token
// (lease, owns, spec, state; a host's record its first), so a deployment
// lets worker-<p> read only $KV.<bucket>.<prefix>.<p>.> by a direct get with
// the subject in the API subject (docs/security.md, "What comes next", item
// 3): no worker reads another provider's run, lease or ownership record.

// Prefixes of the brood_agents keys.
const (
	prefixLease  = "lease."
	prefixRoot   = "root."
	prefixOwns   = "owns."
	prefixSlots  = "slots."
	prefixUser   = "userroots."
	prefixClose  = "closed."
	prefixGrant  = "grant."
	prefixDrain  = "drain."
	prefixBudget = "budget."
	prefixQueue  = "startqueue."
)

// DrainAll is the scope of the global drain (its key is drain.all.sessions):
// it holds a dot, so no session id names the same key.
const DrainAll = "all.sessions"

// LeaseKey is the brood_agents key of a child's lease,
// lease.<provider>.<sessionId>, provider being the one its session header
// names (protocol.SessionHeader.Scope), which only coordinators write: a
// deployment lets each provider's worker user write only
// $KV.brood_agents.lease.<provider>.> of the leases (docs/security.md), so
// no worker can rewrite another provider's child's lease, and readers look a
// child's lease up under the provider of its header only.
func LeaseKey(provider, sessionID string) string {
	return prefixLease + provider + "." + sessionID
}

// RootLeaseKey is the brood_agents key of a root's lease, root.<sessionId>:
// only coordinators write roots' leases, and a deployment's permissions
// deny the prefix to every other user (docs/security.md), so no worker can
// rewrite a root's lease. Readers tell a root from a child by its header
// (no provider: protocol.SessionHeader.Scope), which only coordinators write, never by the lease itself.
func RootLeaseKey(sessionID string) string { return prefixRoot + sessionID }

// LeaseKeyFor is the key of the lease of a session of scope (its header's
// protocol.SessionHeader.Scope): RootLeaseKey for protocol.ScopeRoot,
// LeaseKey of the provider otherwise.
func LeaseKeyFor(sessionID, scope string) string {
	if scope == protocol.ScopeRoot {
		return RootLeaseKey(sessionID)
	}
	return LeaseKey(scope, sessionID)
}

// LeaseKeyOf is the key lease rec belongs under: a root's (kind root) under
// RootLeaseKey, a child's under LeaseKey of the provider it names (which is
// its header's: a host refuses a child whose header names another). A
// record found under any other key is not that session's lease.
func LeaseKeyOf(rec protocol.AgentRecord) string {
	if rec.Kind == protocol.AgentRoot {
		return RootLeaseKey(rec.SessionID)
	}
	return LeaseKey(rec.Provider, rec.SessionID)
}

// OwnsKey is the brood_agents key of a continuable parent's ownership
// record, owns.<scope>.<parent>, scope the parent's
// (protocol.SessionHeader.Scope: its provider, or protocol.ScopeRoot): only
// coordinators write it, and the parent's own provider's workers read it
// (whether the parent may settle), under their own prefix only.
func OwnsKey(scope, parent string) string { return prefixOwns + scope + "." + parent }

// SlotsKey is the brood_agents key of a parent's live-children slot record.
func SlotsKey(parent string) string { return prefixSlots + parent }

// StartQueueKey is the brood_agents key of a parent's start queue,
// startqueue.<parentSession> (protocol.StartQueueRecord).
func StartQueueKey(parent string) string { return prefixQueue + parent }

// UserRootsKey is the brood_agents key of a NATS user's open-root slots,
// userroots.<user> (a user name is a subject token, protocol.ValidUser).
func UserRootsKey(user string) string { return prefixUser + user }

// ClosedRootKey is the brood_agents key of a closed root's marker,
// closed.<sessionId>: the collector's list of trees it may collect once
// their retention passed (gc.go).
func ClosedRootKey(sessionID string) string { return prefixClose + sessionID }

// GrantKey is the brood_agents key of a user grant, by the grant's hash
// (protocol.HashCredential): the grant itself is never stored.
func GrantKey(grantHash string) string { return prefixGrant + grantHash }

// DrainKey is the brood_agents key of the drain marker of scope: a session
// id, or DrainAll.
func DrainKey(scope string) string { return prefixDrain + scope }

// BudgetKey is the brood_agents key of the ledger of the budget session
// named (its start's or its open's), budget.<sessionId>: only coordinators
// write it, by compare-and-set (docs/protocol.md §7.6).
func BudgetKey(sessionID string) string { return prefixBudget + sessionID }

// Prefixes of the brood_runs keys.
const (
	prefixRunSpec  = "spec."
	prefixRunState = "state."
)

// RunSpecKey is the brood_runs key of a run's spec,
// spec.<provider>.<runId>: its record as the coordinator created it, which
// only coordinators write (once). Its provider names the key of the run's
// state (RunStateKey), and what the coordinator decided (child, parent,
// mode, notify subject, descriptor) is read from it, never from the state.
// A provider's workers read the specs of their own provider's runs only;
// coordinators, which know a run by its id alone, read it by
// RunSpecPattern.
func RunSpecKey(provider, runID string) string {
	return prefixRunSpec + provider + "." + runID
}

// RunSpecPattern is the key pattern spec.*.<runId> that matches run
// runID's spec whatever its provider (run ids are unique): a direct get
// of its last message, with the pattern in the API subject, reads the spec
// of a run known by its id alone (Store.RunSpec).
func RunSpecPattern(runID string) string { return prefixRunSpec + "*." + runID }

// RunStateKey is the brood_runs key of a run's state,
// state.<provider>.<runId>, provider its spec's: the record the claiming
// host and coordinators change by compare-and-set (claim, hold,
// settlement). A deployment lets each provider's workers write only
// $KV.brood_runs.state.<provider>.> (docs/security.md), so no worker can
// claim or settle another provider's run.
func RunStateKey(provider, runID string) string {
	return prefixRunState + provider + "." + runID
}

// RunIDOf returns the run id of a brood_runs spec key (a listing of the
// bucket names each run once by its spec), or "" for any other key.
func RunIDOf(key string) string {
	if kind, _, id := RunsKindOf(key); kind == RunsSpec {
		return id
	}
	return ""
}

// RunsKind tells the brood_runs keys apart.
type RunsKind int

// The kinds of brood_runs keys.
const (
	RunsOther RunsKind = iota // a key of no known layout
	RunsSpec                  // spec.<provider>.<runId>
	RunsState                 // state.<provider>.<runId>
)

// RunsKindOf returns what the brood_runs key holds, the run id it is keyed
// by and the provider its key names.
func RunsKindOf(key string) (kind RunsKind, provider, runID string) {
	for _, k := range []struct {
		prefix string
		kind   RunsKind
	}{{prefixRunSpec, RunsSpec}, {prefixRunState, RunsState}} {
		if p, id, ok := scopedID(key, k.prefix); ok {
			return k.kind, p, id
		}
	}
	return RunsOther, "", key
}

// scopedID splits key, <prefix><scope>.<id>, into its scope and id; ok
// false when key is not of that form.
func scopedID(key, prefix string) (scope, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return "", "", false
	}
	scope, id, ok = strings.Cut(rest, ".")
	if !ok || scope == "" || id == "" || strings.Contains(id, ".") {
		return "", "", false
	}
	return scope, id, true
}

// ScopeOfKey returns the provider (or scope) a key a worker reads names,
// lease.<p>.<sessionId>, owns.<p>.<parentSession> of brood_agents or
// spec.<p>.<runId>, state.<p>.<runId> of brood_runs (the two buckets' key
// prefixes differ); ok is false for every other key, which no worker reads
// by key (roots' leases, grants, drains, slots, user roots, closed roots).
// A deployment lets worker-<p> read only the keys whose scope is <p>
// (docs/security.md), and coordinators answer a worker's leader read
// (protocol.Subjects.KVLatest) only for those.
func ScopeOfKey(key string) (scope string, ok bool) {
	for _, prefix := range []string{prefixLease, prefixOwns, prefixRunSpec, prefixRunState} {
		if scope, id, ok := scopedID(key, prefix); ok && protocol.ValidID(scope) && protocol.ValidID(id) {
			return scope, true // no pattern: one key
		}
	}
	return "", false
}

// HostKey is the brood_hosts key of a host's record: its host id, which
// for a worker host is <scope>.<unique> (protocol.WorkerHostID), so a NATS
// permission on $KV.<bucket>.<scope>.> gives a provider's workers only their
// own hosts' records.
func HostKey(hostID string) string { return hostID }

// AgentsKind is what a brood_agents key holds.
type AgentsKind int

// The kinds of brood_agents keys.
const (
	KindOther      AgentsKind = iota // a key of no known layout
	KindLease                        // lease.<provider>.<sessionId>
	KindRootLease                    // root.<sessionId>
	KindOwnership                    // owns.<scope>.<parentSession>
	KindSlots                        // slots.<parentSession>
	KindUserRoots                    // userroots.<user>
	KindClosedRoot                   // closed.<sessionId>
	KindGrant                        // grant.<hash>
	KindDrain                        // drain.<scope>
	KindBudget                       // budget.<sessionId>
	KindRequest                      // request.<requestId>
	KindStartQueue                   // startqueue.<parentSession>
)

// KindOf returns what the brood_agents key holds and the id it is keyed by
// (the session, parent, grant hash, drain scope or request). Any other key, a bare
// session id among them, is KindOther.
func KindOf(key string) (AgentsKind, string) {
	for _, p := range []struct {
		prefix string
		kind   AgentsKind
	}{{prefixLease, KindLease}, {prefixOwns, KindOwnership}} {
		if strings.HasPrefix(key, p.prefix) {
			if _, id, ok := scopedID(key, p.prefix); ok {
				return p.kind, id
			}
			return KindOther, key
		}
	}
	for _, p := range []struct {
		prefix string
		kind   AgentsKind
	}{{prefixRoot, KindRootLease}, {prefixSlots, KindSlots}, {prefixUser, KindUserRoots}, {prefixClose, KindClosedRoot}, {prefixGrant, KindGrant}, {prefixDrain, KindDrain}, {prefixBudget, KindBudget}, {prefixRequest, KindRequest}, {prefixQueue, KindStartQueue}} {
		if id, ok := strings.CutPrefix(key, p.prefix); ok {
			return p.kind, id
		}
	}
	return KindOther, key
}
