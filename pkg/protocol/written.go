package protocol

import "errors"

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
