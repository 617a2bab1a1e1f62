package coordinator_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brood-dev/brood/internal/buildinfo"
	"github.com/brood-dev/brood/internal/rpc"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// rawReq sends body to a coordinator endpoint as `nats req` would, with the
// given headers (nil: none), and returns the reply message.
func rawReq(t *testing.T, nc *nats.Conn, subject, body string, header nats.Header) *nats.Msg {
	t.Helper()
	m := &nats.Msg{Subject: subject, Data: []byte(body), Header: header}
	resp, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	return resp
}

func jsonHeader() nats.Header {
	return nats.Header{protocol.HeaderContentType: []string{protocol.ContentTypeJSON}}
}

// TestDrivingTheCoordinatorByHand covers what a user typing `nats req` meets:
// JSON without the header, a mistyped endpoint, `>` in error texts, run
// notices in the request's encoding, and the label's two places.
func TestDrivingTheCoordinatorByHand(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	nc := s.Conn()
	subj := s.Store.Subj

	t.Run("JSON without Content-Type is understood and answered in JSON", func(t *testing.T) {
		for _, body := range []string{`{}`, " \n\t{}"} {
			resp := rawReq(t, nc, subj.Coord(protocol.EpProvidersList), body, nil)
			if resp.Header.Get(protocol.HeaderContentType) != protocol.ContentTypeJSON {
				t.Fatalf("reply content type %q", resp.Header.Get(protocol.HeaderContentType))
			}
			var r protocol.ProvidersListReply
			if err := json.Unmarshal(resp.Data, &r); err != nil || r.Instances["spawn"] != 1 {
				t.Fatalf("reply %s: %v", resp.Data, err)
			}
		}
		// An error about a JSON body also comes back as JSON.
		resp := rawReq(t, nc, subj.Coord(protocol.EpRunsStart), `{"provider":"spawn","bogus":1}`, nil)
		var pe protocol.Error
		if err := json.Unmarshal(resp.Data, &pe); err != nil || pe.Code != protocol.CodeInvalidArgument || !strings.Contains(pe.Message, "bogus") {
			t.Fatalf("error reply %s: %v", resp.Data, err)
		}
	})

	t.Run("a body that is neither says how to send one", func(t *testing.T) {
		resp := rawReq(t, nc, subj.Coord(protocol.EpAgentsOpen), `cwd=/tmp`, nil)
		perr := rpc.ErrorOf(resp)
		if perr == nil || perr.Code != protocol.CodeInvalidArgument || !strings.Contains(perr.Message, "Content-Type: application/json") {
			t.Fatalf("error %+v", perr)
		}
	})

	t.Run("a mistyped endpoint is NOT_FOUND with the list of endpoints", func(t *testing.T) {
		resp := rawReq(t, nc, subj.Coord("runs.strat"), `{}`, jsonHeader())
		perr := rpc.ErrorOf(resp)
		if perr == nil || perr.Code != protocol.CodeNotFound || !strings.Contains(perr.Message, `"runs.strat"`) ||
			!strings.Contains(perr.Message, protocol.EpRunsStart) || !strings.Contains(perr.Message, protocol.EpChildrenList) {
			t.Fatalf("error %+v", perr)
		}
		if resp.Header.Get(protocol.HeaderServiceErrorCode) != "1020" {
			t.Fatalf("headers %v", resp.Header)
		}
		// MessagePack callers get the same answer.
		err := s.Client.Call(context.Background(), "runs.strat", protocol.Empty{}, nil)
		if protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("msgpack call of a mistyped endpoint = %v", err)
		}
		// A real endpoint answers once: the catch-all stays silent.
		inbox := nc.NewRespInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := nc.PublishMsg(&nats.Msg{Subject: subj.Coord(protocol.EpProvidersList), Reply: inbox, Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		first, err := sub.NextMsg(10 * time.Second)
		if err != nil || rpc.ErrorOf(first) != nil {
			t.Fatalf("first reply %v %v", first, err)
		}
		if extra, err := sub.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("a second reply to a real endpoint: %s %v", extra.Data, extra.Header)
		}
	})

	t.Run("JSON errors keep > as is", func(t *testing.T) {
		resp := rawReq(t, nc, subj.Coord(protocol.EpRunsStart), `{"provider":"spawn","parent":{"sessionId":"x","credential":"y"},"prompt":[{"type":"text","text":"x"}],"notify":"a.>"}`, jsonHeader())
		if strings.Contains(string(resp.Data), `\u003e`) || !strings.Contains(string(resp.Data), "brood.>") {
			t.Fatalf("error body %s", resp.Data)
		}
	})

	root := s.Root()
	parent, _ := json.Marshal(root.Ref())

	t.Run("a JSON start gets its run notice in JSON", func(t *testing.T) {
		notify := "test.notify." + nc.NewRespInbox()[len("_INBOX."):]
		sub, err := nc.SubscribeSync(notify)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		resp := rawReq(t, nc, subj.Coord(protocol.EpRunsStart), `{"provider":"spawn","parent":`+string(parent)+`,"label":"by hand","prompt":[{"type":"text","text":"say a > b"}],"notify":"`+notify+`"}`, nil)
		var started protocol.RunStartReply
		if err := json.Unmarshal(resp.Data, &started); err != nil || started.RunID == "" {
			t.Fatalf("start reply %s: %v", resp.Data, err)
		}
		m, err := sub.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var n protocol.RunNotice
		if err := json.Unmarshal(m.Data, &n); err != nil || n.RunID != started.RunID || protocol.PlainText(n.Result.Output) != "a > b" {
			t.Fatalf("notice %q: %v", m.Data, err)
		}
		if m.Header.Get(protocol.HeaderContentType) != protocol.ContentTypeJSON || strings.Contains(string(m.Data), `\u003e`) {
			t.Fatalf("notice headers %v body %s", m.Header, m.Data)
		}
		if label := descriptorLabel(t, s, started.ChildID); label != "by hand" {
			t.Fatalf("top-level label recorded as %q", label)
		}
	})

	t.Run("label is accepted at the top level and under options", func(t *testing.T) {
		cases := []struct {
			endpoint, body string
			want           string
			code           protocol.Code
		}{
			{protocol.EpRunsStart, `"label":"a","options":{"label":"a"}`, "a", ""},
			{protocol.EpRunsStart, `"options":{"label":"old place"}`, "old place", ""},
			{protocol.EpRunsStart, `"label":"a","options":{"label":"b"}`, "", protocol.CodeInvalidArgument},
			{protocol.EpContinuableStart, `"label":"top"`, "top", ""},
			{protocol.EpContinuableStart, `"options":{"label":"under options"}`, "under options", ""},
			{protocol.EpContinuableStart, `"label":"a","options":{"label":"b"}`, "", protocol.CodeInvalidArgument},
		}
		for _, tc := range cases {
			resp := rawReq(t, nc, subj.Coord(tc.endpoint), `{"provider":"spawn","parent":`+string(parent)+`,"prompt":[{"type":"text","text":"say x"}],`+tc.body+`}`, nil)
			if perr := rpc.ErrorOf(resp); perr != nil || tc.code != "" {
				if perr == nil || perr.Code != tc.code {
					t.Fatalf("%s %s: %+v, want %s", tc.endpoint, tc.body, perr, tc.code)
				}
				continue
			}
			var r struct{ ChildID string }
			if err := json.Unmarshal(resp.Data, &r); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 10*time.Second, func() bool { return descriptorLabel(t, s, r.ChildID) == tc.want },
				"%s %s: label %q", tc.endpoint, tc.body, tc.want)
		}
	})
}

// descriptorLabel is the label recorded in a child's descriptor ("" if none yet).
func descriptorLabel(t *testing.T, s *stack.Stack, id string) string {
	_, evs := s.Log(id)
	for _, ev := range evs {
		var d protocol.DescriptorData
		if ev.Type == protocol.EvSubagentDescriptor && ev.Decode(&d) == nil {
			return d.Label
		}
	}
	return ""
}

func TestEveryMicroServiceReportsTheBuildVersion(t *testing.T) {
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	s.AddForkWorker()
	nc := s.Conn()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.PING", inbox, nil); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for len(seen) < 3 {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("pings answered: %v (%v)", seen, err)
		}
		var p struct{ Name, Version string }
		if err := json.Unmarshal(m.Data, &p); err != nil {
			t.Fatal(err)
		}
		seen[p.Name] = p.Version
	}
	for _, name := range []string{protocol.CoordinatorService, protocol.ProviderServicePrefix + "spawn", protocol.ProviderServicePrefix + "fork"} {
		if seen[name] != buildinfo.Version || seen[name] == "" {
			t.Fatalf("%s reports version %q, want %q (all: %v)", name, seen[name], buildinfo.Version, seen)
		}
	}
}
