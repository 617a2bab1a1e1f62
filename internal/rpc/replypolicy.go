package rpc

import (
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/pkg/protocol"
)

// ReplyPolicy says which reply subjects a Server answers (docs/security.md,
// "Replies go only where replies may go"). A server publishes its answers
// with its own NATS permissions, and a coordinator may publish into its
// buckets and streams: a request whose reply subject named
// $KV.brood_agents.grant.<hash> would have it write a record there (a
// confused deputy). So a Server answers only a reply subject under one of
// Inboxes, and, on a subject that names its caller (UserOf), only one under
// that user's own inbox prefix _INBOX.<user>. (protocol.UserInboxPrefix). A
// request with any other reply subject is refused before its handler runs:
// no answer, nothing done, counted by Refused. A request without a reply
// subject (a plain publish) is served as before.
type ReplyPolicy struct {
	// Inboxes are the prefixes a reply subject must start with, each
	// ending with "." (default: DefaultReplyInboxes, NATS's inbox root,
	// under which every connection of a deployment has its inbox prefix).
	Inboxes []string
	// UserOf returns the user a request to subject comes from (the
	// deployment lets only that user publish there), "" when the subject
	// names no user; nil: none does.
	UserOf func(subject string) string
	// Refused is told of each refused request, with the reason
	// (ReplyOutsideInboxes or ReplyOutsideUserInbox); nil: not told.
	Refused func(subject, reason string)
}

// DefaultReplyInboxes are the reply prefixes a Server answers unless its
// ReplyPolicy names others: "_INBOX." (nats.InboxPrefix), the root of every
// inbox prefix Brood gives a connection (_INBOX.<user>, or _INBOX without a
// user).
var DefaultReplyInboxes = []string{nats.InboxPrefix}

// The reasons a ReplyPolicy refuses a reply subject (the reason label of
// brood_replies_refused_total).
const (
	ReplyOutsideInboxes   = "outside_inboxes"
	ReplyOutsideUserInbox = "outside_user_inbox"
)

// refusal returns why the policy refuses to answer a request to subject on
// reply, "" when it may answer (or reply is empty: nothing to answer).
func (p *ReplyPolicy) refusal(subject, reply string) string {
	if reply == "" {
		return ""
	}
	if p.UserOf != nil {
		if user := p.UserOf(subject); user != "" {
			if !strings.HasPrefix(reply, protocol.UserInboxPrefix(user)+".") {
				return ReplyOutsideUserInbox
			}
			return ""
		}
	}
	inboxes := p.Inboxes
	if len(inboxes) == 0 {
		inboxes = DefaultReplyInboxes
	}
	for _, prefix := range inboxes {
		if strings.HasPrefix(reply, prefix) && len(reply) > len(prefix) {
			return ""
		}
	}
	return ReplyOutsideInboxes
}

// WithReplyPolicy sets the server's ReplyPolicy; call it before the server
// subscribes anything. A Server without one answers DefaultReplyInboxes
// only.
func (s *Server) WithReplyPolicy(p ReplyPolicy) *Server {
	s.policy.Store(&p)
	return s
}

// admits reports whether the server may answer m (its ReplyPolicy); a
// refused request is logged, counted and otherwise ignored.
func (s *Server) admits(m *nats.Msg) bool {
	p := s.policy.Load()
	if p == nil {
		p = &ReplyPolicy{}
	}
	reason := p.refusal(m.Subject, m.Reply)
	if reason == "" {
		return true
	}
	s.log.Debug("request refused: its reply subject is not one this service answers (docs/security.md)",
		"subject", m.Subject, "reply", m.Reply, "reason", reason)
	if p.Refused != nil {
		p.Refused(m.Subject, reason)
	}
	return false
}
