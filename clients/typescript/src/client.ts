// The Brood client: every call is a NATS request to a coordinator endpoint
// (docs/protocol.md §5) and everything that comes back arrives under the
// connection's own inbox prefix, so the client needs no JetStream permission.

import { decode, encode } from "@msgpack/msgpack";
import {
  AuthorizationError,
  createInbox,
  headers,
  InvalidArgumentError as NatsInvalidArgumentError,
  NoRespondersError,
  nuid,
  RequestError,
  TimeoutError,
  type Msg,
  type NatsConnection,
  type Subscription,
} from "@nats-io/transport-node";

import {
  AuthenticationFailedError,
  brood,
  fromBody,
  type BroodError,
  CancelledError,
  LimitExceededError,
  UnavailableError,
} from "./errors.js";
import { Follow } from "./follow.js";
import {
  Endpoints,
  Limits,
  type AgentsOpenReply,
  type AgentsOpenRequest,
  type AgentsRenewReply,
  type BudgetGetReply,
  type BudgetRaiseReply,
  type BudgetReserveReply,
  type BudgetReserveRequest,
  type BudgetSettleRequest,
  type BudgetSpend,
  type Authority,
  type ChildRef,
  type ChildrenListReply,
  type ChildrenListRequest,
  type ContinuableStartReply,
  type ContinuableStartRequest,
  type DescendantsDisposeRequest,
  type DrainReply,
  type DrainRequest,
  type DrainsListReply,
  type DrainsListRequest,
  type ErrorBody,
  type EventsFollowRequest,
  type EventsPage,
  type EventsReadRequest,
  type FollowupReply,
  type FollowupRequest,
  type InboxAckReply,
  type InboxAckRequest,
  type InboxItem,
  type InboxPage,
  type InboxReadRequest,
  type InterruptReply,
  type InterruptRequest,
  type LogPage,
  type LogReadRequest,
  type ParentRef,
  type ProvidersListReply,
  type ReportRequest,
  type RequestAnswerRequest,
  type RequestGetRequest,
  type RequestOpenRequest,
  type RequestRecord,
  type RequestsListReply,
  type RequestsListRequest,
  type RunNotice,
  type RunRef,
  type RunStartReply,
  type RunStartRequest,
  type RunStatus,
  type SessionEvent,
  type SessionGetRequest,
  type SessionHeader,
  type SessionResultReply,
  type SessionResultRequest,
  type StateReply,
  type SubagentResult,
  type UserGrantReply,
} from "./protocol.js";

/** Options of a Client. */
export interface ClientOptions {
  /** The deployment's subject prefix (default "brood"). */
  prefix?: string;
  /**
   * Bound of each request (default 30 000 ms: longer than a coordinator's
   * whole budget of 20 s, so the client hears the coordinator's own answer;
   * each request tells the coordinator how long it waits, header
   * Brood-Timeout, docs/protocol.md §2.4).
   */
  timeoutMs?: number;
  /** How long Run.result waits for its notice before asking runs.await (default 10 000 ms). */
  awaitFallbackMs?: number;
  /**
   * How long a wait that outlives single requests (Run.result, a Follow's
   * resume) goes on while every attempt is UNAVAILABLE (a broker restarting,
   * the coordinator serving it killed) before it rejects with
   * UnavailableError (default 60 000 ms); a closed connection ends it at
   * once. Connect with `maxReconnectAttempts: -1` to ride out a broker
   * restart (issue 37, item 1).
   */
  outageMaxMs?: number;
  /**
   * The connection's inbox prefix (its `inboxPrefix` option; default: read
   * from the connection, else "_INBOX"). Run notices and follows arrive
   * under it, so a deployment can confine each user's replies to its own prefix.
   */
  inboxPrefix?: string;
  /**
   * The NATS user the client acts as: it calls the coordinator on that
   * user's own subjects, `<prefix>.v1.user.<user>.<endpoint>` (§1.1), where
   * a deployment knows who calls (notify subjects under `_INBOX.<user>`,
   * grants scoped to the user's trees, per-user quotas). Default: the
   * connection's `user` option; none calls `<prefix>.v1.coord.<endpoint>`.
   */
  user?: string;
}

/** Per-call options: a timeout and an AbortSignal (a cancelled call is CANCELLED). */
export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Encodes a request body: MessagePack, undefined fields left out (§1.2). */
export function encodeBody(v: unknown): Uint8Array {
  return encode(v, { ignoreUndefined: true });
}

/** Decodes a MessagePack body. */
export function decodeBody<T>(data: Uint8Array): T {
  return decode(data) as T;
}

/**
 * errorOf returns the BroodError of an error reply (§2.1), or undefined when
 * the message is not one: the body when it decodes, else the
 * Nats-Service-Error header split at its first ": ".
 */
export function errorOf(m: Msg): BroodError | undefined {
  const h = m.headers;
  if (!h) return undefined;
  const num = h.get("Nats-Service-Error-Code");
  const desc = h.get("Nats-Service-Error");
  if (!num && !desc) return undefined;
  if (m.data.length > 0) {
    try {
      const body = decode(m.data) as ErrorBody | null;
      if (body && typeof body.code === "string" && body.code !== "") return fromBody(body);
    } catch {
      // fall back to the header
    }
  }
  const i = desc.indexOf(": ");
  if (i < 0) return brood("INTERNAL", `error ${num}: ${desc}`);
  return brood(desc.slice(0, i), desc.slice(i + 2));
}

/**
 * A failed request mapped to the catalogue, keeping the cause (§2.3): no
 * responders and timeouts are UNAVAILABLE (retryable); a request larger than
 * the server's max_payload is LIMIT_EXCEEDED (limit "request bytes") and a
 * connection whose credentials NATS refused is AUTHENTICATION_FAILED, since
 * sending either again cannot help.
 */
export function transportError(subject: string, err: unknown): BroodError {
  if (err instanceof NatsInvalidArgumentError && err.message.includes("max_payload")) {
    return new LimitExceededError(
      "LIMIT_EXCEEDED",
      `request bytes exceeded: the request to ${subject} is larger than the NATS server's max_payload; send less or split the work; nothing was truncated`,
      { limit: "request bytes", reason: `the request to ${subject} is larger than the NATS server's max_payload` },
      { cause: err },
    );
  }
  if (err instanceof AuthorizationError) {
    return new AuthenticationFailedError("AUTHENTICATION_FAILED", `NATS refused the connection's credentials: ${err.message}`, { reason: err.message }, { cause: err });
  }
  if (err instanceof NoRespondersError || (err instanceof RequestError && err.isNoResponders())) {
    return new UnavailableError("UNAVAILABLE", `nobody serves ${subject}`, undefined, { cause: err });
  }
  if (err instanceof TimeoutError || (err instanceof RequestError && err.cause instanceof TimeoutError)) {
    return new UnavailableError("UNAVAILABLE", `no reply from ${subject} in time`, undefined, { cause: err });
  }
  const msg = err instanceof Error ? err.message : String(err);
  return new UnavailableError("UNAVAILABLE", `request to ${subject}: ${msg}`, undefined, { cause: err });
}

/**
 * Outage tracks how long a wait has been unable to reach the deployment:
 * since the first of its consecutive UNAVAILABLE answers (Client.outageMaxMs).
 */
export class Outage {
  private since = 0;
  constructor(private readonly client: Client) {}

  /**
   * failed records a failed attempt and returns the error to give up with,
   * or undefined while the outage may still pass (the error is UNAVAILABLE,
   * the connection is open, and outageMaxMs has not passed).
   */
  failed(err: unknown, what: string): unknown {
    if (!(err instanceof UnavailableError)) return err;
    if (this.since === 0) this.since = Date.now();
    if (this.client.nc.isClosed()) {
      return new UnavailableError("UNAVAILABLE", `${what}: the NATS connection is closed`, undefined, { cause: err });
    }
    const down = Date.now() - this.since;
    if (down >= this.client.outageMaxMs) {
      return new UnavailableError("UNAVAILABLE", `${what}: the deployment could not be reached for ${Math.round(down / 1000)} s`, undefined, { cause: err });
    }
    return undefined;
  }

  /** ok records a successful attempt: the outage, if any, is over. */
  ok(): void {
    this.since = 0;
  }
}

/** Rejects with CancelledError when signal aborts. */
export function abortable<T>(p: Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(cancelled(what, signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(cancelled(what, signal));
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

export function cancelled(what: string, signal: AbortSignal): CancelledError {
  return new CancelledError("CANCELLED", `${what} cancelled`, undefined, { cause: signal.reason });
}

/**
 * Client talks to the coordinators of one deployment. Every method takes the
 * request shape of docs/protocol.md and resolves to the reply shape; every
 * failure is a BroodError subclass with the catalogue's code.
 */
export class Client {
  readonly nc: NatsConnection;
  readonly prefix: string;
  readonly timeoutMs: number;
  readonly awaitFallbackMs: number;
  readonly outageMaxMs: number;
  readonly inboxPrefix: string;
  readonly user: string;
  private notifySub?: Subscription;
  private notifyPrefix = "";
  private waiters = new Map<string, (n: RunNotice) => void>();

  constructor(nc: NatsConnection, opts: ClientOptions = {}) {
    const prefix = opts.prefix ?? "brood";
    if (!/^[A-Za-z0-9_-]{1,32}$/.test(prefix)) {
      throw brood("INVALID_ARGUMENT", `subject prefix ${JSON.stringify(prefix)} must match ^[A-Za-z0-9_-]{1,32}$`);
    }
    this.nc = nc;
    this.prefix = prefix;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.awaitFallbackMs = opts.awaitFallbackMs ?? 10_000;
    this.outageMaxMs = opts.outageMaxMs ?? 60_000;
    const connOpts = (nc as { options?: { inboxPrefix?: string; user?: string } }).options;
    this.inboxPrefix = opts.inboxPrefix ?? connOpts?.inboxPrefix ?? "_INBOX";
    this.user = opts.user ?? connOpts?.user ?? "";
    if (this.user !== "" && !/^[A-Za-z0-9_-]{1,64}$/.test(this.user)) {
      throw brood("INVALID_ARGUMENT", `user ${JSON.stringify(this.user)} must match ^[A-Za-z0-9_-]{1,64}$ (it names the subjects the client calls)`);
    }
  }

  /**
   * The subject of a coordinator endpoint for this client's user, e.g.
   * brood.v1.user.alice.runs.start, or brood.v1.coord.runs.start without a user.
   */
  subject(endpoint: string): string {
    if (this.user !== "") return `${this.prefix}.v1.user.${this.user}.${endpoint}`;
    return `${this.prefix}.v1.coord.${endpoint}`;
  }

  /** A new subject under the connection's inbox prefix. */
  ownInbox(kind: string): string {
    return `${createInbox(this.inboxPrefix)}.${kind}`;
  }

  /** Sends a request to a coordinator endpoint and decodes its reply. */
  call<T>(endpoint: string, body: unknown, opts: CallOptions = {}): Promise<T> {
    return this.callSubject<T>(this.subject(endpoint), body, opts);
  }

  /** Sends a request to any subject and decodes its reply. */
  async callSubject<T>(subject: string, body: unknown, opts: CallOptions = {}): Promise<T> {
    if (opts.signal?.aborted) throw cancelled(`request to ${subject}`, opts.signal);
    let m: Msg;
    const timeout = opts.timeoutMs ?? this.timeoutMs;
    const h = headers();
    h.set("Brood-Timeout", String(timeout));
    try {
      m = await abortable(this.nc.request(subject, encodeBody(body), { timeout, headers: h }), opts.signal, `request to ${subject}`);
    } catch (err) {
      if (err instanceof CancelledError) throw err;
      throw transportError(subject, err);
    }
    const perr = errorOf(m);
    if (perr) throw perr;
    try {
      return decodeBody<T>(m.data);
    } catch (err) {
      throw brood("INTERNAL", `decode reply from ${subject}: ${String(err)}`, undefined, err);
    }
  }

  /** A long poll's bound: its wait plus the request timeout. */
  private waiting(waitMs: number | undefined, opts: CallOptions): CallOptions {
    const wait = Math.min(Math.max(waitMs ?? 0, 0), Limits.readWaitMsMax);
    return { ...opts, timeoutMs: (opts.timeoutMs ?? this.timeoutMs) + wait };
  }

  /** providers.list (§5.1). */
  providers(opts?: CallOptions): Promise<ProvidersListReply> {
    return this.call(Endpoints.providersList, {}, opts);
  }

  /**
   * authority.user (§5.15) on this client's subject: with a user, a grant
   * over the trees of the roots that user opened; without, over every session.
   */
  userGrant(opts?: CallOptions): Promise<UserGrantReply> {
    return this.call(Endpoints.authorityUser, {}, opts);
  }

  /**
   * authority.user on `<prefix>.v1.coord.authority.user`: a grant over every
   * session, which a deployment lets only trusted hosts mint.
   */
  globalGrant(opts?: CallOptions): Promise<UserGrantReply> {
    return this.callSubject(`${this.prefix}.v1.coord.${Endpoints.authorityUser}`, {}, opts);
  }

  /** agents.open (§5.2), then keeps the root alive every leaseMs/3 until close. */
  async openRoot(req: AgentsOpenRequest, opts?: CallOptions): Promise<Root> {
    const r = await this.call<AgentsOpenReply>(Endpoints.agentsOpen, req, opts);
    return new Root(this, r);
  }

  private ensureNotify(): string {
    if (this.notifySub) return this.notifyPrefix;
    this.notifyPrefix = this.ownInbox("brood");
    this.notifySub = this.nc.subscribe(`${this.notifyPrefix}.*`, {
      callback: (err, m) => {
        if (err) return;
        const token = m.subject.slice(m.subject.lastIndexOf(".") + 1);
        const w = this.waiters.get(token);
        if (!w) return;
        try {
          // The run takes it only when it names the run's own id (Run.result).
          w(decodeBody<RunNotice>(m.data));
        } catch {
          // not a notice: ignore
        }
      },
    });
    return this.notifyPrefix;
  }

  /**
   * runs.start (§5.5): starts a one-shot child and resolves once it is
   * published; its result comes with Run.result. `notify` is set here (a
   * subject under this client's inbox prefix, subscribed before the start).
   */
  async startRun(req: RunStartRequest, opts?: CallOptions): Promise<Run> {
    const prefix = this.ensureNotify();
    const token = nuid.next();
    const notices = new Notices();
    this.waiters.set(token, (n) => notices.push(n));
    try {
      const r = await this.call<RunStartReply>(Endpoints.runsStart, { ...req, notify: `${prefix}.${token}` }, opts);
      return new Run(this, r.runId, r.childId, req.parent, notices, () => this.waiters.delete(token), r.state);
    } catch (err) {
      this.waiters.delete(token);
      throw err;
    }
  }

  /** runs.await (§5.6): a run's status, waiting up to waitMs (capped at 60 s) for it to settle. */
  await(ref: RunRef, opts: CallOptions = {}): Promise<RunStatus> {
    return this.call(Endpoints.runsAwait, ref, this.waiting(ref.waitMs, opts));
  }

  /** runs.dispose (§5.7): cancels a run (idempotent) and resolves to its settled status. */
  dispose(ref: RunRef, opts: CallOptions = {}): Promise<RunStatus> {
    return this.call(Endpoints.runsDispose, ref, { timeoutMs: 40_000, ...opts });
  }

  /**
   * continuable.start (§5.8). With the parent at its live-children limit the
   * start waits in its start queue: the reply's `state` is "queued" and its
   * ids are those the child and its prompt will have once it starts.
   */
  startContinuable(req: ContinuableStartRequest, opts?: CallOptions): Promise<ContinuableStartReply> {
    return this.call(Endpoints.continuableStart, req, opts);
  }

  /** continuable.followup (§5.9). */
  followup(req: FollowupRequest, opts?: CallOptions): Promise<FollowupReply> {
    return this.call(Endpoints.continuableFollowup, req, opts);
  }

  /** continuable.state (§5.10). */
  state(req: ChildRef, opts?: CallOptions): Promise<StateReply> {
    return this.call(Endpoints.continuableState, req, opts);
  }

  /** continuable.interrupt (§5.11). */
  interrupt(req: InterruptRequest, opts?: CallOptions): Promise<InterruptReply> {
    return this.call(Endpoints.continuableInterrupt, req, opts);
  }

  /** continuable.report (§5.12): a resident child reports to its live parent. */
  report(req: ReportRequest, opts?: CallOptions): Promise<FollowupReply> {
    return this.call(Endpoints.continuableReport, req, opts);
  }

  /** continuable.drain (§5.13). */
  drain(req: DrainRequest, opts: CallOptions = {}): Promise<DrainReply> {
    return this.call(Endpoints.continuableDrain, req, { timeoutMs: 60_000, ...opts });
  }

  /** continuable.drains (§5.13). */
  drains(req: DrainsListRequest, opts?: CallOptions): Promise<DrainsListReply> {
    return this.call(Endpoints.continuableDrains, req, opts);
  }

  /**
   * descendants.dispose (§5.13b): disposes the calling agent's live
   * continuable descendants, deepest first, and resolves once they all
   * stopped (what a one-shot run's host sends when its turn is over).
   */
  disposeDescendants(req: DescendantsDisposeRequest, opts: CallOptions = {}): Promise<DrainReply> {
    return this.call(Endpoints.descendantsDispose, req, { timeoutMs: 60_000, ...opts });
  }

  /** children.list (§5.14). */
  children(req: ChildrenListRequest, opts?: CallOptions): Promise<ChildrenListReply> {
    return this.call(Endpoints.childrenList, req, opts);
  }

  /**
   * requests.open (§5.21): the calling agent (req.self, its own live
   * credential) asks for approval of its tool call; the record, pending.
   */
  openRequest(req: RequestOpenRequest, opts?: CallOptions): Promise<RequestRecord> {
    return this.call(Endpoints.requestsOpen, req, opts);
  }

  /**
   * budget.reserve (§5.22): the calling agent (req.self, its own live
   * credential) reserves a model request's tokens or a step's tool calls on
   * every budget it draws on; rejects with BudgetExhaustedError at the cap.
   */
  reserveBudget(req: BudgetReserveRequest, opts?: CallOptions): Promise<BudgetReserveReply> {
    return this.call(Endpoints.budgetReserve, req, opts);
  }

  /**
   * budget.get (§5.5): the ledgers a child draws on, root-most first, read by
   * its exact live parent or a user grant over its tree.
   */
  budget(childId: string, authority: Authority, opts?: CallOptions): Promise<BudgetGetReply> {
    return this.call(Endpoints.budgetGet, { childId, authority }, opts);
  }

  /**
   * budget.raise (§5.5 "Pause and raise"): raise a child's own budget by each
   * amount of raise; a turn paused at its cap continues. Authorised as a
   * followup; a parent raises at most to its own remainder (LimitExceededError).
   */
  raiseBudget(childId: string, authority: Authority, raise: BudgetSpend, opts?: CallOptions): Promise<BudgetRaiseReply> {
    return this.call(Endpoints.budgetRaise, { childId, authority, raise }, opts);
  }

  /** budget.settle (§5.22): charge what a reservation used and release the rest, once. */
  async settleBudget(req: BudgetSettleRequest, opts?: CallOptions): Promise<void> {
    await this.call(Endpoints.budgetSettle, req, opts);
  }

  /** requests.get (§5.21): a request, read by its session or one who may answer it. */
  getRequest(req: RequestGetRequest, opts?: CallOptions): Promise<RequestRecord> {
    return this.call(Endpoints.requestsGet, req, opts);
  }

  /**
   * requests.answer (§5.21): approve or deny a pending request, as the user
   * (a grant) or an ancestor of the asking session; the first answer wins,
   * a later one rejects with AlreadyAnsweredError. An ancestor agent may
   * pass it up instead (answer "pass_up"): the record comes back pending,
   * with its new handler and passedBy.
   */
  answerRequest(req: RequestAnswerRequest, opts?: CallOptions): Promise<RequestRecord> {
    return this.call(Endpoints.requestsAnswer, req, opts);
  }

  /**
   * requests.answer with the verb answer (§5.21): answer a pending question
   * with text (one of its choices, when it has some), or with json (JSON
   * text its answerSchema accepts, when it has one). A wrong answer rejects
   * with InvalidArgumentError and leaves the question pending.
   */
  answerQuestion(
    requestId: string,
    authority: Authority,
    answer: { text: string } | { json: string },
    opts?: CallOptions,
  ): Promise<RequestRecord> {
    return this.answerRequest({ requestId, authority, answer: "answer", ...answer }, opts);
  }

  /** requests.list (§5.21): the requests the authority may answer, pending unless req.all. */
  requests(req: RequestsListRequest, opts?: CallOptions): Promise<RequestsListReply> {
    return this.call(Endpoints.requestsList, req, opts);
  }

  /** sessions.result (§5.14a): a child's last finished turn of its own. */
  sessionResult(req: SessionResultRequest, opts?: CallOptions): Promise<SessionResultReply> {
    return this.call(Endpoints.sessionsResult, req, opts);
  }

  /** sessions.get (§5.17). */
  header(req: SessionGetRequest, opts?: CallOptions): Promise<SessionHeader> {
    return this.call(Endpoints.sessionsGet, req, opts);
  }

  /** sessions.log (§5.18): one page; with waitMs, a live tail. */
  logPage(req: LogReadRequest, opts: CallOptions = {}): Promise<LogPage> {
    return this.call(Endpoints.sessionsLog, req, this.waiting(req.waitMs, opts));
  }

  /** A session's header and every event from req.fromSeq to the end of its log now, page by page. */
  async log(req: LogReadRequest, opts?: CallOptions): Promise<{ header: SessionHeader; events: SessionEvent[] }> {
    const header = await this.header({ sessionId: req.sessionId, authority: req.authority }, opts);
    const events: SessionEvent[] = [];
    let page: LogReadRequest = { ...req, waitMs: undefined };
    for (;;) {
      const p = await this.logPage(page, opts);
      events.push(...p.events);
      if (p.complete) return { header, events };
      page = { ...page, fromSeq: p.nextSeq, cursor: p.cursor };
    }
  }

  /** events.read (§5.19): one page of past lifecycle events. */
  events(req: EventsReadRequest, opts?: CallOptions): Promise<EventsPage> {
    return this.call(Endpoints.eventsRead, req, opts);
  }

  /** events.follow (§5.19): lifecycle events as they happen (see Follow). */
  follow(req: EventsFollowRequest, opts?: CallOptions): Promise<Follow> {
    return Follow.open(this, req, opts);
  }

  /** inbox.read (§5.20): with waitMs, a long poll. */
  inbox(req: InboxReadRequest, opts: CallOptions = {}): Promise<InboxPage> {
    return this.call(Endpoints.inboxRead, req, this.waiting(req.waitMs, opts));
  }

  /** inbox.ack (§5.20): deletes items from a root's inbox. */
  ack(req: InboxAckRequest, opts?: CallOptions): Promise<InboxAckReply> {
    return this.call(Endpoints.inboxAck, req, opts);
  }

  /** Removes the notify subscription (the connection stays open). */
  close(): void {
    this.notifySub?.unsubscribe();
    this.notifySub = undefined;
  }
}

/**
 * Root is a root agent this client opened (agents.open). It stays live while
 * renewed (every leaseMs/3, in the background) and dies with close() or when
 * renewals stop. Its inbox receives the settlement notices and reports of
 * its continuable children.
 */
export class Root {
  readonly sessionId: string;
  readonly credential: string;
  readonly leaseMs: number;
  private readonly timer: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly client: Client,
    r: AgentsOpenReply,
  ) {
    this.sessionId = r.sessionId;
    this.credential = r.credential;
    this.leaseMs = r.leaseMs;
    this.timer = setInterval(() => {
      this.renew().catch(() => undefined);
    }, Math.max(r.leaseMs / 3, 100));
    this.timer.unref();
  }

  /** The root's authority as a parent. */
  ref(): ParentRef {
    return { sessionId: this.sessionId, credential: this.credential };
  }

  /** The root's credential as an Authority. */
  authority(): Authority {
    return { parent: this.ref() };
  }

  /** agents.renew (§5.3). */
  renew(opts?: CallOptions): Promise<AgentsRenewReply> {
    return this.client.call(Endpoints.agentsRenew, this.ref(), opts);
  }

  /** agents.close (§5.4): stops renewing; the credential dies, one-shot runs are disposed. */
  async close(opts?: CallOptions): Promise<void> {
    clearInterval(this.timer);
    if (this.closed) return;
    this.closed = true;
    await this.client.call(Endpoints.agentsClose, this.ref(), opts);
  }

  /** inbox.read of this root's inbox, with its own credential. */
  inbox(req: Partial<InboxReadRequest> = {}, opts?: CallOptions): Promise<InboxPage> {
    return this.client.inbox({ ...req, sessionId: this.sessionId, authority: req.authority ?? this.authority() }, opts);
  }

  /** inbox.ack of items of this root's inbox. */
  ack(seqs: string[], opts?: CallOptions): Promise<InboxAckReply> {
    return this.client.ack({ sessionId: this.sessionId, authority: this.authority(), seqs }, opts);
  }

  /**
   * Waits up to waitMs for the root's next inbox items (settlement notices,
   * reports), returns them and deletes them: read, then ack. An item is
   * returned at least once (one whose ack failed comes again).
   */
  async notices(waitMs: number, opts?: CallOptions): Promise<InboxItem[]> {
    const page = await this.inbox({ waitMs }, opts);
    const seqs = page.items.map((it) => it.inboxSeq).filter((s): s is string => typeof s === "string");
    for (let i = 0; i < seqs.length; i += Limits.inboxAckSeqsMax) {
      await this.ack(seqs.slice(i, i + Limits.inboxAckSeqsMax), opts);
    }
    return page.items;
  }
}

/**
 * The notices that arrived on a run's notify subject, at most
 * Notices.max (more are dropped: the run falls back to runs.await).
 */
class Notices {
  static readonly max = 4;
  private readonly items: RunNotice[] = [];
  private wake?: () => void;

  push(n: RunNotice): void {
    if (this.items.length >= Notices.max) return;
    this.items.push(n);
    this.wake?.();
  }

  /** The first notice naming runId; others are someone else's and dropped. */
  take(runId: string): RunNotice | undefined {
    while (this.items.length > 0) {
      const n = this.items.shift()!;
      if (n.runId === runId) return n;
    }
    return undefined;
  }

  /** Resolves when a notice arrives (or at once if one is waiting). */
  next(): Promise<void> {
    if (this.items.length > 0) return Promise.resolve();
    return new Promise((resolve) => {
      this.wake = () => {
        this.wake = undefined;
        resolve();
      };
    });
  }
}

/** Run is a started one-shot run (runs.start). */
export class Run {
  constructor(
    private readonly client: Client,
    readonly runId: string,
    readonly childId: string,
    private readonly parent: ParentRef,
    private readonly notices: Notices,
    private readonly forget: () => void,
    /**
     * "queued" when the start waits in its parent's start queue (§5.5,
     * "The start queue"): result() waits for it as for any run.
     */
    readonly state?: "queued",
  ) {}

  /**
   * The run's result: its notice, or runs.await when none came within the
   * client's awaitFallbackMs (asked again while the deployment is
   * UNAVAILABLE, for up to the client's outageMaxMs; then UnavailableError,
   * at once when the connection is closed).
   * A child that did not complete is a result with another stopReason, not
   * an error; an aborted signal is CANCELLED (the run goes on: dispose it).
   */
  async result(opts: CallOptions = {}): Promise<SubagentResult> {
    const down = new Outage(this.client);
    try {
      for (;;) {
        let timer: NodeJS.Timeout | undefined;
        const fallback = new Promise<undefined>((resolve) => {
          timer = setTimeout(() => resolve(undefined), this.client.awaitFallbackMs);
        });
        // Notices until the fallback fires: only one naming this run counts.
        for (;;) {
          const n = this.notices.take(this.runId);
          if (n) {
            clearTimeout(timer);
            return n.result;
          }
          const woke = await abortable(
            Promise.race([this.notices.next().then(() => true), fallback.then(() => false)]),
            opts.signal,
            `waiting for run ${this.runId}`,
          ).catch((err) => {
            clearTimeout(timer);
            throw err;
          });
          if (!woke) break;
        }
        try {
          const st = await this.client.await(
            { runId: this.runId, parent: this.parent, waitMs: this.client.awaitFallbackMs },
            { signal: opts.signal },
          );
          down.ok();
          if (st.state === "settled" && st.result) return st.result;
        } catch (err) {
          const gaveUp = down.failed(err, `waiting for run ${this.runId}`);
          if (gaveUp !== undefined) throw gaveUp;
          await new Promise((r) => setTimeout(r, 500));
        }
      }
    } finally {
      this.forget();
    }
  }

  /** runs.dispose (§5.7) of this run. */
  dispose(opts?: CallOptions): Promise<RunStatus> {
    return this.client.dispose({ runId: this.runId, parent: this.parent }, opts);
  }
}
