// events.follow (docs/protocol.md §5.19): lifecycle events streamed to a
// subject under this client's inbox prefix, with credit flow control, kept
// alive and resumed after the last sequence seen.

import { type Msg, type Subscription } from "@nats-io/transport-node";

import { abortable, cancelled, decodeBody, encodeBody, errorOf, Outage, transportError, type CallOptions, type Client } from "./client.js";
import { fromBody, UnavailableError } from "./errors.js";
import {
  Endpoints,
  type EventsFollowReply,
  type EventsFollowRequest,
  type FollowCreditReply,
  type FollowMessage,
  type LifecycleEvent,
  type Seq,
} from "./protocol.js";

/** Heartbeat intervals without any message after which a follow is resumed. */
export const FollowSilenceBeats = 3;
/** Pause between attempts to resume a follow. */
export const FollowRetryWaitMs = 500;

function seqMax(a: Seq, b: Seq): Seq {
  return BigInt(a) >= BigInt(b) ? a : b;
}

/**
 * Follow is a live stream of lifecycle events. The coordinator sends at most
 * the credit this client granted ahead of what it consumed; next() grants it
 * back as events are consumed, keeps the follow alive while idle, and
 * resumes it after the last sequence seen when it falls silent, ends
 * UNAVAILABLE or loses its coordinator: no event is skipped or repeated.
 * Use it as an async iterator, or call next(). Not for concurrent use.
 */
export class Follow implements AsyncIterable<LifecycleEvent> {
  private sub?: Subscription;
  private queue: Msg[] = [];
  private wake?: () => void;
  private info!: EventsFollowReply;
  private unacked = 0;
  private lastGrant = 0;
  private lastMsg = 0;
  /** The last stream sequence seen (events and heartbeats). */
  cursor: Seq = "0";

  private constructor(
    private readonly client: Client,
    private req: EventsFollowRequest,
  ) {}

  static async open(client: Client, req: EventsFollowRequest, opts: CallOptions = {}): Promise<Follow> {
    const f = new Follow(client, req);
    await f.openSub(opts);
    return f;
  }

  private async openSub(opts: CallOptions): Promise<void> {
    const nc = this.client.nc;
    const deliver = this.client.ownInbox("follow");
    this.queue = [];
    const sub = nc.subscribe(deliver, {
      callback: (err, m) => {
        if (err) return;
        this.queue.push(m);
        this.wake?.();
      },
    });
    const subject = this.client.subject(Endpoints.eventsFollow);
    try {
      nc.publish(subject, encodeBody(this.req), { reply: deliver });
      const first = await this.take(opts.timeoutMs ?? this.client.timeoutMs, opts.signal);
      if (!first) throw transportError(subject, new Error("no reply in time"));
      // A plain publish with a reply subject that nobody serves gets the
      // server's no-responders status (503, no body) on that subject.
      if (first.data.length === 0 && first.headers?.code === 503) {
        throw new UnavailableError("UNAVAILABLE", `nobody serves ${subject}`);
      }
      const perr = errorOf(first);
      if (perr) throw perr;
      this.info = decodeBody<EventsFollowReply>(first.data);
    } catch (err) {
      sub.unsubscribe();
      throw err;
    }
    this.sub = sub;
    this.cursor = this.info.seq;
    this.unacked = 0;
    this.lastGrant = this.lastMsg = Date.now();
  }

  /** The next queued message, waiting up to ms; undefined when none came. */
  private take(ms: number, signal?: AbortSignal): Promise<Msg | undefined> {
    const m = this.queue.shift();
    if (m) return Promise.resolve(m);
    return abortable(
      new Promise<Msg | undefined>((resolve) => {
        const timer = setTimeout(() => {
          this.wake = undefined;
          resolve(undefined);
        }, ms);
        this.wake = () => {
          clearTimeout(timer);
          this.wake = undefined;
          resolve(this.queue.shift());
        };
      }),
      signal,
      "following events",
    );
  }

  /** The next event, waiting as long as signal allows. */
  async next(signal?: AbortSignal): Promise<LifecycleEvent> {
    for (;;) {
      if (!this.sub) await this.resume(signal);
      const hb = this.info.heartbeatMs;
      const now = Date.now();
      const grantDue = this.lastGrant + this.info.leaseMs / 3 - now;
      const silent = this.lastMsg + FollowSilenceBeats * hb - now;
      const m = await this.take(Math.max(Math.min(grantDue, silent), 0), signal);
      if (!m) {
        if (Date.now() - this.lastMsg >= FollowSilenceBeats * hb) this.drop();
        else await this.grant(false, signal);
        continue;
      }
      this.lastMsg = Date.now();
      const ev = await this.handle(m, signal);
      if (ev) return ev;
    }
  }

  private async handle(m: Msg, signal?: AbortSignal): Promise<LifecycleEvent | undefined> {
    let fm: FollowMessage;
    try {
      fm = decodeBody<FollowMessage>(m.data);
    } catch {
      return undefined;
    }
    switch (fm.kind) {
      case "event":
        if (!fm.event || BigInt(fm.seq) <= BigInt(this.cursor)) return undefined;
        this.cursor = fm.seq;
        this.unacked++;
        if (this.unacked >= Math.max(Math.floor(this.info.creditMsgs / 2), 1)) await this.grant(false, signal);
        return { ...fm.event, seq: fm.seq };
      case "heartbeat":
        this.cursor = seqMax(this.cursor, fm.seq);
        return undefined;
      case "end":
        this.cursor = seqMax(this.cursor, fm.seq);
        this.drop();
        if (fm.error && fm.error.code !== "UNAVAILABLE") throw fromBody(fm.error);
        return undefined;
      default:
        return undefined;
    }
  }

  /** Grants the consumed credit back (and keeps the follow alive). */
  private async grant(stop: boolean, signal?: AbortSignal): Promise<void> {
    if (!this.sub) return;
    try {
      await this.client.callSubject<FollowCreditReply>(
        this.info.creditSubject,
        { followId: this.info.followId, creditMsgs: this.unacked, stop: stop || undefined },
        { signal, timeoutMs: stop ? 1000 : undefined },
      );
      this.unacked = 0;
      this.lastGrant = Date.now();
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (!stop && (code === "NOT_FOUND" || code === "UNAVAILABLE")) this.drop();
      else if (code === "CANCELLED") throw err;
    }
  }

  private drop(): void {
    this.sub?.unsubscribe();
    this.sub = undefined;
  }

  /**
   * Opens a new follow after the cursor, retrying while UNAVAILABLE for up to
   * the client's outageMaxMs: then (or at once when the connection is
   * closed) the follow is stale and says so with UnavailableError.
   */
  private async resume(signal?: AbortSignal): Promise<void> {
    this.req = { ...this.req, afterSeq: this.cursor };
    const down = new Outage(this.client);
    for (;;) {
      try {
        await this.openSub({ signal });
        return;
      } catch (err) {
        const gaveUp = down.failed(err, `resuming the follow after event ${this.cursor}`);
        if (gaveUp !== undefined) throw gaveUp;
      }
      if (signal?.aborted) throw cancelled("resuming the follow", signal);
      await new Promise((r) => setTimeout(r, FollowRetryWaitMs));
    }
  }

  /** Ends the follow (telling the coordinator when it can, within a second). */
  async close(): Promise<void> {
    if (!this.sub) return;
    await this.grant(true);
    this.drop();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<LifecycleEvent> {
    try {
      for (;;) yield await this.next();
    } finally {
      await this.close();
    }
  }
}

