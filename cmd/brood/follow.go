package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brood-dev/brood/pkg/protocol"
)

// followLog prints a session's header and log, then each new event as it is
// logged, until the session's agent is done (see logCmd). It reads the log
// subject with an ordered consumer from its first record, so the history and
// the live part come from one ordered stream with no gap between them.
func followLog(ctx context.Context, s *session, id string, asJSON bool) error {
	if !protocol.ValidID(id) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "session id %q is not a valid id", id)
	}
	// The header (NOT_FOUND for an unknown id) and how much is history.
	h, history, err := s.cl.Log(ctx, id)
	if err != nil {
		return err
	}
	pending := int64(len(history))
	if asJSON {
		if err := printJSONLine(s.out, struct {
			Header protocol.SessionHeader `json:"header"`
		}{h}); err != nil {
			return err
		}
	} else {
		printHeader(s.out, h)
	}
	js, err := jetstream.New(s.cl.Conn())
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, s.cl.Subjects().StreamLog())
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "stream %s: %v", s.cl.Subjects().StreamLog(), err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.cl.Subjects().Log(id)}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "follow %s: %v", id, err)
	}
	msgs := make(chan jetstream.Msg, 64)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "follow %s: %v", id, err)
	}
	defer cc.Stop()

	mode := ""
	if h.ParentSession == "" {
		mode = "root"
	}
	// A continuable activation settles a moment after its last turn ends,
	// and logs nothing then: once caught up, ask again every followDonePoll.
	tick := time.NewTicker(followDonePoll)
	defer tick.Stop()
	next, ownTurnEnded := int64(0), false
	for {
		if next >= pending && s.followDone(ctx, id, mode, ownTurnEnded) {
			return nil
		}
		var m jetstream.Msg
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			continue
		case m = <-msgs:
		}
		var rec protocol.LogRecord
		if err := protocol.Unmarshal(protocol.Msgpack, m.Data(), &rec); err != nil {
			return protocol.Errorf(protocol.CodeInternal, "log record of %s does not decode: %v", id, err)
		}
		for _, ev := range rec.Events {
			if ev.Seq < next {
				continue
			}
			next = ev.Seq + 1
			if asJSON {
				if err := printJSONLine(s.out, ev); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(s.out, formatEvent(ev, h))
			}
			switch ev.Type {
			case protocol.EvSubagentDescriptor:
				var d protocol.DescriptorData
				if ev.Seq >= h.SeedLength && ev.Decode(&d) == nil {
					mode = d.Mode
				}
			case protocol.EvTurnEnd:
				ownTurnEnded = ownTurnEnded || ev.Seq >= h.SeedLength
			}
		}
	}
}

// followDonePoll is how often a caught-up follow asks whether the agent is done.
const followDonePoll = 500 * time.Millisecond

// followDone reports whether a followed session's agent is done: a one-shot
// child once its turn ended (turnEnded: one of its own turns ended); a continuable child once it has no live
// activation and nothing queued; a root never (Ctrl-C ends the follow).
func (s *session) followDone(ctx context.Context, id, mode string, turnEnded bool) bool {
	switch mode {
	case "root":
		return false
	case protocol.ModeOneShot:
		return turnEnded
	case protocol.ModeContinuable:
		auth, err := s.userAuthority(ctx)
		if err != nil {
			return false
		}
		st, err := s.cl.State(ctx, id, auth)
		return err == nil && st.State == protocol.StateNone && st.Queued == 0
	}
	return false // no descriptor seen yet: the child is being created
}
