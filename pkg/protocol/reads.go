package protocol

// Reads through the coordinator (docs/design.md §14, "Reads go through the
// coordinator"): session headers and logs, past and live lifecycle events,
// and a root's inbox. Each endpoint checks authority, so a client in any
// language needs no JetStream permission: it sends requests to
// `<prefix>.v1.coord.>` and receives every answer, streams included, on
// subjects under its own reply (inbox) prefix.
//
// Who may read what (checked by every read endpoint):
//   - a user grant reads every session, event and inbox;
//   - the credential of a live agent A reads the sessions of A's subtree
//     (A itself and every session whose ancestry contains A), and the
//     lifecycle events whose parent is in that subtree;
//   - a root's inbox is read and acknowledged by that root's own credential
//     (or a grant; only a root's inbox is ever acknowledged: a child's items
//     are claimed by its activation, which logs each claim first).

// Read endpoints, served on `<prefix>.v1.coord.<endpoint>` like the others.
const (
	EpSessionsGet  = "sessions.get"
	EpSessionsLog  = "sessions.log"
	EpEventsRead   = "events.read"
	EpEventsFollow = "events.follow"
	EpInboxRead    = "inbox.read"
	EpInboxAck     = "inbox.ack"
)

// Bounds of the read endpoints. Each is a default and a maximum a request
// may ask for; a larger request is capped, never refused.
const (
	// LogPageEventsDefault and LogPageEventsMax bound the events of one
	// sessions.log page.
	LogPageEventsDefault = 256
	LogPageEventsMax     = 1024
	// ReadPageBytesMax bounds the encoded events or items of one page of
	// sessions.log, events.read or inbox.read (512 KiB); a single event or
	// item larger than that travels alone in its page.
	ReadPageBytesMax = 512 << 10
	// ReadWaitMsMax caps the waitMs of a long poll (sessions.log,
	// inbox.read): 60 s.
	ReadWaitMsMax = 60_000
	// EventsPageDefault and EventsPageMax bound the events of one events.read page.
	EventsPageDefault = 256
	EventsPageMax     = 1024
	// EventsScanMsgsMax bounds the stream messages one events.read (or one
	// step of a follow) examines, matching or not; a page that stopped there
	// says complete: false and its cursor moves on.
	EventsScanMsgsMax = 4096
	// InboxPageItemsDefault and InboxPageItemsMax bound the items of one inbox.read page.
	InboxPageItemsDefault = 64
	InboxPageItemsMax     = 256
	// InboxAckSeqsMax bounds the sequences of one inbox.ack.
	InboxAckSeqsMax = 256
	// FollowCreditMsgsDefault and FollowCreditMsgsMax bound the messages a
	// follow may have in flight to its client (events sent but not yet
	// granted back by a credit request).
	FollowCreditMsgsDefault = 256
	FollowCreditMsgsMax     = 1024
	// FollowHeartbeatMsDefault, FollowHeartbeatMsMin and FollowHeartbeatMsMax
	// bound the interval of a follow's heartbeats.
	FollowHeartbeatMsDefault = 5_000
	FollowHeartbeatMsMin     = 1_000
	FollowHeartbeatMsMax     = 30_000
	// FollowLeaseMs is how long a follow lives without a credit request from
	// its client: a client that went away stops costing anything after it.
	FollowLeaseMs = 30_000
)

// SessionGetRequest is the body of sessions.get: the session's header.
type SessionGetRequest struct {
	SessionID string    `msgpack:"sessionId" json:"sessionId"`
	Authority Authority `msgpack:"authority" json:"authority"`
}

// LogReadRequest is the body of sessions.log: one page of a session's events
// from event seq FromSeq on. Cursor, from the previous page, lets the next
// read start at the right record instead of scanning from the log's start
// (a wrong cursor is detected and ignored). EventsMax defaults to 256 and is
// capped at 1,024. WaitMs (capped at 60 s) makes a read that finds no event
// at FromSeq or later wait for one (a live tail of the log).
type LogReadRequest struct {
	SessionID string    `msgpack:"sessionId" json:"sessionId"`
	Authority Authority `msgpack:"authority" json:"authority"`
	FromSeq   int64     `msgpack:"fromSeq,omitempty" json:"fromSeq,omitempty"`
	Cursor    Seq       `msgpack:"cursor,omitempty" json:"cursor,omitempty"`
	EventsMax int       `msgpack:"eventsMax,omitempty" json:"eventsMax,omitempty"`
	WaitMs    int64     `msgpack:"waitMs,omitempty" json:"waitMs,omitempty"`
}

// LogPage answers sessions.log. Events are in seq order starting at the
// request's FromSeq (empty when the log has no such event yet). Ask for the
// next page with FromSeq = NextSeq and Cursor = Cursor. Complete is true when
// the page reached the last event the log held when it was read.
type LogPage struct {
	Events   []SessionEvent `msgpack:"events" json:"events"`
	NextSeq  int64          `msgpack:"nextSeq" json:"nextSeq"`
	Cursor   Seq            `msgpack:"cursor" json:"cursor"`
	Complete bool           `msgpack:"complete" json:"complete"`
}

// EventsReadRequest is the body of events.read: past lifecycle events, in
// stream order, after stream sequence AfterSeq. Parent selects the events of
// that parent's children; with Descendants, of its whole subtree; without
// Parent (a user grant only), every event. EventsMax defaults to 256 and is
// capped at 1,024.
type EventsReadRequest struct {
	Parent      string    `msgpack:"parent,omitempty" json:"parent,omitempty"`
	Descendants bool      `msgpack:"descendants,omitempty" json:"descendants,omitempty"`
	Authority   Authority `msgpack:"authority" json:"authority"`
	AfterSeq    Seq       `msgpack:"afterSeq,omitempty" json:"afterSeq,omitempty"`
	EventsMax   int       `msgpack:"eventsMax,omitempty" json:"eventsMax,omitempty"`
}

// EventsPage answers events.read. Each event carries its stream sequence
// (Seq). Cursor is the last stream sequence examined, matching or not: pass
// it as the next AfterSeq. Complete is true when the read examined the
// stream up to its last message at the time of the read.
type EventsPage struct {
	Events   []LifecycleEvent `msgpack:"events" json:"events"`
	Cursor   Seq              `msgpack:"cursor" json:"cursor"`
	Complete bool             `msgpack:"complete" json:"complete"`
}

// EventsFollowRequest is the body of events.follow: lifecycle events streamed
// to the request's reply subject as they happen. Its scope is that of
// events.read. AfterSeq, when present, resumes after that stream sequence
// (past events first, then live ones); absent, only events published from
// now on. CreditMsgs is the initial credit (default 256, capped at 1,024):
// how many event messages the coordinator may send before the client grants
// more. HeartbeatMs (default 5,000; 1,000 … 30,000) is how often an idle
// follow sends a heartbeat.
type EventsFollowRequest struct {
	Parent      string    `msgpack:"parent,omitempty" json:"parent,omitempty"`
	Descendants bool      `msgpack:"descendants,omitempty" json:"descendants,omitempty"`
	Authority   Authority `msgpack:"authority" json:"authority"`
	AfterSeq    *Seq      `msgpack:"afterSeq,omitempty" json:"afterSeq,omitempty"`
	CreditMsgs  int       `msgpack:"creditMsgs,omitempty" json:"creditMsgs,omitempty"`
	HeartbeatMs int64     `msgpack:"heartbeatMs,omitempty" json:"heartbeatMs,omitempty"`
}

// EventsFollowReply is the first message on the follow's reply subject. The
// follow delivers the events after stream sequence Seq (the request's
// AfterSeq, or the stream's last sequence for a follow of new events only).
// Grant credit (and keep the follow alive) with FollowCreditRequest on
// CreditSubject at least every LeaseMs/3; a follow without a credit request
// for LeaseMs ends.
type EventsFollowReply struct {
	FollowID      string `msgpack:"followId" json:"followId"`
	Seq           Seq    `msgpack:"seq" json:"seq"`
	CreditSubject string `msgpack:"creditSubject" json:"creditSubject"`
	CreditMsgs    int    `msgpack:"creditMsgs" json:"creditMsgs"`
	HeartbeatMs   int64  `msgpack:"heartbeatMs" json:"heartbeatMs"`
	LeaseMs       int64  `msgpack:"leaseMs" json:"leaseMs"`
}

// Follow message kinds.
const (
	FollowEvent     = "event"
	FollowHeartbeat = "heartbeat"
	FollowEnd       = "end"
)

// FollowMessage is every message of a follow after its EventsFollowReply.
// Kind "event" carries one Event and uses one unit of credit; "heartbeat"
// says the follow is alive; "end" says it ended, with the reason in Error
// (UNAVAILABLE: resume elsewhere after Seq; UNAUTHORIZED: the authority
// died). Seq is the last stream sequence examined: resume after it.
type FollowMessage struct {
	Kind  string          `msgpack:"kind" json:"kind"`
	Seq   Seq             `msgpack:"seq" json:"seq"`
	Event *LifecycleEvent `msgpack:"event,omitempty" json:"event,omitempty"`
	Error *Error          `msgpack:"error,omitempty" json:"error,omitempty"`
}

// FollowCreditRequest grants a follow CreditMsgs more messages (0 only keeps
// it alive); Stop ends the follow at once. The credit in flight never
// exceeds FollowCreditMsgsMax.
type FollowCreditRequest struct {
	FollowID   string `msgpack:"followId" json:"followId"`
	CreditMsgs int    `msgpack:"creditMsgs" json:"creditMsgs"`
	Stop       bool   `msgpack:"stop,omitempty" json:"stop,omitempty"`
}

// FollowCreditReply answers a credit request with the follow's credit now.
type FollowCreditReply struct {
	CreditMsgs int `msgpack:"creditMsgs" json:"creditMsgs"`
}

// InboxReadRequest is the body of inbox.read: pending items of a session's
// inbox after inbox sequence AfterSeq, oldest first. ItemsMax defaults to 64
// and is capped at 256. WaitMs (capped at 60 s) makes a read that finds
// nothing wait for an item to arrive (a long poll).
type InboxReadRequest struct {
	SessionID string    `msgpack:"sessionId" json:"sessionId"`
	Authority Authority `msgpack:"authority" json:"authority"`
	AfterSeq  Seq       `msgpack:"afterSeq,omitempty" json:"afterSeq,omitempty"`
	ItemsMax  int       `msgpack:"itemsMax,omitempty" json:"itemsMax,omitempty"`
	WaitMs    int64     `msgpack:"waitMs,omitempty" json:"waitMs,omitempty"`
}

// InboxPage answers inbox.read. Each item carries its inbox sequence. More is
// true when pending items follow the last one returned.
type InboxPage struct {
	Items []InboxItem `msgpack:"items" json:"items"`
	More  bool        `msgpack:"more" json:"more"`
}

// InboxAckRequest is the body of inbox.ack: delete the given items (by inbox
// sequence, at most 256) from a root's inbox once its client has used them.
type InboxAckRequest struct {
	SessionID string    `msgpack:"sessionId" json:"sessionId"`
	Authority Authority `msgpack:"authority" json:"authority"`
	Seqs      []Seq     `msgpack:"seqs" json:"seqs"`
}

// InboxAckReply says how many of the items this request deleted; an item
// already gone is not an error and does not count.
type InboxAckReply struct {
	Removed int `msgpack:"removed" json:"removed"`
}

// InboxRemoveRequest is what a host sends on
// `<prefix>.v1.inboxremove.<provider>.<sessionId>` (Subjects.InboxRemove)
// once the log of child sessionId, of provider provider, records the claim
// (agent/inbox/dequeue) or discard (agent/inbox/discard) of inbox items
// Seqs (1 to InboxAckSeqsMax). A coordinator deletes them only when the
// child's header names that provider, every item still there is on the
// child's inbox subject, and the child's log (read up to its last record
// on the stream's leader) claims or discards each, by its sequence or by
// its messageId (a second copy of a done item, store.KeyedMessageID). The
// reply is InboxAckReply (items already gone do not count), or an error:
// INVALID_ARGUMENT (no sequences, too many, or one that holds another
// session's item), UNAUTHORIZED (not a child of that provider, or an item
// its log does not record as done; nothing is deleted), UNAVAILABLE
// (retry: a deletion is idempotent). (docs/security.md: no worker deletes
// inbox items itself, so none can lose an accepted message.)
type InboxRemoveRequest struct {
	Seqs []Seq `msgpack:"seqs" json:"seqs"`
}

// Inbox item deliveries (docs/design.md §4).
const (
	// DeliveryNextTurn queues the item as a turn of its own (followups, prompts).
	DeliveryNextTurn = "next-turn"
	// DeliveryNextStep joins the running turn at its next step, or starts a
	// turn when the agent is idle (settlement notices, reports).
	DeliveryNextStep = "next-step"
	// DeliveryQuiet is read at the next step or turn but wakes nobody.
	DeliveryQuiet = "quiet"
)

// InboxItem is one pending inbox item: the body of a BROOD_INBOX message,
// whose Brood-Message-Id header repeats MessageID. Seq is the item's inbox
// (stream) sequence: absent in the stored body, set when an item is read.
type InboxItem struct {
	MessageID string         `msgpack:"messageId" json:"messageId"`
	Content   []ContentBlock `msgpack:"content" json:"content"`
	Source    MessageSource  `msgpack:"source" json:"source"`
	Delivery  string         `msgpack:"delivery" json:"delivery"`
	Seq       Seq            `msgpack:"inboxSeq,omitempty" json:"inboxSeq,omitempty"`
	// Trace is the W3C trace context (traceparent, tracestate headers) of
	// the request that accepted the item, read from its message's headers;
	// never encoded. The turn that claims the item continues that trace.
	Trace map[string][]string `msgpack:"-" json:"-"`
}

// ForkSeedRequest is what a host sends on
// `<prefix>.v1.read.<provider>.forkseed.<childId>` (Subjects.Read,
// ReadForkSeed) to read the seed of its fork child childId: the events of
// the child's parent's log from FromSeq (Cursor as in LogReadRequest) below
// the fork point, at most EventsMax (default LogPageEventsDefault, capped at
// LogPageEventsMax) and about ReadPageBytesMax bytes per page. Parent names
// the parent the caller expects. A coordinator answers only for a child
// whose header (written once, by a coordinator) names provider, Parent and a
// seed (seedLength > 0), and only events below seedLength: the reply is a
// LogPage whose Complete is true once the page reaches the fork point.
// Errors: INVALID_ARGUMENT (a malformed request), UNAUTHORIZED (no fork
// child of that provider and parent, whether or not it exists; FromSeq at
// or past the fork point), UNAVAILABLE (retry).
type ForkSeedRequest struct {
	Parent    string `msgpack:"parent" json:"parent"`
	FromSeq   int64  `msgpack:"fromSeq,omitempty" json:"fromSeq,omitempty"`
	Cursor    Seq    `msgpack:"cursor,omitempty" json:"cursor,omitempty"`
	EventsMax int    `msgpack:"eventsMax,omitempty" json:"eventsMax,omitempty"`
}

// AncestryReply answers `<prefix>.v1.read.<provider>.ancestry.<childId>`
// (Subjects.Read, ReadAncestry; an Empty request) for a child whose header
// names provider: EndedAncestor is the first of the child's ancestors (root
// first, from the headers) that is a one-shot run that ended or is ending,
// "" when none is (docs/design.md §14). Errors: INVALID_ARGUMENT, UNAUTHORIZED
// (no child of that provider, whether or not it exists), UNAVAILABLE.
type AncestryReply struct {
	EndedAncestor string `msgpack:"endedAncestor,omitempty" json:"endedAncestor,omitempty"`
}
