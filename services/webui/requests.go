package webui

// Requests (docs/protocol.md §5.21; issue 33, item 4): the page lists the
// pending requests for approval and the questions of the trees its grant
// covers (requests.list with the view's grant: the coordinator decides
// which, as it decides which sessions the view reads) and answers them
// through requests.answer with the same grant, as `brood approve`, `brood
// deny` and `brood answer` run with that grant would. The coordinator's
// checks decide every answer; its typed errors (UNAUTHORIZED,
// ALREADY_ANSWERED, INVALID_ARGUMENT, …) come back to the page as they are.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/brood-dev/brood/pkg/protocol"
)

// RequestsPoll is how often the server lists the pending requests while a
// page is open (one requests.list for every page: they share the grant).
const RequestsPoll = time.Second

// answerBodyBytesMax bounds an answer's body: the coordinator's bound on an
// answer's text or json (protocol.RequestAnswerBytesMax), escaped in JSON,
// and the rest of the body.
const answerBodyBytesMax = 8*protocol.RequestAnswerBytesMax + 8<<10

// requestsWatch lists the pending requests, every RequestsPoll while some
// page stream is subscribed (and at once when an answer was given), and
// hands each list that differs from the last to the subscribers.
type requestsWatch struct {
	list func(context.Context) (protocol.RequestsListReply, error)

	mu   sync.Mutex
	last []byte // the last list sent, as JSON
	subs map[chan []byte]struct{}
	wake chan struct{}
}

func newRequestsWatch(list func(context.Context) (protocol.RequestsListReply, error)) *requestsWatch {
	return &requestsWatch{list: list, subs: map[chan []byte]struct{}{}, wake: make(chan struct{}, 1)}
}

// subscribe returns the last list sent (nil: none yet) and a channel of
// the later ones; each holds only the newest list a page has not taken.
func (w *requestsWatch) subscribe() ([]byte, chan []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan []byte, 1)
	w.subs[ch] = struct{}{}
	w.poke()
	return w.last, ch
}

func (w *requestsWatch) unsubscribe(ch chan []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs, ch)
}

// poke makes the watch list again now (after an answer).
func (w *requestsWatch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run lists while there are subscribers, until ctx is done.
func (w *requestsWatch) run(ctx context.Context) {
	tick := time.NewTicker(RequestsPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-w.wake:
		}
		w.mu.Lock()
		n := len(w.subs)
		w.mu.Unlock()
		if n == 0 {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := w.list(lctx)
		cancel()
		if err != nil {
			continue // the next tick tries again; the page keeps the last list
		}
		data, err := json.Marshal(l)
		if err != nil {
			continue
		}
		w.mu.Lock()
		if !bytes.Equal(data, w.last) {
			w.last = data
			for ch := range w.subs {
				select { // keep only the newest list
				case <-ch:
				default:
				}
				ch <- data
			}
		}
		w.mu.Unlock()
	}
}

// listPending is the watch's list: the pending requests the view's grant
// may answer.
func (s *Server) listPending(ctx context.Context) (protocol.RequestsListReply, error) {
	return s.cfg.Client.Requests(ctx, protocol.RequestsListRequest{Authority: s.authority()})
}

// requests answers requests.list with the view's grant: the pending
// requests (?all=1: answered ones too) of the trees it covers (?under=ID:
// of that session's subtree), oldest first.
func (s *Server) requests(w http.ResponseWriter, r *http.Request) {
	if !s.waitReady(w, r) {
		return
	}
	q := r.URL.Query()
	reply, err := s.cfg.Client.Requests(r.Context(), protocol.RequestsListRequest{
		Authority: s.authority(), Under: q.Get("under"), All: q.Get("all") == "1" || q.Get("all") == "true"})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, reply)
}

// AnswerBody is the body of POST /api/requests/{id}/answer: Answer is
// approve or deny (Reason, deny only) for an approval, answer with Text or
// JSON (JSON text) for a question, as requests.answer takes them.
type AnswerBody struct {
	Answer string `json:"answer"`
	Reason string `json:"reason,omitempty"`
	Text   string `json:"text,omitempty"`
	JSON   string `json:"json,omitempty"`
}

// answer answers request {id} through requests.answer with the view's
// grant; the coordinator's answer (the answered record, or its error) is
// the reply.
func (s *Server) answer(w http.ResponseWriter, r *http.Request) {
	ctx, cancel, ok := s.action(w, r)
	if !ok {
		return
	}
	defer cancel()
	var body AnswerBody
	if err := decodeBody(w, r, answerBodyBytesMax, &body); err != nil {
		writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "the body must be JSON {answer, reason?, text?, json?}: %v", err))
		return
	}
	rec, err := s.cfg.Client.AnswerRequest(ctx, protocol.RequestAnswerRequest{RequestID: r.PathValue("id"), Authority: s.authority(),
		Answer: body.Answer, Reason: body.Reason, Text: body.Text, JSON: body.JSON})
	s.reqs.poke()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, rec)
}

// raiseBudget raises a child's own budget as `brood budget ID --raise`
// does (budget.raise with the page's grant; docs/protocol.md §5.5, "Pause
// and raise"): the body is a BudgetSpend, {tokens?, modelRequests?,
// toolCalls?, children?}; the reply budget.raise's. A turn paused at the
// cap continues.
func (s *Server) raiseBudget(w http.ResponseWriter, r *http.Request) {
	ctx, cancel, ok := s.action(w, r)
	if !ok {
		return
	}
	defer cancel()
	var raise protocol.BudgetSpend
	if err := decodeBody(w, r, raiseBodyBytesMax, &raise); err != nil {
		writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "the body must be JSON {tokens?, modelRequests?, toolCalls?, children?}: %v", err))
		return
	}
	reply, err := s.cfg.Client.RaiseBudget(ctx, r.PathValue("id"), s.authority(), raise)
	s.reqs.poke()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, reply)
}

// raiseBodyBytesMax bounds a raise's body, in bytes.
const raiseBodyBytesMax = 4 << 10

// decodeBody decodes an action's body into v: one JSON value of at most
// bytesMax bytes, with no field v does not know and nothing after it (a
// second value is an error, not ignored).
func decodeBody(w http.ResponseWriter, r *http.Request, bytesMax int64, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, bytesMax))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
