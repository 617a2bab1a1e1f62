package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// WrittenRecord is a stored record whose writer always sets some of its
// fields: a value that lacks one of them was not written by that writer
// (docs/security.md, "Replies go only where replies may go": records are
// decoded strictly), and its readers take it for no record at all.
// Written reports what is missing, nil when the record is whole.
type WrittenRecord interface {
	Written() error
}

// Written: a coordinator mints a grant with its expiry and its own id
// (authority.user). An AgentsOpenReply stored under a grant key (the
// confused deputy of issue 29, item 1) carries an expiresAt but no
// mintedBy.
func (r UserGrantRecord) Written() error {
	if r.ExpiresAt <= 0 || r.MintedBy == "" {
		return errors.New("a user grant record carries expiresAt and mintedBy")
	}
	return nil
}

// Written: a coordinator writes every drain marker with its creation time.
func (r DrainRecord) Written() error {
	if r.CreatedAt <= 0 {
		return errors.New("a drain record carries createdAt")
	}
	return nil
}

// Written: a coordinator writes every closed-root marker with its time.
func (r ClosedRootRecord) Written() error {
	if r.ClosedAt <= 0 {
		return errors.New("a closed-root record carries closedAt")
	}
	return nil
}

// HeaderDigest is the hex SHA-256 of h in MessagePack, as a coordinator
// writes it: a root's lease records its header's (AgentRecord.HeaderDigest),
// so a coordinator can tell the header it wrote from one another role
// published after a purge (the collector may purge headers and put back
// the ones of a tree it stopped removing; docs/security.md, "A collector").
// Decoding a stored header and encoding it again gives the bytes written.
func HeaderDigest(h SessionHeader) string {
	data, err := Marshal(Msgpack, h)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
