// Package contract declares the session contract of Brood's provider SDK:
// the interfaces a provider and its sessions implement and the values the
// host hands them (docs/protocol.md §9, "Implementing a provider worker").
// It is a leaf: it stands on nothing of Brood's but pkg/protocol, so that
// the host framework (which lives inside the module) and a provider written
// outside it name the very same types. A program normally reaches these
// names through github.com/brood-dev/brood/pkg/provider, which declares each
// of them as an alias of the one here.
//
// A host drives a session in turns. For a one-shot run (docs/protocol.md
// §9.3) it composes the child with Provider.NewSession, opens the turn with
// Session.OpenTurn and runs it with Session.RunSteps, then settles the run
// from Session.Events. For a continuable child (docs/protocol.md §9.4) the
// session is a ContinuableSession and the host claims each of its turns
// from the child's inbox with ContinuableSession.ClaimNext, then runs it
// with RunSteps, until nothing is claimable.
package contract

import (
	"context"
	"errors"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Provider is one provider a host serves.
//
// Descriptor returns its descriptor (docs/protocol.md §9.1): its name
// (^[A-Za-z0-9_-]{1,64}$, not "root"), the start capabilities it accepts,
// its tools, whether it is continuable and whether it inherits its parent's
// context. Every instance of a provider, on every host, must return an equal
// descriptor (a host refuses to be built with an invalid name).
//
// NewSession composes one child over its log (SessionSpec). It returns a
// *protocol.Error to refuse the start with that error's code
// (docs/protocol.md §2.2; nothing was logged yet); any other error refuses it
// INTERNAL. Either way the run settles never started (notStarted,
// docs/protocol.md §7.8). ctx bounds the composition and the writes it makes (a fork's
// seed, at most the run's write budget of 60 s) and ends once the run or
// epoch started: a session must not keep it. A provider that also
// implements Preparer is asked before the child's header is written.
type Provider interface {
	Descriptor() protocol.ProviderDescriptor
	NewSession(ctx context.Context, spec SessionSpec) (Session, error)
}

// Preparer is implemented by providers with a creation spec (a fork's seed):
// the coordinator asks it, on `<prefix>.v1.provider.<name>.<hostId>.prepare`,
// before writing a child's header, whose seedLength records the answer
// (docs/protocol.md §9.2, §8.8). A *protocol.Error refuses the start with its
// code (LIMIT_EXCEEDED for a seed past the provider's bound).
type Preparer interface {
	Prepare(ctx context.Context, req protocol.ProviderPrepareRequest) (protocol.ProviderPrepareReply, error)
}

// Session is one hosted child as the host drives it, one turn at a time
// (the host never calls two of its methods concurrently, except Events).
//
// OpenTurn appends the turn's first record (turn/start, the claim when
// in.InboxSeq > 0, the user message; docs/protocol.md §8.3), fenced on the
// log's last sequence, and reports whether the turn opened; when it did not,
// the Outcome says why (Fenced: the lease was lost and nothing more may be
// written; Err: the append failed). RunSteps runs the opened turn to its end,
// appending one record per logical step, the last one ending with turn/end
// (docs/protocol.md §8.4), and returns the turn's Outcome. When ctx is
// cancelled with ErrLeaseLost as its cause the session returns at once and
// appends nothing more; with a *Cancel cause it ends the turn aborted with
// the Cancel's Cause. Events returns every event of the session's log as the
// session wrote or read it, in log order (the host derives the run's result
// from them, docs/protocol.md §8.9); it may be called concurrently with a
// turn.
type Session interface {
	OpenTurn(ctx context.Context, in Input) (Outcome, bool)
	RunSteps(ctx context.Context) Outcome
	Events() []protocol.SessionEvent
}

// ContinuableSession is a session that hosts a continuable child's
// activation (docs/protocol.md §9.4). A session that is not one serves
// one-shot runs only; its provider's descriptor must then say
// continuable: false.
//
// ClaimNext opens a turn with the oldest unclaimed inbox item that wakes the
// child (delivery next-turn or next-step): the opening record logs the claim
// (agent/inbox/dequeue, after agent/inbox/enqueue when the log never named
// the item) before the item is used; claimed is false when nothing is
// waiting, and err is an inbox read that failed. Unclaimed returns the
// inbox's items the log neither claimed nor discarded, oldest first (an item
// is done by its inbox sequence or by its messageId, docs/protocol.md §7.4);
// it may ask the inbox to remove the done ones. Append logs events between
// turns (a fresh child's subagent/descriptor, the closing of a turn a dead
// host left open, the discard of pending items) as one fenced record.
// InboxLog returns what the session's log says of its inbox (a copy).
// CloseOpenTurn returns the events that close a turn the log left open with
// reason, stamped nowMs (milliseconds since the Unix epoch), or none when
// no turn is open (docs/protocol.md §8.4); it appends nothing.
type ContinuableSession interface {
	Session
	ClaimNext(ctx context.Context, in Inbox) (out Outcome, claimed bool, err error)
	Unclaimed(ctx context.Context, in Inbox) ([]protocol.InboxItem, error)
	Append(ctx context.Context, evs ...protocol.SessionEvent) error
	InboxLog() InboxLog
	CloseOpenTurn(reason protocol.TurnEndReason, nowMs int64) ([]protocol.SessionEvent, error)
}

// ParkedSession is implemented by a ContinuableSession that can continue
// a turn its log left parked on a request (docs/protocol.md §5.21, "After
// a restart"): its host died while a tool call waited for an answer, and
// the turn was left open rather than closed interrupted. ParkedTurn
// reports whether the session's log ends in such a turn (nothing is
// closed then when the activation starts); ContinueParked continues it:
// it reads each waiting request again and waits for its answer, logs
// request/answer once, runs the approved call (or records the denial, the
// timeout, the question's answer), records the step's other calls without
// a result as interrupted, and runs the turn's next steps to its end, as
// RunSteps does. A session that is not one has such a turn closed
// interrupted (host-lost), as any turn its host left open.
type ParkedSession interface {
	ContinuableSession
	ParkedTurn() bool
	ContinueParked(ctx context.Context) Outcome
}

// ContinuingSession is implemented by a session that can continue a
// one-shot run's turn its log left open when its host died
// (docs/protocol.md §8.4, "Continued after a host loss"): the host that
// takes the run over builds the session over the log (SessionSpec.Events)
// and calls ContinueTurn instead of OpenTurn and RunSteps. It must not do
// again what the log holds: completed steps and logged tool results stay;
// the model request in flight is sent again; a call logged without its
// result runs again only when its tool is idempotent, and otherwise gets
// an error result saying it was interrupted by a host loss and may or may
// not have taken effect. It runs the turn to its end and returns its
// Outcome, as RunSteps does. A session that is not one is never continued:
// its run ends HOST_LOST when its host dies.
type ContinuingSession interface {
	Session
	ContinueTurn(ctx context.Context) Outcome
}

// Closer is implemented by sessions that hold resources beyond their turn
// (an agent process): the host calls Close once the run settled or was
// dropped. Close must be idempotent and return within seconds; its error is
// logged, not returned to anyone.
type Closer interface{ Close() error }

// SessionSpec is what a provider needs to compose one child.
type SessionSpec struct {
	// Header is the child's session header (docs/protocol.md §8.1), written
	// by a coordinator before the start: its id, scope, parent, cwd, seed.
	Header protocol.SessionHeader
	// Options are the start's options as the coordinator resolved them
	// against the descriptor (docs/protocol.md §5.5): tool filter, persona,
	// output schema, depth limit.
	Options protocol.ResolvedOptions
	// Credential is the run's bearer credential, for tools that call the
	// coordinator as the child (never log it).
	Credential string
	// Log appends to the child's session log, fenced (docs/protocol.md
	// §9.6); it continues after Events.
	Log Appender
	// Events are the session's existing events: the log read on a cold
	// resume, empty for a new child (a seeded provider then writes its
	// seed).
	Events []protocol.SessionEvent
	// Continuable is true for a continuable child's activation: the session
	// must then be a ContinuableSession, and Inbox is its inbox.
	Continuable bool
	// Inbox is the child's inbox (continuable children only; nil else).
	// Next-step items may join a running turn at its next step.
	Inbox Inbox
	// InboxDirty, when set, reports (and clears) whether an item arrived
	// since it was last called; nil means look every time.
	InboxDirty func() bool
}

// Input is one turn's input.
type Input struct {
	// Content is the user message's content (docs/protocol.md §8.3).
	Content []protocol.ContentBlock
	// Source is the message's provenance (docs/protocol.md §8.6).
	Source protocol.MessageSource
	// MessageID is the inbox item's messageId for a claimed item.
	MessageID string
	// InboxSeq is the claimed inbox item's sequence (logged as
	// agent/inbox/dequeue before the message is used); 0 for a one-shot
	// run's prompt.
	InboxSeq protocol.Seq
	// Before are events logged between turn/start and the claim (an inbox
	// enqueue the log had not named yet).
	Before []protocol.SessionEvent
	// Extra are events logged right after the user message (a one-shot
	// run's subagent/descriptor).
	Extra []protocol.SessionEvent
}

// Outcome is how a turn ended.
type Outcome struct {
	// Turn is the turn's number in the session, from 1.
	Turn int64
	// Reason is the turn-end reason logged with turn/end (docs/protocol.md
	// §8.4).
	Reason protocol.TurnEndReason
	// Fenced means the session lost its log to another writer: the host
	// drops it without publishing or settling anything (docs/protocol.md
	// §9.8).
	Fenced bool
	// Err is a log append JetStream did not acknowledge: the run or epoch
	// settles DURABILITY_FAILED.
	Err error
	// Trace is the W3C trace context of the inbox item a claimed turn runs
	// (protocol.InboxItem.Trace), nil when none.
	Trace map[string][]string
}

// Appender appends a session's events to its log. Append writes evs as one
// record, fenced on the last sequence it wrote (docs/protocol.md §9.6), and
// returns them with their sequences assigned. A refused fence returns an
// error wrapping ErrFenced (another writer owns the log: write nothing
// more); a record over the stream's message size (1 047 552 bytes)
// LIMIT_EXCEEDED; an append JetStream did not acknowledge within its
// budget (60 s) another error.
type Appender interface {
	Append(ctx context.Context, evs ...protocol.SessionEvent) ([]protocol.SessionEvent, error)
}

// Inbox is a continuable child's inbox as a session reads it
// (docs/protocol.md §7.4).
type Inbox interface {
	// Pending returns the items above inbox sequence after, oldest first
	// (at most 1 000: a full inbox refuses more).
	Pending(ctx context.Context, after protocol.Seq) ([]protocol.InboxItem, error)
	// Remove asks for the deletion of items whose claim or discard is
	// logged (a coordinator deletes them, 1 to 256 per request). A failed
	// removal leaves them; every later read skips them by their logged
	// claims.
	Remove(ctx context.Context, seqs ...protocol.Seq) error
}

// InboxLog is what a session's log says of its inbox items
// (docs/protocol.md §7.4): the inbox sequences Seen (named by any
// agent/inbox event) and Done (dequeued or discarded), and the messageIds
// done (DoneIDs). An item is done when its sequence or its messageId is.
type InboxLog struct {
	Seen, Done map[protocol.Seq]bool
	DoneIDs    map[string]bool
}

// Cancel is the cause given to a turn's context (context.WithCancelCause)
// when the turn is interrupted or disposed: the session ends the turn
// aborted with Cause (docs/protocol.md §8.4: "interrupted", "disposed",
// "parent", ...). KeepParked is set by a host's own drain: a
// ParkedSession whose turn is parked on a request at that moment stops
// without appending anything more, and the turn stays parked for the
// session's next activation to continue (docs/protocol.md §5.21, "After a
// restart"); any other turn ends aborted with Cause.
type Cancel struct {
	Cause      string
	KeepParked bool
}

// Error returns "cancelled: " and the cause.
func (c *Cancel) Error() string { return "cancelled: " + c.Cause }

var (
	// ErrLeaseLost is the cause given to a turn's context when its host lost
	// the child's lease: the session stops at once and appends nothing more
	// (docs/protocol.md §9.8).
	ErrLeaseLost = errors.New("agent: session lease lost to another host")
	// ErrFenced is what an Appender's error wraps when its fenced append was
	// refused because another writer appended: the caller no longer owns
	// the session log (docs/protocol.md §9.6).
	ErrFenced = errors.New("store: log append fenced by another writer")
)
