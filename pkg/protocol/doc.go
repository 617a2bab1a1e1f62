// Package protocol is Brood's wire contract: subjects, message shapes, the
// session event vocabulary and the error catalogue. It is importable by any
// client; docs/protocol.md documents the same contract for other languages.
//
// Every message is MessagePack with camelCase keys (compact integers; absent
// and empty stay distinct), or JSON when the request carries the header
// Content-Type: application/json, in which case the reply is JSON too
// (docs/design.md §3). Errors are *Error values with a stable string Code and a
// stable numeric code (Catalogue); match them with errors.Is against the
// sentinels, e.g. errors.Is(err, protocol.ErrNoProvider).
package protocol
