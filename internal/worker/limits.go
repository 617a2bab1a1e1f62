package worker

import "time"

// The host's own bounds (its request-facing ones, ClaimBudgetMax,
// DescendantsDisposeTimeout, protocol.HostDisposeWaitMax, are where they
// apply). Each is a constant here so no wait of the host is a bare number.
const (
	// LeaseWriteTimeout bounds one lease write or read of the host outside a
	// request: marking a run Ending, releasing a settled run's lease,
	// reading an activation's ancestry.
	LeaseWriteTimeout = 5 * time.Second
	// EpochEndTimeout bounds the publication of an epoch's end (the notice,
	// the ownership edge, subagent/end) and the release of its lease.
	EpochEndTimeout = 15 * time.Second
	// InboxRemoveTimeout bounds a host's request to the coordinators to
	// delete the inbox items its child's log claimed or discarded (tried
	// once: an item left is removed at a later read, inbox.go).
	InboxRemoveTimeout = 2 * time.Second
	// OrphanDiscardTimeout bounds the discarding of the pending items of an
	// activation disposed by an ended one-shot ancestor.
	OrphanDiscardTimeout = 10 * time.Second
	// SubscribeFlushTimeout bounds the flush that makes the host's
	// subscriptions (its endpoints, an activation's inbox and wake
	// subjects) known to the server before anyone is told they are served.
	SubscribeFlushTimeout = 5 * time.Second
	// ReadRetryWait is how long an activation waits after a failed read of
	// its inbox or its ownership record before it reads again.
	ReadRetryWait = time.Second
	// RetryBackoffStep and RetryBackoffMax space the attempts of a call the
	// host retries while its answer is UNAVAILABLE (the coordinator's
	// descendants.dispose, an activation's ancestry): attempt n waits
	// n×RetryBackoffStep, at most RetryBackoffMax.
	RetryBackoffStep = 200 * time.Millisecond
	RetryBackoffMax  = 2 * time.Second
	// DeregisterTimeout bounds the deletion of the host's record when it
	// stops, and DrainBeatTimeout the heartbeat that announces a drain.
	DeregisterTimeout = 2 * time.Second
	DrainBeatTimeout  = time.Second
	// drainPollInterval is how often a drain looks whether the host is idle.
	drainPollInterval = 20 * time.Millisecond
)
