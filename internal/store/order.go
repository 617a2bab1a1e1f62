package store

// Write order (the lock-order file of this package, as nats-server keeps
// locksordering.txt): for every operation, who writes what, in which order,
// and which compare-and-set fences whom. "→" is "after it is acknowledged";
// "∥" is "concurrently". A step that names a function is that function. An
// operation that fails after writing rolls back or settles what it wrote, as
// stated; nothing is left running.
//
// Invariants behind every order below (RELIABILITY.md):
//   - each session log subject has exactly one writer, the holder of the
//     session's lease; its appends are fenced on the subject's last sequence
//     and never pipelined (log.go);
//   - a run or epoch record is settled once, by compare-and-set; only the
//     winner publishes the end (ends.go), and publishes it before it
//     releases the lease (a winner that dies in between is taken over and
//     its end published again, idempotently);
//   - ownership edges are added before the child's epoch can end and
//     removed only after the parent's notice is in its inbox.
//
//	roots (agents.open / renew / close; coordinator, for the client)
//	    open:   header (BROOD_SESSIONS, expect last subject seq 0) ∥ lease (CreateLease).
//	    renew:  lease UpdateLease at the revision read.
//	    close:  lease ReleaseLease at the revision read → the root's one-shot
//	            runs are disposed (their ends settle them); its continuable
//	            children live on.
//	    reopen: lease CreateLease, or UpdateLease of an expired one.
//
//	runs.start (a one-shot run)
//	    coordinator: live-children slot (slots.<parent> CAS) → [fork: the
//	    provider's prepare writes the seed] → header ∥ run record (CreateRun:
//	    spec ∥ state, running) → child index entry (async) → dispatch the
//	    start. At the limit: the start queue (startqueue.<parent> CAS, the
//	    entry appended) after the budget's child charge, and nothing else;
//	    its admission, by any replica: slot (CAS) → startqueue.<parent>
//	    (CAS: the entry marked admitting) → header, run record (each taken
//	    as found when there) → dispatch → startqueue.<parent> (CAS: the
//	    entry removed).
//	    host: drop if past the request's deadline → ClaimRun (CAS at the
//	    creation revision) ∥ lease (CreateLease; a failed claim deletes it)
//	    → first log records (descriptor, turn/start; expect seq 0) →
//	    subagent/start → reply. The lease is the claim's fence: a
//	    coordinator settling the claimed record orphaned creates it first
//	    (taken over), so a host whose lease create is refused starts
//	    nothing (no HoldRun on this path).
//	    A host failure after the claim: ReleaseLease, SettleRun(NotStarted)
//	    at the claim's revision, RequestRunNotice.
//	    A start no instance took: the coordinator's SettleRun(NotStarted) at
//	    the creation revision, which fences out every late claim (a lost CAS
//	    there means an instance claimed it: the start succeeded).
//	    end: later log records, each fenced on the previous one → [a run
//	    that delegated: lease UpdateLease{Ending} → its descendants are
//	    disposed, child first] → SettleRun at the claim's revision →
//	    PublishRunEnd (subagent/end, then RequestRunNotice: a coordinator
//	    takes the settled run as its runs watch saw it, or reads it,
//	    RunLatest, and publishes its RunNotice) →
//	    ReleaseLease.
//
//	continuable start
//	    coordinator: live-children slot → header (expect seq 0; a conflict
//	    is DUPLICATE_CHILD) → child index entry → epoch (activate, below,
//	    fresh) → [continuable parent: AddOwnership] → the parent is read
//	    fresh and the drains checked → the prompt (Enqueue). A failure
//	    after the epoch started disposes it and removes the edge.
//
//	activate (an epoch; fresh, cold resume, liveness resume)
//	    coordinator: [resume: the parent's live-children slot for the
//	    child, naming the epoch's run, never refused (WriteSlots)] → run
//	    record (CreateRun, running; a fresh epoch's carries the
//	    descriptor) → dispatch.
//	    host: drop if late → ClaimRun → lease (CreateLease, EpochStart) →
//	    HoldRun (CAS at the claim's revision: a coordinator that settled
//	    the claimed record orphaned meanwhile wins, and the host releases
//	    the lease and starts nothing) →
//	    [fresh: the descriptor; resume: the dead host's open turn closed]
//	    (log, fenced) → inbox and wake subscriptions (flushed) →
//	    subagent/start → reply. A failure after the lease releases it and
//	    settles the epoch never started.
//	    cold resume: [continuable owner: AddOwnership] → activate.
//
//	followup
//	    coordinator: authority → lineage (no ended one-shot ancestor) →
//	    resident lease (a dead holder is taken over first) → [continuable
//	    parent: AddOwnership] → the message (Enqueue, idempotency key) →
//	    resident: wake; none: cold resume; held by a drain: nothing more.
//
//	epoch end (the activation's host)
//	    admission closed → final flush of the log → SettleRun at the claim's
//	    revision → EndEpoch: settlement notice (Enqueue to the parent,
//	    idempotency key settled-<runId>) → RemoveOwnership → wake the owner
//	    → subagent/end → ReleaseLease (after RemoveOwnership landed: a
//	    failed removal is tried again first, ErrOwnershipKept).
//
//	HOST_LOST (coordinator; a one-shot run or an epoch whose host died)
//	    TakeOverLease (CAS; epoch+1; one replica wins) → [epoch: its record
//	    read from the leader] → [a first epoch whose log lacks its
//	    descriptor: the record's descriptor] + the log's open turn closed
//	    interrupted, or agent/takeover when none is open (one append, fenced
//	    on the log's last sequence: the lost host's next append is refused) →
//	    [one-shot: its descendants disposed] → SettleRun at the record's
//	    revision → PublishRunEnd / EndEpoch → ReleaseLease → [epoch: items
//	    still in the inbox resumed on a live host]. A record found settled
//	    under the lease (its host died after settling) has its end
//	    published again before the lease is released.
//
//	live-children slots (slots.<parent>)
//	    Slots → WriteSlots (CAS at the revision read; create when absent)
//	    before anything of the child is written (runs.start, continuable
//	    start) or, for a cold resume, before its epoch record; a start that
//	    fails gives its slot back (WriteSlots without it). Slots of children
//	    that ended are dropped by the next admission.
//
//	ownership (owns.<parent>)
//	    AddOwnership / RemoveOwnership: compare-and-set loops (create when
//	    absent, delete when empty). Added by the coordinator before the
//	    child's epoch can end (start, cold resume, followup); removed by
//	    EndEpoch after the notice. A continuable parent with a non-empty
//	    record does not settle (it waits, re-reading on wake).
//
//	drain (continuable.drain; coordinator)
//	    PutDrain (drain.all.sessions, or drain.<parent> per parent with a
//	    lease) → wait until this replica's cache shows it → dispose the
//	    scope's activations, deepest first. lift: DeleteDrain → wait →
//	    liveness sweep. A coordinator deletes drain.<parent> once that
//	    agent's lease is gone or replaced.
//
//	grants (authority.user; coordinator)
//	    CreateGrant under the grant's hash, with a per-key TTL of its
//	    lifetime; read by Grant (a replica's absence re-read from the
//	    leader) on every request that carries it (expiry checked there).
//
//	heartbeats (every host and coordinator)
//	    PutHost every interval (HeartbeatLoop); DeleteHost when it stops.
