package provider

import "github.com/brood-dev/brood/pkg/provider/contract"

// The session contract (docs/protocol.md §9), declared in
// pkg/provider/contract, a leaf that stands on nothing of Brood's but
// pkg/protocol, so that the host framework drives these very types: a
// session written against this package is what the host runs. Each name
// here is that package's; its doc there says what each method promises.

type (
	// Provider is one provider a host serves: its descriptor
	// (docs/protocol.md §9.1) and NewSession, which composes one child over
	// its log and refuses a start with a *protocol.Error's code.
	Provider = contract.Provider
	// Preparer is implemented by providers with a creation spec (a fork's
	// seed): asked before a child's header is written (docs/protocol.md
	// §9.2).
	Preparer = contract.Preparer
	// Session is one hosted child as the host drives it, one turn at a
	// time: OpenTurn logs the turn's first record, RunSteps runs it to
	// turn/end, Events are the session's events in log order
	// (docs/protocol.md §8.3, §9.3).
	Session = contract.Session
	// ContinuableSession is a session that hosts a continuable child's
	// activation, claiming its turns from the child's inbox one at a time
	// (docs/protocol.md §9.4).
	ContinuableSession = contract.ContinuableSession
	// Closer is implemented by sessions that hold resources beyond their
	// turn (an agent process): Close is called once the run settled or was
	// dropped; idempotent, bounded in time.
	Closer = contract.Closer
	// SessionSpec is what a provider needs to compose one child: header,
	// resolved options, credential, its fenced log (Log), its existing
	// events, and for a continuable child its Inbox.
	SessionSpec = contract.SessionSpec
	// Input is one turn's input: the user message, its source, and for a
	// claimed inbox item its sequence.
	Input = contract.Input
	// Outcome is how a turn ended: its number, its turn-end reason
	// (docs/protocol.md §8.4), whether the session was fenced, the append
	// error that ended it.
	Outcome = contract.Outcome
	// Appender appends a child's events to its log, fenced
	// (docs/protocol.md §9.6); its error wraps ErrFenced when another
	// writer appended.
	Appender = contract.Appender
	// Inbox is a continuable child's inbox: the items queued above a
	// sequence, and their removal once their claim is logged
	// (docs/protocol.md §7.4).
	Inbox = contract.Inbox
	// InboxLog is what a session's log says of its inbox items: sequences
	// seen and done, messageIds done.
	InboxLog = contract.InboxLog
	// Cancel is the cause given to a turn's context when the turn is
	// interrupted or disposed: the session ends the turn aborted with Cause.
	Cancel = contract.Cancel
)

var (
	// ErrLeaseLost is the cause given to a turn's context when its host
	// lost the child's lease: the session stops at once and appends nothing
	// more (docs/protocol.md §9.8).
	ErrLeaseLost = contract.ErrLeaseLost
	// ErrFenced is what an Appender's error wraps when another writer
	// appended to the child's log: write nothing more (docs/protocol.md
	// §9.6).
	ErrFenced = contract.ErrFenced
)
