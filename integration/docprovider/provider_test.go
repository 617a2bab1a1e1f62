// Package docprovider_test holds a provider worker written only against
// docs/protocol.md §9 (and the records of §7 and §8 it names): it imports
// no package of Brood's but services/dev, which runs the deployment under
// test, so every record, subject, header and fence it uses is the one the
// document states (issue 37, item 6). The worker and the client speak
// plain NATS (nats.go and its jetstream package) and MessagePack
// (vmihailenco/msgpack); the client speaks JSON (§1.3).
package docprovider_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/brood-dev/brood/services/dev"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	prefix       = "brood" // §3: the default subject prefix
	providerName = "mini"
	heartbeat    = 200 * time.Millisecond // §7.7: rewritten every heartbeat interval
	requestWait  = 20 * time.Second
)

// descriptor is the §9.1 ProviderDescriptor of the minimal provider: no
// capability, not inheriting, one-shot only, no global tools.
var descriptor = map[string]any{
	"name":                  providerName,
	"capabilities":          map[string]bool{"outputSchema": false, "depthLimit": false, "toolFilter": false, "persona": false},
	"inheritsParentContext": false,
	"continuable":           false,
	"tools":                 nil,
}

// startRequest is the §9.3 ProviderStartRequest (the fields this provider
// reads; unknown ones are ignored, §1.2).
type startRequest struct {
	RunID       string           `msgpack:"runId"`
	Header      map[string]any   `msgpack:"header"`
	Provider    string           `msgpack:"provider"`
	Prompt      []map[string]any `msgpack:"prompt"`
	Notify      string           `msgpack:"notify"`
	Source      map[string]any   `msgpack:"source"`
	RunRevision string           `msgpack:"runRevision"` // a Seq: a decimal string (§1.5)
	Run         map[string]any   `msgpack:"run"`
	Deadline    int64            `msgpack:"deadline"`
	Options     map[string]any   `msgpack:"options"`
	Ancestry    []string         `msgpack:"ancestry"`
}

// miniWorker is the provider worker ("host", §9).
type miniWorker struct {
	t      *testing.T
	nc     *nats.Conn
	js     jetstream.JetStream
	hosts  jetstream.KeyValue // brood_hosts, §7.7
	agents jetstream.KeyValue // brood_agents, §7.6
	runs   jetstream.KeyValue // brood_runs, §7.8
	hostID string             // <scope>.<unique>, §7.7
	wg     sync.WaitGroup
}

func now() int64 { return time.Now().UnixMilli() }

func token() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b) // §1.5: a credential
}

// reply answers m in MessagePack (§12.1: a worker answers in the request's
// encoding and marks its reply).
func reply(m *nats.Msg, v any) {
	data, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	r := nats.NewMsg(m.Reply)
	r.Header.Set("Content-Type", "application/msgpack")
	r.Data = data
	_ = m.RespondMsg(r)
}

// replyError answers m with an error reply (§2.1).
func replyError(m *nats.Msg, code string, number int, message string) {
	data, _ := msgpack.Marshal(map[string]any{"code": code, "message": message})
	r := nats.NewMsg(m.Reply)
	r.Header.Set("Content-Type", "application/msgpack")
	r.Header.Set("Nats-Service-Error-Code", strconv.Itoa(number))
	r.Header.Set("Nats-Service-Error", code+": "+message)
	r.Data = data
	_ = m.RespondMsg(r)
}

// start registers the worker (§9.1 start-up order): subscribe its host
// subjects and its provider's start subject, flush, then put its host
// record and keep putting it every heartbeat.
func (w *miniWorker) start(ctx context.Context) {
	t := w.t
	// Host subjects (§9.5): this provider hosts no activation; it answers
	// what it does not serve with INVALID_ARGUMENT.
	if _, err := w.nc.Subscribe(prefix+".v1.host."+w.hostID+".*", func(m *nats.Msg) {
		replyError(m, "INVALID_ARGUMENT", 1001, "this host serves no "+m.Subject[strings.LastIndex(m.Subject, ".")+1:])
	}); err != nil {
		t.Fatal(err)
	}
	// The start subject (§3, §9.3): a plain subscription of this instance.
	if _, err := w.nc.Subscribe(prefix+".v1.provider."+providerName+"."+w.hostID+".start", func(m *nats.Msg) {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.handleStart(ctx, m)
		}()
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	startedAt := now()
	put := func() error {
		rec, _ := msgpack.Marshal(map[string]any{
			"hostId": w.hostID, "kind": "worker", "providers": []any{descriptor},
			"heartbeat": now(), "startedAt": startedAt, "heartbeatMs": heartbeat.Milliseconds(),
		})
		_, err := w.hosts.Put(ctx, w.hostID, rec)
		return err
	}
	if err := put(); err != nil {
		t.Fatal(err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				// §9.1 stopping: delete the host key.
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = w.hosts.Delete(dctx, w.hostID)
				cancel()
				return
			case <-tick.C:
				_ = put()
			}
		}
	}()
}

// appendRecord appends one log record (§7.3, §9.6) fenced on the
// subject's last stream sequence last, and returns the new one.
func (w *miniWorker) appendRecord(ctx context.Context, childID string, firstSeq int, last uint64, events []map[string]any) (uint64, error) {
	data, err := msgpack.Marshal(map[string]any{"events": events})
	if err != nil {
		return 0, err
	}
	ack, err := w.js.Publish(ctx, prefix+".v1.log."+providerName+"."+childID, data,
		jetstream.WithExpectLastSequencePerSubject(last),
		jetstream.WithMsgID(fmt.Sprintf("%s.%d.%s", childID, firstSeq, w.hostID)))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// event publishes a lifecycle event (§7.5).
func (w *miniWorker) event(ctx context.Context, kind string, req startRequest, childID, parent string, extra map[string]any) error {
	ev := map[string]any{
		"type": "subagent/" + kind, "runId": req.RunID, "provider": providerName, "id": childID,
		"parentSession": parent, "local": true, "mode": "one-shot", "time": now(),
	}
	for k, v := range extra {
		ev[k] = v
	}
	data, _ := msgpack.Marshal(ev)
	_, err := w.js.Publish(ctx, prefix+".v1.events."+providerName+"."+parent+"."+kind, data,
		jetstream.WithMsgID("ev."+providerName+"."+req.RunID+"."+kind))
	return err
}

// handleStart carries out §9.3: checks, the claim and the lease, the first
// turn's opening, subagent/start, the answer; then the turn, the
// settlement (§9.7), subagent/end, the notice request and the lease's
// release.
func (w *miniWorker) handleStart(ctx context.Context, m *nats.Msg) {
	var req startRequest
	if err := msgpack.Unmarshal(m.Data, &req); err != nil {
		replyError(m, "INVALID_ARGUMENT", 1001, "undecodable start: "+err.Error())
		return
	}
	childID, _ := req.Header["id"].(string)
	parent, _ := req.Header["parentSession"].(string)
	runChild, _ := req.Run["childId"].(string)
	runID, _ := req.Run["runId"].(string)
	rev, err := strconv.ParseUint(req.RunRevision, 10, 64)
	if childID == "" || runID != req.RunID || runChild != childID || err != nil || rev == 0 {
		replyError(m, "INVALID_ARGUMENT", 1001, "runId, run and header disagree")
		return
	}
	if len(req.Prompt) > 0 && req.Prompt[0]["text"] == "refuse" {
		// A start this provider refuses before its claim: a final answer
		// (§12.1), so the coordinator settles the run never started.
		replyError(m, "INVALID_ARGUMENT", 1001, "this provider refuses the prompt \"refuse\"")
		return
	}
	if now() > req.Deadline {
		return // step 2: dropped, nothing written
	}
	// Step 3: claim the run (KV update at runRevision) and take the lease.
	run := req.Run
	run["hostId"], run["startedAt"] = w.hostID, now()
	claimed, _ := msgpack.Marshal(run)
	stateKey := "state." + providerName + "." + req.RunID
	claimRev, err := w.runs.Update(ctx, stateKey, claimed, rev)
	if err != nil {
		replyError(m, "NOT_PENDING", 1023, "claim: "+err.Error())
		return
	}
	cred := token()
	sum := sha256.Sum256([]byte(cred))
	leaseKey := "lease." + providerName + "." + childID
	lease, _ := msgpack.Marshal(map[string]any{
		"sessionId": childID, "kind": "one-shot", "hostId": w.hostID, "epoch": 1, "runId": req.RunID,
		"provider": providerName, "credentialHash": hex.EncodeToString(sum[:]), "parentSession": parent,
		"ancestry": req.Ancestry, "notify": req.Notify, "createdAt": now(),
	})
	leaseRev, err := w.agents.Create(ctx, leaseKey, lease)
	if err != nil {
		replyError(m, "NOT_PENDING", 1023, "lease: "+err.Error())
		return
	}
	// Step 5: the first turn's opening record (§8.2), the first append of
	// the log, expecting last subject sequence 0.
	source := req.Source
	if source == nil {
		source = map[string]any{"kind": "user"}
	}
	label, _ := req.Options["label"].(string)
	desc := map[string]any{"version": 2, "mode": "one-shot", "provider": providerName}
	if label != "" {
		desc["label"] = label
	}
	t0 := now()
	last, err := w.appendRecord(ctx, childID, 0, 0, []map[string]any{
		{"seq": 0, "type": "turn/start", "time": t0, "data": map[string]any{"turn": 1}},
		{"seq": 1, "type": "user/message", "time": t0, "data": map[string]any{"id": childID + "-t1", "turn": 1, "content": req.Prompt, "source": source}},
		{"seq": 2, "type": "subagent/descriptor", "time": t0, "data": desc},
	})
	if err != nil {
		replyError(m, "DURABILITY_FAILED", 1014, "open the first turn: "+err.Error())
		return
	}
	// Step 7: subagent/start, the answer, then the turn.
	if err := w.event(ctx, "start", req, childID, parent, nil); err != nil {
		w.t.Errorf("subagent/start: %v", err)
	}
	reply(m, map[string]any{"hostId": w.hostID})

	var prompt []string
	for _, b := range req.Prompt {
		if s, ok := b["text"].(string); ok {
			prompt = append(prompt, s)
		}
	}
	output := []map[string]any{{"type": "text", "text": "mini: " + strings.Join(prompt, " ")}}
	t1 := now()
	if _, err := w.appendRecord(ctx, childID, 3, last, []map[string]any{
		{"seq": 3, "type": "step/start", "time": t1, "data": map[string]any{"turn": 1, "step": 1}},
		{"seq": 4, "type": "assistant/message", "time": t1, "data": map[string]any{"turn": 1, "step": 1, "message": map[string]any{"content": output}}},
		{"seq": 5, "type": "step/end", "time": t1, "data": map[string]any{"turn": 1, "step": 1}},
		{"seq": 6, "type": "turn/end", "time": t1, "data": map[string]any{"turn": 1, "reason": map[string]any{"kind": "completed"}}},
	}); err != nil {
		w.t.Errorf("the turn's record: %v", err)
		return
	}
	// §9.7: settle at the claim's revision, with the settled state's TTL
	// (§7.8: RunsMaxAge, 24 h).
	result := map[string]any{
		"output": output, "outputFrom": map[string]any{"seq": 4, "turn": 1, "step": 1, "last": true},
		"structured": nil, "stopReason": "completed",
	}
	run["state"], run["settledAt"], run["settledBy"], run["result"] = "settled", now(), w.hostID, result
	settled, _ := msgpack.Marshal(run)
	msg := nats.NewMsg("$KV." + prefix + "_runs." + stateKey)
	msg.Data = settled
	msg.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(claimRev, 10))
	msg.Header.Set("Nats-TTL", "24h")
	if _, err := w.js.PublishMsg(ctx, msg); err != nil {
		w.t.Errorf("settle: %v", err)
		return
	}
	// The winner publishes subagent/end, then asks a coordinator for the
	// notice, then deletes the lease at its revision.
	if err := w.event(ctx, "end", req, childID, parent, map[string]any{"stopReason": "completed", "lastAssistantMessage": output}); err != nil {
		w.t.Errorf("subagent/end: %v", err)
	}
	if err := w.nc.Publish(prefix+".v1.notice."+providerName+"."+req.RunID, nil); err != nil {
		w.t.Errorf("notice: %v", err)
	}
	if err := w.agents.Delete(ctx, leaseKey, jetstream.LastRevision(leaseRev)); err != nil {
		w.t.Errorf("release the lease: %v", err)
	}
}

// call sends a JSON request to a coordinator endpoint (§1.3, §5) and
// decodes the reply, failing the test on an error reply (§2.1).
func call(t *testing.T, nc *nats.Conn, endpoint string, req, out any) {
	t.Helper()
	if code := callCode(t, nc, endpoint, req, out); code != "" {
		t.Fatalf("%s answered %s", endpoint, code)
	}
}

// callCode is call that returns an error reply's code (§2.1) instead.
func callCode(t *testing.T, nc *nats.Conn, endpoint string, req, out any) string {
	t.Helper()
	data, _ := json.Marshal(req)
	m := nats.NewMsg(prefix + ".v1.coord." + endpoint)
	m.Header.Set("Content-Type", "application/json")
	m.Data = data
	r, err := nc.RequestMsg(m, requestWait)
	if err != nil {
		t.Fatalf("%s: %v", endpoint, err)
	}
	if r.Header.Get("Nats-Service-Error") != "" {
		var e struct{ Code, Message string }
		if err := json.Unmarshal(r.Data, &e); err != nil {
			t.Fatalf("%s: undecodable error %q", endpoint, r.Header.Get("Nats-Service-Error"))
		}
		return e.Code
	}
	if err := json.Unmarshal(r.Data, out); err != nil {
		t.Fatalf("%s: %v (%s)", endpoint, err, r.Data)
	}
	return ""
}

func TestAProviderWrittenFromTheDocRunsAOneShotChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// §9: a new provider's log and inbox streams exist before its workers
	// start (`brood provision --providers`; services/dev: Providers).
	d, err := dev.Start(ctx, dev.Config{DataDir: t.TempDir(), Providers: []string{providerName}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	nc, err := nats.Connect(d.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket := func(name string) jetstream.KeyValue {
		kv, err := js.KeyValue(ctx, prefix+"_"+name)
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	w := &miniWorker{t: t, nc: nc, js: js, hosts: bucket("hosts"), agents: bucket("agents"), runs: bucket("runs"),
		hostID: providerName + ".doc-only-1"}
	wctx, stopWorker := context.WithCancel(ctx)
	w.start(wctx)
	defer func() { stopWorker(); w.wg.Wait() }()

	// Registered: providers.list (§5.1) lists it with its descriptor.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var l struct {
			Providers []map[string]any `json:"providers"`
			Instances map[string]int   `json:"instances"`
		}
		call(t, nc, "providers.list", map[string]any{}, &l)
		if l.Instances[providerName] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("provider %s not listed: %+v", providerName, l)
		}
		time.Sleep(50 * time.Millisecond) // a poll with a deadline
	}

	var root struct{ SessionID, Credential string }
	call(t, nc, "agents.open", map[string]any{"cwd": t.TempDir()}, &root)
	parent := map[string]any{"sessionId": root.SessionID, "credential": root.Credential}
	var started struct{ RunID, ChildID string }
	call(t, nc, "runs.start", map[string]any{
		"provider": providerName, "parent": parent, "label": "doc-only",
		"prompt": []map[string]any{{"type": "text", "text": "hello"}},
	}, &started)
	var status struct {
		State  string `json:"state"`
		Result struct {
			Output     []map[string]any `json:"output"`
			StopReason string           `json:"stopReason"`
			ErrorCode  string           `json:"errorCode"`
			Diagnostic string           `json:"diagnostic"`
		} `json:"result"`
	}
	call(t, nc, "runs.await", map[string]any{"runId": started.RunID, "parent": parent, "waitMs": 15000}, &status)
	if status.State != "settled" || status.Result.StopReason != "completed" || len(status.Result.Output) != 1 || status.Result.Output[0]["text"] != "mini: hello" {
		t.Fatalf("the run ended %+v", status)
	}

	// The child is listed with its descriptor (§5.14), its log reads
	// whole (§5.18) and its lifecycle events are kept (§7.5, §5.19).
	var kids struct {
		Rows []map[string]any `json:"rows"`
	}
	call(t, nc, "children.list", map[string]any{"parent": root.SessionID, "authority": map[string]any{"parent": parent}}, &kids)
	if len(kids.Rows) != 1 || kids.Rows[0]["kind"] != "child" || kids.Rows[0]["label"] != "doc-only" || kids.Rows[0]["provider"] != providerName {
		t.Fatalf("children.list: %+v", kids.Rows)
	}
	var page struct {
		Events   []map[string]any `json:"events"`
		Complete bool             `json:"complete"`
	}
	call(t, nc, "sessions.log", map[string]any{"sessionId": started.ChildID, "authority": map[string]any{"parent": parent}}, &page)
	if len(page.Events) != 7 || !page.Complete {
		t.Fatalf("sessions.log: %d events, complete %v", len(page.Events), page.Complete)
	}
	// A start the provider refuses: its error is the answer, the run is
	// settled never started, and the child it left (a header, no log) is
	// listed as not started, not as a damaged child (§5.14).
	var none struct{}
	if code := callCode(t, nc, "runs.start", map[string]any{
		"provider": providerName, "parent": parent, "label": "refused",
		"prompt": []map[string]any{{"type": "text", "text": "refuse"}},
	}, &none); code != "INVALID_ARGUMENT" {
		t.Fatalf("a refused start answered %q, want the provider's INVALID_ARGUMENT", code)
	}
	call(t, nc, "children.list", map[string]any{"parent": root.SessionID, "authority": map[string]any{"parent": parent}}, &kids)
	if len(kids.Rows) != 2 || kids.Rows[1]["kind"] != "diagnostic" || kids.Rows[1]["reason"] != "not-started" ||
		kids.Rows[1]["provider"] != providerName || kids.Rows[1]["mode"] != "one-shot" {
		t.Fatalf("children.list after a refused start: %+v", kids.Rows)
	}

	deadline = time.Now().Add(15 * time.Second)
	for {
		var evs struct {
			Events []map[string]any `json:"events"`
		}
		call(t, nc, "events.read", map[string]any{"parent": root.SessionID, "authority": map[string]any{"parent": parent}}, &evs)
		var types []string
		for _, e := range evs.Events {
			types = append(types, fmt.Sprint(e["type"]))
		}
		if strings.Join(types, ",") == "subagent/start,subagent/end" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lifecycle events: %v", types)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
