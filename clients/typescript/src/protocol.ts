// The wire shapes of the Brood coordinator API, written from docs/protocol.md
// (section numbers below are that document's). Every body is MessagePack;
// keys are camelCase exactly as here. A field marked `?` may be absent;
// decoders treat an absent field as its zero value and `null` as absent.

/** A JetStream stream sequence or KV revision: a decimal string (§1.5). */
export type Seq = string;

/** Epoch milliseconds, UTC (§1.5). */
export type Millis = number;

/**
 * Coordinator endpoints (§3), served on `<prefix>.v1.coord.<endpoint>` and on
 * each user's `<prefix>.v1.user.<user>.<endpoint>` (§1.1).
 */
export const Endpoints = {
  providersList: "providers.list",
  agentsOpen: "agents.open",
  agentsRenew: "agents.renew",
  agentsClose: "agents.close",
  runsStart: "runs.start",
  runsAwait: "runs.await",
  runsDispose: "runs.dispose",
  continuableStart: "continuable.start",
  continuableFollowup: "continuable.followup",
  continuableState: "continuable.state",
  continuableDrain: "continuable.drain",
  continuableDrains: "continuable.drains",
  continuableInterrupt: "continuable.interrupt",
  continuableReport: "continuable.report",
  childrenList: "children.list",
  descendantsDispose: "descendants.dispose",
  sessionsResult: "sessions.result",
  authorityUser: "authority.user",
  sessionsGet: "sessions.get",
  sessionsLog: "sessions.log",
  eventsRead: "events.read",
  eventsFollow: "events.follow",
  inboxRead: "inbox.read",
  inboxAck: "inbox.ack",
  requestsOpen: "requests.open",
  requestsGet: "requests.get",
  requestsAnswer: "requests.answer",
  requestsList: "requests.list",
  budgetReserve: "budget.reserve",
  budgetSettle: "budget.settle",
  budgetGet: "budget.get",
  budgetRaise: "budget.raise",
} as const;
export type Endpoint = (typeof Endpoints)[keyof typeof Endpoints];

/** Bounds of the read endpoints (§10). */
export const Limits = {
  readWaitMsMax: 60_000,
  runAwaitWaitMsMax: 60_000,
  inboxAckSeqsMax: 256,
  inboxPageItemsMax: 256,
  followCreditMsgsMax: 1024,
  followLeaseMs: 30_000,
} as const;

/** A block of content; the only type is text (§1.5). */
export interface ContentBlock {
  type: "text";
  text: string;
  /** Text the runtime added around the caller's words (a fork's note). */
  framing?: boolean;
}

/** `{sessionId, credential}`: "I am the current live agent of sessionId" (§4). */
export interface ParentRef {
  sessionId: string;
  credential: string;
}

/** A parent's credential or a user grant; a grant wins when both are given (§4). */
export interface Authority {
  parent?: ParentRef;
  grant?: string;
}

export interface ToolFilter {
  allow?: string[] | null;
  deny?: string[] | null;
}

export interface Capabilities {
  outputSchema: boolean;
  depthLimit: boolean;
  toolFilter: boolean;
  persona: boolean;
}

/** A provider descriptor (§9.1). */
export interface ProviderDescriptor {
  name: string;
  capabilities: Capabilities;
  inheritsParentContext: boolean;
  continuable: boolean;
  remote?: boolean;
  /** Names of the global tools its agents offer; `null` means none. */
  tools: string[] | null;
  /** The models its agents answer with, the default first (§9.1); absent: not stated. */
  models?: ModelInfo[];
  /** The turn limits its workers are set to (§9.1, §10); a start may only tighten them. */
  limits?: TurnLimits;
  /** Tools every session of the provider asks approval for before each call, sorted (§5.5, §9.1); absent: none. */
  approveTools?: string[];
}

/** §9.1: a model, by the adapter that speaks to it and its id there. */
export interface ModelInfo {
  adapter: string;
  id: string;
}

/**
 * §5.5 "Model and turn limits": each a positive integer, absent for none.
 * A start may ask for less than its parent's and its worker's, never more
 * (INVALID_ARGUMENT naming the limit).
 */
export interface TurnLimits {
  /** Milliseconds one turn may take (worker default 600 000). */
  turnTimeoutMs?: number;
  /** Model calls one turn may make (worker default 64). */
  stepsPerTurnMax?: number;
  /** Tool calls one model answer may ask for (worker default 32). */
  toolCallsPerStepMax?: number;
}

/** §5.1 */
export interface ProvidersListReply {
  providers: ProviderDescriptor[];
  instances: Record<string, number>;
}

/** §5.2 */
export interface RootLineage {
  parentSession: string;
  delegationDepth: number;
  depthCap?: number;
  toolCeiling?: ToolFilter;
}

/** §5.2 */
export interface AgentsOpenRequest {
  cwd?: string;
  label?: string;
  reopenable?: boolean;
  lineage?: RootLineage;
  sessionId?: string;
  grant?: string;
  /** Milliseconds each request of the new root's tree waits for an answer (1 to 86 400 000; §5.21); ignored on a reopen. */
  requestTimeoutMs?: number;
  /** A budget for the root's whole tree (§5.2, §5.5 "Budgets"). */
  budget?: Budget;
}

/** §5.2 */
export interface AgentsOpenReply {
  sessionId: string;
  credential: string;
  leaseMs: number;
  expiresAt: Millis;
}

/** §5.3 */
export interface AgentsRenewReply {
  expiresAt: Millis;
}

/** §5.5 */
export interface StartOptions {
  outputSchema?: unknown;
  maxDepth?: number;
  toolFilter?: ToolFilter;
  persona?: string;
  /** Tools needing approval (write_file, edit_file, run_command) the child runs without asking. */
  autoApprove?: string[];
  /** More tools the child and its whole tree ask approval for before each call; only grows down the tree (§5.5). */
  approveTools?: string[];
  /** One of the descriptor's models: "adapter/id", or an id one model has (§5.5). */
  model?: string;
  /** Lower turn limits for the child (§5.5). */
  limits?: TurnLimits;
  /**
   * Milliseconds each request (approval or question) of the child's tree waits for an answer before it
   * times out as a denial: 1 to 86 400 000 (24 h), at most its parent's; absent, its parent's, else the
   * coordinator's default (5 minutes) (§5.5, §5.21).
   */
  requestTimeoutMs?: number;
  /** A budget for the child and its subtree, at most what remains of its parent's (§5.5 "Budgets"). */
  budget?: Budget;
}

/** §5.5 */
export interface RunStartRequest {
  provider: string;
  parent: ParentRef;
  prompt: ContentBlock[];
  /** Set by the client (a subject under its own inbox prefix). */
  notify?: string;
  label?: string;
  options?: StartOptions;
}

/** §5.5 */
export interface RunStartReply {
  runId: string;
  childId: string;
  /**
   * "queued" when the parent was at its live-children limit and the start
   * waits in its start queue (§5.5, "The start queue"): the run starts once
   * a slot frees, oldest first, and its notice comes as for any run; absent
   * when the child was published.
   */
  state?: "queued";
}

export type StopReason = "completed" | "aborted" | "error" | "max-tokens" | "refusal" | (string & {});

/** §6.2 */
export interface SubagentResult {
  output: ContentBlock[];
  /** Present (non-null) only when an outputSchema was requested and satisfied. */
  structured?: unknown;
  stopReason: StopReason;
  diagnostic?: string;
  errorCode?: string;
  /** Which message `output` came from; absent when `output` is empty. */
  outputFrom?: OutputSource;
  /** What the run or epoch spent, its own and its subtree's (§6.6). */
  usage?: UsageSummary;
}

/**
 * §6.6: what a run, epoch or turn spent, folded from session logs (exact,
 * never estimated). `unreportedRequests` counts model requests whose tokens
 * are unknown: while it is not 0 the token sums are a lower bound.
 */
export interface RunUsage {
  inputTokens: number;
  outputTokens: number;
  modelRequests: number;
  unreportedRequests?: number;
  toolCalls: number;
  /** agent time, ms: each turn's end less its start; a subtree's sums its runs */
  wallMs: number;
}

/** §6.6: own (the child's own log) and subtree (own plus every delegation that ended into it, once each). */
export interface UsageSummary {
  own: RunUsage;
  subtree: RunUsage;
}

/** §6.2: where a result's output came from in the child's log. */
export interface OutputSource {
  seq: number;
  turn: number;
  step: number;
  /** False when the child's last assistant message was empty and `output` is an earlier one. */
  last: boolean;
}

/** §6.1 */
export interface RunNotice {
  runId: string;
  childId: string;
  parentSession: string;
  provider: string;
  result: SubagentResult;
}

/** §5.6, §5.7 */
export interface RunRef {
  runId: string;
  parent?: ParentRef;
  grant?: string;
  waitMs?: number;
}

/** §5.6 */
export interface RunStatus {
  runId: string;
  childId: string;
  /** "queued" while its start waits in its parent's start queue (§5.5). */
  state: "queued" | "running" | "settled";
  result?: SubagentResult;
}

/** §5.8 */
export interface ContinuableOptions {
  maxDepth?: number;
  toolFilter?: ToolFilter;
  persona?: string;
  /** As in StartOptions. */
  autoApprove?: string[];
  /** As in StartOptions. */
  approveTools?: string[];
  /** As in StartOptions (§5.5). */
  model?: string;
  /** As in StartOptions (§5.5). */
  limits?: TurnLimits;
  /** As in StartOptions (§5.5, §5.21). */
  requestTimeoutMs?: number;
  /** As in StartOptions (§5.5 "Budgets"). */
  budget?: Budget;
}

/** §5.8 */
export interface ContinuableStartRequest {
  provider: string;
  parent: ParentRef;
  label: string;
  childId?: string;
  prompt: ContentBlock[];
  options?: ContinuableOptions;
}

/** §5.8 */
export interface ContinuableStartReply {
  childId: string;
  /** The prompt's id in the child's inbox (while queued: the id it will have once the child starts). */
  messageId: string;
  /**
   * "queued" when the parent was at its live-children limit and the start
   * waits in its start queue (§5.5, "The start queue"): the child has no
   * session until it starts (continuable.state says queued; a followup is
   * refused UNAVAILABLE); absent when the child was started.
   */
  state?: "queued";
}

/** §8.6 */
export interface MessageSource {
  kind: "user" | "coordinator" | "subagent-report" | "subagent-settled" | "subagent-request" | (string & {});
  form?: string;
  senderSessionId?: string;
  summary?: string;
  /** subagent-settled notices: the settled epoch's usage (§6.6) */
  usage?: UsageSummary;
}

/** §5.9 */
export interface FollowupRequest {
  childId: string;
  authority: Authority;
  message: ContentBlock[];
  source?: MessageSource;
  idempotencyKey?: string;
}

/** §5.9 */
export interface FollowupReply {
  messageId: string;
  /** Why the accepted message waits instead of running now (a drain). */
  held?: string;
}

/** §5.10 */
export interface ChildRef {
  childId: string;
  authority: Authority;
}

/**
 * §8.3 `model/retry`: attempt `attempt` of step `step`'s model request failed
 * temporarily (`status` 429 or 5xx; absent for a connection reset or an
 * attempt's timeout) and the turn pauses until `nextAt` (epoch ms), `waitMs`
 * after the failure; `retryAfterMs` is the endpoint's Retry-After.
 */
export interface ModelRetryData {
  turn: number;
  step: number;
  attempt: number;
  status?: number;
  retryAfterMs?: number;
  waitMs: number;
  nextAt: number;
  diagnostic: string;
}

/** §5.10 */
export interface StateReply {
  childId: string;
  /**
   * paused: the turn waits at its budget's cap for a raise (§5.5 "Pause and raise"; budgetPause).
   * queued: the child's start waits in its parent's start queue (§5.5, "The start queue").
   */
  state: "running" | "paused" | "waiting" | "settled" | "none" | "queued";
  hostId?: string;
  runId?: string;
  queued?: number;
  /** With state running: the running turn waits to retry a model request that failed temporarily. */
  modelRetry?: ModelRetryData;
  /** With state paused: the budget request the turn waits on (its request/open data). */
  budgetPause?: RequestOpenData;
}

/** §5.11 */
export interface InterruptRequest {
  childId: string;
  authority: Authority;
}

/** §5.11 */
export interface InterruptReply {
  childId: string;
  interrupted: boolean;
}

/** §5.12 */
export interface ReportRequest {
  child: ParentRef;
  content: ContentBlock[];
}

/** §5.13 */
export interface DrainRequest {
  authority: Authority;
  parents?: string[];
  parent?: string;
  children?: string[];
  lift?: boolean;
}

/** §5.13 */
export interface DrainReply {
  disposed: string[];
  failed?: string[];
}

/** §5.13b `descendants.dispose`: the calling agent's own ref. */
export interface DescendantsDisposeRequest {
  agent: ParentRef;
}

/** §5.13 `continuable.drains` */
export interface DrainsListRequest {
  authority: Authority;
}

export interface DrainMarker {
  root?: string;
  createdAt?: Millis;
  holds: string;
  active: boolean;
}

export interface DrainsListReply {
  drains: DrainMarker[];
}

/** §5.21: who answered a request. */
export interface Answerer {
  /** "ended": the asking turn ended before an answer (state "cancelled"). */
  kind: "user" | "agent" | "timeout" | "ended";
  sessionId?: string;
  user?: string;
}

/** §5.21 */
export interface RequestAnswer {
  state: "approved" | "denied" | "answered" | "timed-out" | "cancelled";
  reason?: string;
  /** A question's answer: text, or JSON text (canonical). */
  text?: string;
  json?: string;
  by: Answerer;
  at: Millis;
  /** A fresh id of this answer (ULID): two answers never write equal records. */
  id?: string;
}

/** §5.21: a question's bounds (INVALID_ARGUMENT past them). */
export const QuestionLimits = {
  questionBytesMax: 16 * 1024,
  choicesMax: 32,
  choiceBytesMax: 1024,
  answerSchemaBytesMax: 64 * 1024,
  answerBytesMax: 64 * 1024,
} as const;

/**
 * §5.21: a request for approval of a child's tool call (kind approval),
 * or a child's question from its ask tool (kind question).
 */
export interface RequestRecord {
  version: number;
  id: string;
  sessionId: string;
  /** budget: a continuable child paused at its budget's cap, answered by a raise (§5.5 "Pause and raise"). */
  kind: "approval" | "question" | "budget";
  callId: string;
  turn: number;
  step: number;
  tool?: string;
  /** A budget pause's: the session whose ledger refused, and the BUDGET_EXHAUSTED message. */
  budgetOf?: string;
  exhausted?: string;
  /** The call's arguments, raw JSON text. */
  arguments?: string;
  /** A question's text. */
  question?: string;
  /** A question's choices: its answer is one of them, as text. */
  choices?: string[];
  /** A question's answerSchema (canonical JSON Schema text): its answer is JSON it accepts. */
  answerSchema?: string;
  /** "cancelled": its asking turn ended before an answer came (its run settled, its turn was closed); no answer is taken. */
  state: "pending" | "approved" | "denied" | "answered" | "timed-out" | "cancelled";
  createdAt: Millis;
  deadline: Millis;
  answer?: RequestAnswer;
  /** The ancestor agent told of it, the one it waits on; absent: the user (§5.21 "Who is told"). */
  handler?: string;
  /** The ancestor agents that passed it up (pass_up), in order. */
  passedBy?: string[];
}

/** §8.3 request/open: the turn parked on request requestId (a budget pause: kind budget, before step's model request). */
export interface RequestOpenData {
  requestId: string;
  kind: "approval" | "question" | "budget";
  turn: number;
  step: number;
  callId: string;
  tool?: string;
  deadline: Millis;
}

/** §5.21 */
export interface RequestOpenRequest {
  self: ParentRef;
  kind: "approval" | "question" | "budget";
  /** A budget pause's (kind budget). */
  budgetOf?: string;
  exhausted?: string;
  /**
   * A budget pause's: the raise count of budgetOf's ledger its refusal saw
   * (BUDGET_EXHAUSTED's detail `raises`); a ledger raised since answers the
   * request approved as it opens (§5.5 "Pause and raise").
   */
  budgetRaises?: number;
  callId: string;
  turn: number;
  step: number;
  /** An approval's call. */
  tool?: string;
  arguments?: string;
  /** A question's text, and its choices or answerSchema (JSON Schema text). */
  question?: string;
  choices?: string[];
  answerSchema?: string;
}

/** §5.21 */
export interface RequestGetRequest {
  requestId: string;
  self?: ParentRef;
  authority?: Authority;
}

/** §5.21 */
export interface RequestAnswerRequest {
  requestId: string;
  authority: Authority;
  /**
   * approve or deny an approval; answer a question (with text or json); or, an ancestor agent only
   * (authority.parent), pass_up: leave it undecided to the next ancestor above that takes requests,
   * or the user (the record stays pending, with its new handler and passedBy).
   */
  answer: "approve" | "deny" | "answer" | "pass_up";
  /** deny only */
  reason?: string;
  /** answer only: text (one of the choices, when there are some) or json (JSON text its answerSchema accepts). */
  text?: string;
  json?: string;
}

/** §5.21 */
export interface RequestsListRequest {
  authority: Authority;
  under?: string;
  all?: boolean;
}

/** §5.21 */
export interface RequestsListReply {
  requests: RequestRecord[];
  more?: boolean;
}

/** §5.14 */
export interface ChildrenListRequest {
  parent?: string;
  authority: Authority;
  descendants?: boolean;
}

/** §5.14 */
export interface ChildRow {
  kind: "child" | "diagnostic";
  id: string;
  activity?: "running" | "inactive";
  /** running or none; "queued" for a one-shot start waiting in the parent's start queue (§5.5). */
  state?: string;
  hasChildren?: boolean;
  mode?: "one-shot" | "continuable";
  label?: string;
  provider?: string;
  reason?: string;
  parentId?: string;
  depth?: number;
  createdAt?: Millis;
  /** child rows: what the child spent over its whole log so far (§6.6) */
  usage?: UsageSummary;
}

/** §5.14 */
export interface ChildrenListReply {
  rows: ChildRow[];
}

/** §5.15 */
export interface UserGrantReply {
  grant: string;
  expiresAt: Millis;
  /** The grant's scope: the trees of the roots this NATS user opened; absent: every session. */
  user?: string;
}

/** §8.1 */
export interface SessionHeader {
  version: number;
  id: string;
  createdAt: Millis;
  cwd?: string;
  parentSession?: string;
  seedLength?: number;
  origin?: string;
  delegationDepth?: number;
  toolCeiling?: ToolFilter;
  depthCap?: number;
  /** Roots only: the NATS user that opened it (§8.1). */
  user?: string;
  /** Children only: the provider it was started on; the scope of its log subject (§7.3, §8.1). */
  provider?: string;
  /** Tools needing approval this session runs without asking (§5.5 autoApprove). */
  autoApprove?: string[];
  /** Further tools this session asks approval for before each call (§5.5 approveTools); never in autoApprove. */
  approveTools?: string[];
  /** Children only: the model chosen for it, by its start or its parent's choice (§5.5, §8.1). */
  model?: ModelInfo;
  /** Children only: its effective turn limits, at most its parent's (§5.5, §8.1). */
  limits?: TurnLimits;
  /** How long each of its requests waits for an answer, in milliseconds; absent, the coordinator's default (§5.21). */
  requestTimeoutMs?: number;
  /** The ledgers of the budgets it draws on, root-most first (§5.5 "Budgets", §8.1). */
  budgets?: string[];
  /** The earliest deadline of those budgets, epoch ms (§8.1). */
  budgetDeadlineAt?: Millis;
  /** Tokens of the first model request's reservation the coordinator took at admission (§5.5 "Budgets", §8.1). */
  budgetStartTokens?: number;
}

/** §8.2: one log entry; `data` is the type's data map (§8.3). */
export interface SessionEvent {
  seq: number;
  type: string;
  time: Millis;
  data: Record<string, unknown>;
}

/** §5.17 */
export interface SessionGetRequest {
  sessionId: string;
  authority: Authority;
}

/** §5.18 */
export interface LogReadRequest {
  sessionId: string;
  authority: Authority;
  fromSeq?: number;
  cursor?: Seq;
  eventsMax?: number;
  waitMs?: number;
}

/** §5.18 */
export interface LogPage {
  events: SessionEvent[];
  nextSeq: number;
  cursor: Seq;
  complete: boolean;
}

/** §7.5: a lifecycle event; `seq` is set when read through the coordinator. */
export interface LifecycleEvent {
  type: "subagent/start" | "subagent/end";
  runId: string;
  provider: string;
  id: string;
  parentSession: string;
  local: boolean;
  mode: "one-shot" | "continuable";
  time: Millis;
  stopReason?: StopReason;
  lastAssistantMessage?: ContentBlock[];
  errorCode?: string;
  /** start events: the child's label (its descriptor's), when its host knew it */
  label?: string;
  /** end events: the run's or epoch's usage (§6.6) */
  usage?: UsageSummary;
  /**
   * end events of a one-shot run or a continuable child's epoch: how many times its host was lost and the
   * session taken over (§8.4, "Continued after a host loss"); absent when none
   */
  takeovers?: number;
  seq?: Seq;
}

/** §5.19 */
export interface EventsReadRequest {
  parent?: string;
  descendants?: boolean;
  authority: Authority;
  afterSeq?: Seq;
  eventsMax?: number;
}

/** §5.19 */
export interface EventsPage {
  events: LifecycleEvent[];
  cursor: Seq;
  complete: boolean;
}

/** §5.19 */
export interface EventsFollowRequest {
  parent?: string;
  descendants?: boolean;
  authority: Authority;
  /** Resume after this sequence (past events first); absent: new events only. */
  afterSeq?: Seq;
  creditMsgs?: number;
  heartbeatMs?: number;
}

/** §5.19: the first message on a follow's reply subject. */
export interface EventsFollowReply {
  followId: string;
  seq: Seq;
  creditSubject: string;
  creditMsgs: number;
  heartbeatMs: number;
  leaseMs: number;
}

/** §5.19: every later message of a follow. */
export interface FollowMessage {
  kind: "event" | "heartbeat" | "end";
  seq: Seq;
  event?: LifecycleEvent;
  error?: ErrorBody;
}

/** §5.19 */
export interface FollowCreditRequest {
  followId: string;
  creditMsgs: number;
  stop?: boolean;
}

/** §5.19 */
export interface FollowCreditReply {
  creditMsgs: number;
}

/** §7.4: a pending inbox item; `inboxSeq` is set when read. */
export interface InboxItem {
  messageId: string;
  content: ContentBlock[];
  source: MessageSource;
  delivery: "next-turn" | "next-step" | "quiet" | (string & {});
  inboxSeq?: Seq;
}

/** §5.20 */
export interface InboxReadRequest {
  sessionId: string;
  authority: Authority;
  afterSeq?: Seq;
  itemsMax?: number;
  waitMs?: number;
}

/** §5.20 */
export interface InboxPage {
  items: InboxItem[];
  more: boolean;
}

/** §5.20 */
export interface InboxAckRequest {
  sessionId: string;
  authority: Authority;
  seqs: Seq[];
}

/** §5.20 */
export interface InboxAckReply {
  removed: number;
}

/** §2.1: the body of an error reply. */
export interface ErrorBody {
  code: string;
  message: string;
  details?: Record<string, unknown>;
}

/** A list of one text block. */
export function text(s: string): ContentBlock[] {
  return [{ type: "text", text: s }];
}

/** The caller's text of blocks (framing left out), joined by newlines. */
export function plainText(blocks: ContentBlock[] | null | undefined): string {
  return (blocks ?? [])
    .filter((b) => b.type === "text" && !b.framing)
    .map((b) => b.text)
    .join("\n");
}

/** §5.14a `sessions.result` */
export interface SessionResultRequest {
  sessionId: string;
  authority: Authority;
}

/**
 * §5.14a: the child's last finished turn of its own (after any fork seed);
 * finished false when none ended yet. output follows the output selection
 * rule within that turn; diagnostic is the turn's error, or "cause <cause>"
 * for an aborted turn.
 */
export interface SessionResultReply {
  sessionId: string;
  mode?: string;
  finished: boolean;
  turn?: number;
  stopReason?: StopReason;
  output: ContentBlock[];
  structured?: unknown;
  diagnostic?: string;
  endedAt?: Millis;
  /** present when finished: what the turn spent (§6.6) */
  usage?: UsageSummary;
}

/**
 * §5.5 "Budgets": caps on what a session and its whole subtree spend. Each
 * field is a positive whole number (deadlineMs: milliseconds from the
 * start, at most 30 days); absent fields are no limit; at least one is set.
 */
export interface Budget {
  tokens?: number;
  modelRequests?: number;
  toolCalls?: number;
  children?: number;
  deadlineMs?: number;
}

/** §5.22: what is spent or reserved against a budget. */
export interface BudgetSpend {
  tokens?: number;
  modelRequests?: number;
  toolCalls?: number;
  children?: number;
}

/** §5.22 budget.reserve */
export interface BudgetReserveRequest {
  self: ParentRef;
  want: BudgetSpend;
  tokensMin?: number;
  noWait?: boolean;
}

/** §5.22 */
export interface BudgetReserveReply {
  /** Absent when the session draws on no budget. */
  reservationId?: string;
  granted: BudgetSpend;
  /** Nothing reserved: ask again after this many ms (tokens held by reservations in flight). */
  retryMs?: number;
}

/** §5.5 "Budgets", §7.6: one budget's ledger. */
export interface BudgetRecord {
  sessionId: string;
  limits: Budget;
  deadlineAt?: Millis;
  charged: BudgetSpend;
  /**
   * In flight. In budget.get's and budget.raise's replies only the asked-about
   * session's own, without credentialHash; reservedOthers totals the rest.
   */
  reservations?: { id: string; sessionId: string; runId?: string; hostId?: string; credentialHash?: string; spend: BudgetSpend; at: Millis }[];
  /** budget.get and budget.raise only: what the reservations not shown hold, in total. */
  reservedOthers?: BudgetSpend;
  createdAt: Millis;
  writeId?: string;
  /** How many raises the ledger had (budget.raise), and who gave the last. */
  raises?: number;
  raisedBy?: Answerer;
}

/** §5.5 budget.get: by the child's exact live parent or a user grant. */
export interface BudgetGetRequest {
  childId: string;
  authority: Authority;
}

/**
 * §5.5: the ledgers the child draws on, root-most first; own: the last is its own.
 * queued: its start waits in its parent's start queue: the ledgers it will draw on
 * (its own, when its start named one, not created yet: its limits, nothing charged).
 */
export interface BudgetGetReply {
  childId: string;
  budgets: BudgetRecord[];
  own?: boolean;
  queued?: boolean;
}

/**
 * §5.5 "Pause and raise" budget.raise: raise the child's own budget by each
 * amount named (authorised as a followup; a parent at most to its own remainder).
 */
export interface BudgetRaiseRequest {
  childId: string;
  authority: Authority;
  raise: BudgetSpend;
}

/** §5.5: the ledger as raised, and the budget requests answered (the paused turns it wakes). */
export interface BudgetRaiseReply {
  budget: BudgetRecord;
  resumed: string[];
}

/** §5.22 budget.settle */
export interface BudgetSettleRequest {
  self: ParentRef;
  reservationId: string;
  used: BudgetSpend;
}
