package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// scriptedLog is a coordinator's answers to a follow of a continuable child
// (followReads): its log shows logged events of events, and a long poll
// (WaitMs) that finds nothing new shows the rest (the turn goes on
// meanwhile); State answers none with nothing queued throughout, as a
// coordinator that judged the activation's host dead for the moment does.
type scriptedLog struct {
	header protocol.SessionHeader
	mu     sync.Mutex
	events []protocol.SessionEvent
	logged int
	asked  []int // how many events were logged at each State call
}

func (l *scriptedLog) Header(context.Context, protocol.SessionGetRequest) (protocol.SessionHeader, error) {
	return l.header, nil
}

func (l *scriptedLog) LogPage(_ context.Context, req protocol.LogReadRequest) (protocol.LogPage, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if req.WaitMs > 0 && int(req.FromSeq) >= l.logged {
		l.logged = len(l.events)
	}
	evs := l.events[min(int(req.FromSeq), l.logged):l.logged]
	return protocol.LogPage{Events: evs, NextSeq: int64(l.logged), Complete: true}, nil
}

// Retrying asks once: the scripted coordinator never fails.
func (l *scriptedLog) Retrying(ctx context.Context, _ string, f func(context.Context) error) error {
	return f(ctx)
}

func (l *scriptedLog) State(_ context.Context, req protocol.ChildRef) (protocol.StateReply, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, l.logged)
	return protocol.StateReply{ChildID: req.ChildID, State: protocol.StateNone}, nil
}

// TestFollowDoesNotEndWhileATurnIsOpen: `brood log --follow` of a
// continuable child ends on a state of none only once no turn of the
// child's is open in its log; a none read during a turn (a coordinator's
// momentary judgement of the activation's host) does not end it. Before,
// TestLogVerbFollowsLive failed once under load: the follow ended after the
// turn's user/message, its turn still running.
func TestFollowDoesNotEndWhileATurnIsOpen(t *testing.T) {
	ev := func(typ string, data any) protocol.SessionEvent { return newEvent(t, typ, data) }
	turn := []protocol.SessionEvent{
		ev(protocol.EvSubagentDescriptor, protocol.DescriptorData{Version: 2, Mode: protocol.ModeContinuable, Provider: "spawn"}),
		ev(protocol.EvTurnStart, protocol.TurnData{Turn: 1}),
		ev(protocol.EvUserMessage, protocol.UserMessageData{Turn: 1, Content: protocol.Text("sleep 1500ms")}),
		ev(protocol.EvTurnEnd, protocol.TurnEndData{Turn: 1, Reason: protocol.TurnEndReason{Kind: protocol.TurnCompleted}}),
	}
	for i := range turn {
		turn[i].Seq = int64(i)
	}
	cases := []struct {
		name   string
		logged int // events logged when the follow starts
	}{
		{"the turn runs when the follow starts", 3},
		{"the turn ended before the follow started", 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := &scriptedLog{header: protocol.SessionHeader{ID: "C1", ParentSession: "P1"}, events: turn, logged: c.logged}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var out bytes.Buffer
			if err := follow(ctx, l, &out, "C1", protocol.Authority{Grant: "G"}, false); err != nil || ctx.Err() != nil {
				t.Fatalf("follow: %v (context: %v)", err, ctx.Err())
			}
			if !strings.Contains(out.String(), "turn 1 completed") {
				t.Fatalf("the follow ended before the turn did:\n%s", out.String())
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, n := range l.asked {
				if n < len(turn) {
					t.Fatalf("the state was asked with %d of %d events logged (asked at %v): during the turn", n, len(turn), l.asked)
				}
			}
		})
	}
}
