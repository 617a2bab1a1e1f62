package provider

import (
	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/worker"
)

// The session-level contract. The host drives these very types (they are
// declared once, by the host framework, so a session written against this
// package is what the host runs); what each promises is said here.

// Provider is one provider a host serves.
//
// Descriptor returns its descriptor (docs/protocol.md §9.1): its name
// (^[A-Za-z0-9_-]{1,64}$, not "root"), the start options it accepts, whether
// it is continuable and whether it inherits its parent's context. Every
// instance of a provider must return an equal descriptor.
//
// NewSession composes one child over its log (SessionSpec). It returns a
// *protocol.Error to refuse the start with that error's code (nothing was
// logged yet). ctx bounds the composition and the writes it makes (a fork's
// seed) and ends once the run or epoch started: a session must not keep it.
// A provider that also implements Preparer is asked before the child's
// header is written (docs/protocol.md §9.2).
type Provider = worker.Provider

// Session is one hosted child as the host drives it.
//
// OpenTurn appends the turn's first record (turn/start and the user message,
// fenced on the log's last sequence) and reports whether the turn opened; the
// Outcome says why not (Fenced: the lease was lost, nothing more may be
// written). RunSteps runs the turn to its end and appends its records, the
// last one ending with turn/end; it returns the turn's Outcome. When ctx is
// cancelled with ErrLeaseLost as its cause the session appends nothing more;
// with a *Cancel cause it ends the turn aborted. Events returns the session's
// events as it logged them (the host derives the run's result from them).
type Session = worker.Session

// SessionSpec is what a provider needs to compose one child: its header and
// resolved start options, the run's credential (for tools that call the
// coordinator as the child), Log (the fenced appender of the child's session
// log), Events (its existing events on a cold resume, empty for a new child),
// and for a continuable child its Inbox.
type SessionSpec = worker.SessionSpec

// ContinuableSession is a session that hosts a continuable child's
// activation: it claims its turns from the child's inbox one at a time
// (docs/protocol.md §9.4). A session that is not one serves one-shot runs
// only; its provider's descriptor must then say continuable: false.
type ContinuableSession = worker.ContinuableSession

// Preparer is implemented by providers with a creation spec (a fork's seed):
// the coordinator asks it before writing a child's header, whose seedLength
// records the answer (docs/protocol.md §9.2).
type Preparer = worker.Preparer

// Closer is implemented by sessions that hold resources beyond their turn
// (an agent process): the host calls Close once the run settled or was
// dropped. Close must be idempotent and bounded in time.
type Closer = worker.Closer

// Input is one turn's input: the user message, its source, and for a claimed
// inbox item its sequence (logged as agent/inbox/dequeue before it is used).
type Input = agent.Input

// Outcome is how a turn ended: its number, its turn-end reason, whether the
// session was fenced (lost its lease) and the error that ended it.
type Outcome = agent.Outcome

// Appender appends events to a child's session log, fenced on the last
// sequence it wrote; it returns the events as written (with their sequences)
// or an error wrapping the store's fence refusal when another host appended.
type Appender = agent.Appender

// Inbox is a continuable child's inbox: the items queued above a sequence,
// and their removal once their claim is logged.
type Inbox = agent.Inbox

// Cancel is the cause given to a turn's context when the turn is
// interrupted or disposed: the session ends the turn aborted with Cause.
type Cancel = agent.Cancel

// ErrLeaseLost is the cause given to a turn's context when its host lost the
// child's lease: the session stops at once and appends nothing more
// (docs/protocol.md §9.8).
var ErrLeaseLost = agent.ErrLeaseLost
