package protocol

// EpSessionsResult answers what a child answered last (sessions.result).
const EpSessionsResult = "sessions.result"

// SessionResultRequest is the body of sessions.result: a child's last
// finished turn. Authority: a user grant, or the child's exact live parent.
type SessionResultRequest struct {
	SessionID string    `msgpack:"sessionId" json:"sessionId"`
	Authority Authority `msgpack:"authority" json:"authority"`
}

// SessionResultReply is the answer of a child's last finished turn of its
// own (after any fork seed): Finished false when none ended yet. Output
// follows the output selection rule within that turn (the last assistant
// message with text); StopReason derives from the turn's end as for a
// one-shot run; Structured is the turn's accepted structured_output value;
// Diagnostic is the turn's error, or "cause <cause>" for an aborted turn.
// The coordinator reads only the log's tail, not the whole log.
type SessionResultReply struct {
	SessionID  string         `msgpack:"sessionId" json:"sessionId"`
	Mode       string         `msgpack:"mode,omitempty" json:"mode,omitempty"`
	Finished   bool           `msgpack:"finished" json:"finished"`
	Turn       int64          `msgpack:"turn,omitempty" json:"turn,omitempty"`
	StopReason StopReason     `msgpack:"stopReason,omitempty" json:"stopReason,omitempty"`
	Output     []ContentBlock `msgpack:"output" json:"output"`
	Structured any            `msgpack:"structured,omitempty" json:"structured,omitempty"`
	Diagnostic string         `msgpack:"diagnostic,omitempty" json:"diagnostic,omitempty"`
	ErrorCode  Code           `msgpack:"errorCode,omitempty" json:"errorCode,omitempty"`
	EndedAt    int64          `msgpack:"endedAt,omitempty" json:"endedAt,omitempty"`
	// Usage is what the turn spent, its own and its subtree's
	// (docs/protocol.md §6.6); present when Finished.
	Usage *UsageSummary `msgpack:"usage,omitempty" json:"usage,omitempty"`
}
