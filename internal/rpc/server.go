package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/brood-dev/brood/internal/gopool"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/tracecontext"
)

// Server serves the requests of one process: the endpoints of its micro
// services (queue subscriptions) and plain subjects (a host's own subjects).
// Each request runs in a goroutine of its own, at most InFlightMax at once
// across the server (a request beyond that waits in its subscription), and
// every such goroutine is tracked: Stop returns only after each of them
// returned. Handlers get the server's context, which Stop cancels once its
// grace ran out.
//
// A handler goroutine that finished its request waits up to HandlerIdleMax
// for the next one before it exits, so a busy server reuses goroutines
// whose stacks already grew: a fresh goroutine's stack grows (and is
// copied) several times while it decodes a request by reflection and
// writes to JetStream, which was a fifth of the coordinator's CPU per
// followup and about 6 % of a one-shot run's (issue 12's profile). Stop
// ends the idle ones and waits for them. The handlers' context carries
// the server's goroutine pool (internal/gopool), so the helpers a handler
// starts with gopool.Go reuse those goroutines too, and Stop waits for them.
type Server struct {
	nc     *nats.Conn
	log    *slog.Logger
	sem    chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	track  tracker
	// pool runs the handlers, and the helpers they start with gopool.Go
	// (ctx carries it).
	pool *gopool.Pool
	// policy is the reply subjects the server answers (WithReplyPolicy;
	// nil: the default ReplyPolicy).
	policy atomic.Pointer[ReplyPolicy]

	mu       sync.Mutex
	services []*Service
	subs     []*nats.Subscription // plain subjects (Handle)
}

// NewServer returns a server on nc running at most inFlightMax handlers at
// once (at least 1).
func NewServer(nc *nats.Conn, inFlightMax int, log *slog.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	pool := gopool.New(ctx)
	return &Server{nc: nc, log: log, sem: make(chan struct{}, max(inFlightMax, 1)), ctx: gopool.WithPool(ctx, pool), cancel: cancel, pool: pool}
}

// HandlerIdleMax is how long a handler goroutine waits for its next request
// before it exits (see Server).
const HandlerIdleMax = gopool.IdleMax

// run runs f on an idle handler goroutine, or on a new one. The caller has
// tracked f's request (s.track), so Stop's wait for the requests comes
// before its wait for the handler goroutines.
func (s *Server) run(f func()) { s.pool.Go(f) }

// Handle serves subject (wildcards allowed) on a plain subscription: every
// subscriber gets each request. It is for subjects only this process serves
// (a host's own subjects); shared work goes to a Service's endpoints.
func (s *Server) Handle(subject string, h Handler) error {
	return s.Subscribe(subject, "", nil, h)
}

// Subscribe serves subject in queue group queue ("": every subscriber gets
// each request). accept, when set, picks the requests h answers; the others
// are left unanswered, for another subscriber (a catch-all beside endpoints).
func (s *Server) Subscribe(subject, queue string, accept func(*nats.Msg) bool, h Handler) error {
	cb := func(m *nats.Msg) {
		if (accept == nil || accept(m)) && s.admits(m) {
			s.dispatch(nil, nil, requestOf(s.nc, m), h)
		}
	}
	sub, err := subscribe(s.nc, subject, queue, cb)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	return nil
}

// dispatch runs h for req in a tracked goroutine once a slot is free, and
// records the outcome in st (nil: no statistics). svc, when set, tracks the
// request too, so the service's Stop waits for it.
func (s *Server) dispatch(svc *Service, st *endpointStats, req Request, h Handler) {
	received := time.Now()
	select {
	case s.sem <- struct{}{}:
	case <-s.ctx.Done():
		s.finish(st, req, received, nil, errStopping())
		return
	}
	if !s.track.add() {
		<-s.sem
		s.finish(st, req, received, nil, errStopping())
		return
	}
	if svc != nil && !svc.track.add() {
		s.track.done()
		<-s.sem
		s.finish(st, req, received, nil, errStopping())
		return
	}
	s.run(func() {
		defer s.track.done()
		if svc != nil {
			defer svc.track.done()
		}
		slot := &heldSlot{sem: s.sem}
		defer slot.release()
		ctx, span := tracecontext.StartServer(s.ctx, req.subject, req.header)
		ctx = context.WithValue(ctx, slotKey{}, slot)
		reply, err := s.call(ctx, h, req)
		if err != nil && s.ctx.Err() != nil && protocol.CodeOf(err) == protocol.CodeCancelled {
			err = errStopping() // cut off by Stop, not by the caller: another instance can answer
		}
		s.finish(st, req, received, reply, err)
		tracecontext.End(span, err)
	})
}

// heldSlot is the request slot (one of InFlightMax) a handler holds until it
// returns, or until it gives it back with Park.
type heldSlot struct {
	sem  chan struct{}
	once sync.Once
}

func (h *heldSlot) release() { h.once.Do(func() { <-h.sem }) }

type slotKey struct{}

// Park gives back the request slot of the handler whose context ctx is,
// before it waits for something other than its own work (a long poll's
// wait for a new record): a handler that parked holds none of the
// server's InFlightMax slots, so its wait takes nothing from the requests
// that do work (docs/security.md, "Fair shares"). The handler must bound
// such waits itself (the coordinator's long polls take a slot of their own,
// per user and per replica). Park once parked, or outside a handler, does
// nothing.
func Park(ctx context.Context) {
	if h, ok := ctx.Value(slotKey{}).(*heldSlot); ok {
		h.release()
	}
}

// call runs h; a panic becomes an INTERNAL reply instead of a dead process.
func (s *Server) call(ctx context.Context, h Handler, req Request) (reply any, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("request handler panicked", "subject", req.subject, "panic", p)
			reply, err = nil, protocol.Errorf(protocol.CodeInternal, "the handler of %s failed", req.subject)
		}
	}()
	return h(ctx, req)
}

func errStopping() error {
	return protocol.Errorf(protocol.CodeUnavailable, "the service is stopping; retry (another instance answers)")
}

// finish sends the reply and records it.
func (s *Server) finish(st *endpointStats, req Request, received time.Time, reply any, err error) {
	failure := send(s.log, req, reply, err)
	if st != nil {
		st.record(time.Since(received), failure)
	}
}

// Stop stops admitting requests and waits for the handlers: every
// subscription is drained (requests already delivered are still handled),
// then Stop waits until every handler returned or ctx is done, then cancels
// the handlers' context and waits for them to return (handlers honour it).
// Idempotent; fine after the connection closed.
func (s *Server) Stop(ctx context.Context) {
	s.mu.Lock()
	subs := append([]*nats.Subscription(nil), s.subs...)
	services := append([]*Service(nil), s.services...)
	s.mu.Unlock()
	for _, svc := range services {
		subs = append(subs, svc.stopAdmitting()...)
	}
	drain(ctx, subs)
	s.track.close()
	if !s.track.wait(ctx) {
		s.log.Warn("requests still in flight at the end of the stop grace; cancelling them")
	}
	s.cancel()
	s.track.wait(context.Background())
	s.pool.Wait() // the idle ones saw the cancel; a handler's helpers (gopool.Go) returned
}

// drain drains subs and waits until they are closed or ctx is done.
func drain(ctx context.Context, subs []*nats.Subscription) {
	for _, sub := range subs {
		_ = sub.Drain() // a closed connection has nothing left to deliver
	}
	for _, sub := range subs {
		for sub.IsValid() && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

// tracker counts running handlers; once closed it admits none.
type tracker struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (t *tracker) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

func (t *tracker) done() { t.wg.Done() }

func (t *tracker) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// wait reports whether every handler returned before ctx was done. Call it
// after close: no handler starts then.
func (t *tracker) wait(ctx context.Context) bool {
	idle := make(chan struct{})
	go func() { t.wg.Wait(); close(idle) }()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// ServiceConfig names a micro service (docs/design.md §3: `nats micro ls` finds it).
type ServiceConfig struct {
	// Name must match ^[A-Za-z0-9_-]+$; Version is semantic (1.2.3).
	Name, Version, Description string
	// QueueGroup of every endpoint (micro's default "q" when empty).
	QueueGroup string
	Metadata   map[string]string
}

var (
	serviceNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	semVerRe      = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
)

// Service is one micro service of a Server: its endpoints and the micro
// protocol's PING, INFO and STATS verbs on $SRV.<verb>[.<name>[.<id>]],
// answered with nats.go micro's own types (see the package comment for why
// the endpoints are not nats.go micro endpoints).
type Service struct {
	srv     *Server
	cfg     ServiceConfig
	id      string
	started time.Time
	track   tracker

	mu        sync.Mutex
	endpoints []*endpointStats
	subs      []*nats.Subscription
	stopped   bool
}

// AddService registers a micro service and subscribes its verbs.
func (s *Server) AddService(cfg ServiceConfig) (*Service, error) {
	if !serviceNameRe.MatchString(cfg.Name) || !semVerRe.MatchString(cfg.Version) {
		return nil, fmt.Errorf("rpc: service name %q or version %q is invalid", cfg.Name, cfg.Version)
	}
	if cfg.QueueGroup == "" {
		cfg.QueueGroup = micro.DefaultQueueGroup
	}
	cfg.Metadata = maps.Clone(cfg.Metadata)
	if cfg.Metadata == nil {
		cfg.Metadata = map[string]string{}
	}
	svc := &Service{srv: s, cfg: cfg, id: nuid.Next(), started: time.Now().UTC()}
	verbs := map[micro.Verb]func() any{
		micro.PingVerb:  func() any { return micro.Ping{ServiceIdentity: svc.identity(), Type: micro.PingResponseType} },
		micro.InfoVerb:  func() any { return svc.Info() },
		micro.StatsVerb: func() any { return svc.Stats() },
	}
	for verb, value := range verbs {
		for _, scope := range [][2]string{{"", ""}, {cfg.Name, ""}, {cfg.Name, svc.id}} {
			subject, err := micro.ControlSubject(verb, scope[0], scope[1])
			if err == nil {
				err = svc.subscribe(subject, "", func(m *nats.Msg) {
					if !s.admits(m) {
						return
					}
					data, _ := json.Marshal(value())
					_ = m.Respond(data)
				})
			}
			if err != nil {
				svc.stopAdmitting()
				return nil, err
			}
		}
	}
	s.mu.Lock()
	s.services = append(s.services, svc)
	s.mu.Unlock()
	return svc, nil
}

// subscribe subscribes cb to subject, in queue group queue unless it is "".
func subscribe(nc *nats.Conn, subject, queue string, cb nats.MsgHandler) (*nats.Subscription, error) {
	sub, err := nc.QueueSubscribe(subject, queue, cb) // an empty queue is a plain subscription
	if err != nil {
		return nil, fmt.Errorf("rpc: subscribe to %s: %w", subject, err)
	}
	return sub, nil
}

func (svc *Service) subscribe(subject, queue string, cb nats.MsgHandler) error {
	sub, err := subscribe(svc.srv.nc, subject, queue, cb)
	if err != nil {
		return err
	}
	svc.mu.Lock()
	svc.subs = append(svc.subs, sub)
	svc.mu.Unlock()
	return nil
}

// AddEndpoint serves subject in the service's queue group with h.
func (svc *Service) AddEndpoint(name, subject string, h Handler) error {
	return svc.AddEndpointOn(name, []string{subject}, h)
}

// AddEndpointOn serves one endpoint on several subjects (the coordinator's
// anonymous and per-user forms, protocol.Subjects.User) in the service's
// queue group: one entry in INFO and STATS, named by the first subject,
// counting the requests of all.
func (svc *Service) AddEndpointOn(name string, subjects []string, h Handler) error {
	if !serviceNameRe.MatchString(name) || len(subjects) == 0 {
		return fmt.Errorf("rpc: endpoint name %q is invalid or has no subject", name)
	}
	st := &endpointStats{info: micro.EndpointInfo{Name: name, Subject: subjects[0], QueueGroup: svc.cfg.QueueGroup}}
	for _, subject := range subjects {
		if err := svc.subscribe(subject, svc.cfg.QueueGroup, func(m *nats.Msg) {
			if !svc.srv.admits(m) {
				return
			}
			svc.srv.dispatch(svc, st, requestOf(svc.srv.nc, m), h)
		}); err != nil {
			return err
		}
	}
	svc.mu.Lock()
	svc.endpoints = append(svc.endpoints, st)
	svc.mu.Unlock()
	return nil
}

// ID is the instance id `nats micro` shows.
func (svc *Service) ID() string { return svc.id }

func (svc *Service) identity() micro.ServiceIdentity {
	return micro.ServiceIdentity{Name: svc.cfg.Name, ID: svc.id, Version: svc.cfg.Version, Metadata: maps.Clone(svc.cfg.Metadata)}
}

// Info is the service's INFO answer.
func (svc *Service) Info() micro.Info {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	eps := make([]micro.EndpointInfo, 0, len(svc.endpoints))
	for _, e := range svc.endpoints {
		eps = append(eps, e.info)
	}
	return micro.Info{ServiceIdentity: svc.identity(), Type: micro.InfoResponseType, Description: svc.cfg.Description, Endpoints: eps}
}

// Stats is the service's STATS answer: per endpoint, the requests answered,
// the error replies among them, and the time from receipt to reply.
func (svc *Service) Stats() micro.Stats {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	out := micro.Stats{ServiceIdentity: svc.identity(), Type: micro.StatsResponseType, Started: svc.started, Endpoints: []*micro.EndpointStats{}}
	for _, e := range svc.endpoints {
		s := e.snapshot()
		out.Endpoints = append(out.Endpoints, &s)
	}
	return out
}

// Stop stops the service admitting requests and waits, until ctx is done,
// for the requests it is handling (the server's other services and subjects
// go on).
func (svc *Service) Stop(ctx context.Context) {
	drain(ctx, svc.stopAdmitting())
	svc.track.close()
	svc.track.wait(ctx)
}

// stopAdmitting unsubscribes the service (once) and returns its subscriptions.
func (svc *Service) stopAdmitting() []*nats.Subscription {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if svc.stopped {
		return nil
	}
	svc.stopped = true
	return svc.subs
}

// endpointStats are one endpoint's statistics.
type endpointStats struct {
	info micro.EndpointInfo

	mu        sync.Mutex
	requests  int
	errors    int
	lastError string
	took      time.Duration
}

// record counts one answered request: how long it took from receipt to
// reply, and its failure ("" when it succeeded).
func (e *endpointStats) record(took time.Duration, failure string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.requests++
	e.took += took
	if failure != "" {
		e.errors++
		e.lastError = failure
	}
}

func (e *endpointStats) snapshot() micro.EndpointStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := micro.EndpointStats{
		Name: e.info.Name, Subject: e.info.Subject, QueueGroup: e.info.QueueGroup,
		NumRequests: e.requests, NumErrors: e.errors, LastError: e.lastError, ProcessingTime: e.took,
	}
	if e.requests > 0 {
		s.AverageProcessingTime = e.took / time.Duration(e.requests)
	}
	return s
}

// send answers req with reply or err and returns the failure to record: the
// error reply as micro's stats show one ("<code>:<description>"), or why the
// reply could not be sent; "" on success.
func send(log *slog.Logger, req Request, reply any, err error) string {
	if req.reply == "" || (err == nil && reply == Replied) {
		return "" // nothing to answer, or the handler answered itself
	}
	if err == nil {
		if reply == nil {
			reply = protocol.Empty{}
		}
		data, merr := protocol.Marshal(req.Encoding, reply)
		switch {
		case merr != nil:
			err = protocol.Errorf(protocol.CodeInternal, "encode reply: %w", merr)
		case int64(len(data))+replyHeaderBytesMax > req.nc.MaxPayload():
			// NATS would refuse it and the caller would hear nothing.
			err = tooLarge(req, len(data))
		default:
			return respond(log, req, contentHeader(req.Encoding), data)
		}
	}
	pe := protocol.AsError(err)
	if pe.Code == protocol.CodeInternal {
		log.Error("request failed", "subject", req.subject, "err", err)
	}
	body, merr := protocol.Marshal(req.Encoding, pe)
	if merr != nil {
		body = nil
	}
	code := strconv.Itoa(pe.Code.Number())
	h := contentHeader(req.Encoding)
	h.Set(micro.ErrorCodeHeader, code)
	h.Set(micro.ErrorHeader, pe.Error())
	if failure := respond(log, req, h, body); failure != "" {
		return failure
	}
	return code + ":" + pe.Error()
}

func respond(log *slog.Logger, req Request, h nats.Header, data []byte) string {
	if req.reply == "" {
		return ""
	}
	if err := req.nc.PublishMsg(&nats.Msg{Subject: req.reply, Header: h, Data: data}); err != nil {
		log.Debug("reply failed", "subject", req.subject, "err", err)
		return fmt.Sprintf("%v: %v", micro.ErrRespond, err)
	}
	return ""
}

// replyHeaderBytesMax is room kept for a reply's headers within the
// server's max_payload (NATS counts headers and body together).
const replyHeaderBytesMax = 1024

// tooLarge is the answer to a request whose reply would exceed the server's
// max_payload: LIMIT_EXCEEDED with the sizes and a hint, instead of no
// reply at all (issue 17).
func tooLarge(req Request, size int) *protocol.Error {
	return protocol.NewError(protocol.CodeLimitExceeded, map[string]any{
		"limit": "reply size",
		"reason": fmt.Sprintf("the reply to %s is %d bytes in %s, over this NATS server's max_payload of %d bytes; ask in MessagePack (smaller than JSON), read a smaller page, or read a large result from the child's session log (sessions.log, page by page)",
			req.subject, size, req.Encoding.ContentType(), req.nc.MaxPayload()),
	})
}
