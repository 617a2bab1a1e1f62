// Every verb of the TypeScript client against a fresh `brood dev`.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";

import {
  AlreadyAnsweredError,
  BroodError,
  Catalogue,
  CancelledError,
  ErrorClasses,
  InvalidArgumentError,
  isRetryable,
  LimitExceededError,
  NoProviderError,
  Retryable,
  NotFoundError,
  UnauthorizedError,
  UnavailableError,
  Client,
  encodeBody,
  plainText,
  text,
  type LifecycleEvent,
  type RequestRecord,
} from "../src/index.js";
import { connect } from "@nats-io/transport-node";

import { eventually, repoRoot, startDev, type Dev } from "./dev.js";

let dev: Dev;
let brood: Client;

before(async () => {
  dev = await startDev();
  brood = dev.client;
});

after(async () => {
  await dev?.stop();
});

const cwd = repoRoot;

describe("roots", () => {
  test("open, renew and close; a closed root's credential is dead", async () => {
    const root = await brood.openRoot({ cwd });
    assert.match(root.sessionId, /^[0-9A-Z]{26}$/);
    assert.equal(root.leaseMs, 30_000);
    const renewed = await root.renew();
    assert.ok(renewed.expiresAt > Date.now());
    await root.close();
    await assert.rejects(root.renew(), UnauthorizedError);
  });

  test("a relative cwd is INVALID_ARGUMENT", async () => {
    await assert.rejects(brood.openRoot({ cwd: "relative/dir" }), (err: unknown) => {
      assert.ok(err instanceof InvalidArgumentError);
      assert.equal(err.code, "INVALID_ARGUMENT");
      assert.equal(err.number, 1001);
      return true;
    });
  });
});

describe("one-shot runs", () => {
  test("run and await the result; await and dispose answer the settled status", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("say hello"), label: "greet" });
      assert.equal(run.runId, run.childId);
      const res = await run.result();
      assert.equal(res.stopReason, "completed");
      assert.equal(plainText(res.output), "hello");
      // The scripted model counts one token per word (§6.6): one request, "hello" out.
      assert.equal(res.usage?.own.modelRequests, 1);
      assert.equal(res.usage?.own.outputTokens, 1);
      assert.ok((res.usage?.own.inputTokens ?? 0) >= 2);
      assert.deepEqual(res.usage?.subtree, res.usage?.own);
      const st = await brood.await({ runId: run.runId, parent: root.ref(), waitMs: 5_000 });
      assert.equal(st.state, "settled");
      assert.equal(st.result?.stopReason, "completed");
      const disposed = await run.dispose();
      assert.equal(disposed.state, "settled");
    } finally {
      await root.close();
    }
  });

  test("structured output", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const schema = { type: "object", properties: { answer: { type: "integer" } }, required: ["answer"] };
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text('json {"answer":42}'), options: { outputSchema: schema } });
      const res = await run.result();
      assert.equal(res.stopReason, "completed");
      assert.deepEqual(res.structured, { answer: 42 });
    } finally {
      await root.close();
    }
  });

  test("model and turn limits: a start chooses a model the provider offers and may only lower its limits", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const spawn = (await brood.providers()).providers.find((p) => p.name === "spawn");
      assert.deepEqual(spawn?.models, [{ adapter: "scripted", id: "scripted" }]);
      assert.deepEqual(spawn?.limits, { turnTimeoutMs: 600_000, stepsPerTurnMax: 64, toolCallsPerStepMax: 32 });
      const chosen = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("say hi"), options: { model: "scripted" } });
      assert.equal((await chosen.result()).stopReason, "completed");
      await assert.rejects(
        brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("say hi"), options: { model: "huge" } }),
        InvalidArgumentError,
      );
      await assert.rejects(
        brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("say hi"), options: { limits: { stepsPerTurnMax: 65 } } }),
        (err: unknown) => err instanceof InvalidArgumentError && err.details?.limit === "stepsPerTurnMax",
      );
      const run = await brood.startRun({
        provider: "spawn", parent: root.ref(), prompt: text("call list_dir {}\nsleep 0s\ncall list_dir {}\nsay done"),
        options: { limits: { stepsPerTurnMax: 2 } },
      });
      const res = await run.result();
      assert.equal(res.stopReason, "error");
      assert.equal(res.errorCode, "LIMIT_EXCEEDED");
    } finally {
      await root.close();
    }
  });

  test("dispose a running child: it settles aborted", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("sleep 60s\nsay never") });
      const st = await run.dispose();
      assert.equal(st.state, "settled");
      assert.equal(st.result?.stopReason, "aborted");
      const res = await run.result();
      assert.equal(res.stopReason, "aborted");
    } finally {
      await root.close();
    }
  });

  test("errors are typed with the catalogue's codes", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      await assert.rejects(brood.startRun({ provider: "nope", parent: root.ref(), prompt: text("x") }), (err: unknown) => {
        assert.ok(err instanceof NoProviderError && err instanceof BroodError);
        assert.equal(err.code, "NO_PROVIDER");
        assert.equal(err.number, 1002);
        assert.equal(err.details["provider"], "nope");
        return true;
      });
      const forged = { ...root.ref(), credential: "forged" };
      await assert.rejects(brood.startRun({ provider: "spawn", parent: forged, prompt: text("x") }), UnauthorizedError);
      // Authority before existence: a parent learns nothing of run ids not its own.
      await assert.rejects(brood.await({ runId: "NOSUCHRUN", parent: root.ref() }), UnauthorizedError);
      await assert.rejects(brood.call("no.such.endpoint", {}), NotFoundError);
    } finally {
      await root.close();
    }
  });

  test("a notice that names another run is not the run's result", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("sleep 1s\nsay real") });
      // Someone publishes a forged notice on the run's notify subject.
      const internals = brood as unknown as { notifyPrefix: string; waiters: Map<string, unknown> };
      const tokens = [...internals.waiters.keys()];
      const subject = `${internals.notifyPrefix}.${tokens[tokens.length - 1]}`;
      const forged = { runId: "FORGED", childId: run.childId, parentSession: root.sessionId, provider: "spawn", result: { output: text("forged"), stopReason: "completed" } };
      dev.nc.publish(subject, encodeBody(forged));
      const res = await run.result();
      assert.equal(plainText(res.output), "real");
    } finally {
      await root.close();
    }
  });

  test("a user calls on its own subjects", () => {
    const alice = new Client(dev.nc, { user: "alice" });
    assert.equal(alice.subject("runs.start"), "brood.v1.user.alice.runs.start");
    assert.equal(brood.subject("runs.start"), "brood.v1.coord.runs.start");
    assert.throws(() => new Client(dev.nc, { user: "a.b" }), InvalidArgumentError);
  });

  test("a cancelled wait is CANCELLED; a dead server is UNAVAILABLE with a cause", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("sleep 60s\nsay never") });
      const ac = new AbortController();
      setTimeout(() => ac.abort(new Error("enough")), 100);
      await assert.rejects(run.result({ signal: ac.signal }), CancelledError);
      await run.dispose();
      await assert.rejects(brood.callSubject("brood.v1.nobody.here", {}), (err: unknown) => {
        assert.ok(err instanceof UnavailableError);
        assert.ok(err.cause instanceof Error);
        return true;
      });
    } finally {
      await root.close();
    }
  });
});

describe("continuable children", () => {
  test("start, state, followup, interrupt, children, drain", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const start = await brood.startContinuable({ provider: "spawn", parent: root.ref(), label: "helper", prompt: text("say ready") });
      assert.match(start.messageId, /^[0-9A-Z]{26}$/);
      const auth = root.authority();
      await eventually("the child settles", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "none");
      const f = await brood.followup({ childId: start.childId, authority: auth, message: text("sleep 60s\nsay late"), idempotencyKey: "k1" });
      const again = await brood.followup({ childId: start.childId, authority: auth, message: text("sleep 60s\nsay late"), idempotencyKey: "k1" });
      assert.equal(again.messageId, f.messageId);
      await eventually("the child runs the followup", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "running");
      const ir = await brood.interrupt({ childId: start.childId, authority: auth });
      assert.equal(ir.interrupted, true);
      const list = await brood.children({ parent: root.sessionId, authority: auth });
      assert.deepEqual(
        list.rows.map((r) => [r.id, r.mode, r.label]),
        [[start.childId, "continuable", "helper"]],
      );
      const drained = await brood.drain({ authority: auth, parent: root.sessionId, children: [start.childId] });
      assert.ok(Array.isArray(drained.disposed));
      await eventually("no activation after the drain", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "none");
    } finally {
      await root.close();
    }
  });

  test("sessions.result answers the last finished turn; descendants.dispose stops a running child", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const auth = root.authority();
      const start = await brood.startContinuable({ provider: "spawn", parent: root.ref(), label: "worker", prompt: text("say done") });
      await eventually("its first turn ends", 20_000, async () => (await brood.sessionResult({ sessionId: start.childId, authority: auth })).finished);
      const r = await brood.sessionResult({ sessionId: start.childId, authority: auth });
      assert.equal(r.stopReason, "completed");
      assert.deepEqual(r.output, text("done"));
      assert.equal(r.usage?.own.modelRequests, 1);
      assert.equal(r.usage?.own.outputTokens, 1);
      await eventually("the child settles", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "none");
      await brood.followup({ childId: start.childId, authority: auth, message: text("sleep 60s\nsay late") });
      await eventually("the child runs the followup", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "running");
      await assert.rejects(brood.disposeDescendants({ agent: { ...root.ref(), credential: "not-the-credential" } }), UnauthorizedError);
      const d = await brood.disposeDescendants({ agent: root.ref() });
      assert.deepEqual(d.disposed, [start.childId]);
      await eventually("no activation after the disposal", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "none");
    } finally {
      await root.close();
    }
  });

  test("another root may not act on the child", async () => {
    const [root, other] = await Promise.all([brood.openRoot({ cwd }), brood.openRoot({ cwd })]);
    try {
      const start = await brood.startContinuable({ provider: "spawn", parent: root.ref(), label: "mine", prompt: text("say mine") });
      await assert.rejects(brood.followup({ childId: start.childId, authority: other.authority(), message: text("say x") }), UnauthorizedError);
      await assert.rejects(brood.state({ childId: start.childId, authority: other.authority() }), UnauthorizedError);
    } finally {
      await Promise.all([root.close(), other.close()]);
    }
  });

  test("a user grant acts for the user", async () => {
    const g = await brood.userGrant();
    assert.ok(g.grant.length >= 43 && g.expiresAt > Date.now());
    const drains = await brood.drains({ authority: { grant: g.grant } });
    assert.ok(Array.isArray(drains.drains));
  });
});

describe("requests", () => {
  test("a child's question: listed with its choices, a wrong answer or verb is INVALID_ARGUMENT, the parent's answer wins once", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({
        provider: "spawn",
        parent: root.ref(),
        prompt: text('call ask {"question":"Which one?","choices":["a","b"]}\nsay done'),
      });
      let req: RequestRecord | undefined;
      await eventually("the question is pending", 20_000, async () => {
        const l = await brood.requests({ authority: root.authority() });
        req = l.requests.find((r) => r.sessionId === run.childId);
        return req !== undefined;
      });
      const id = req!.id;
      assert.equal(req!.kind, "question");
      assert.equal(req!.question, "Which one?");
      assert.deepEqual(req!.choices, ["a", "b"]);
      await assert.rejects(brood.answerQuestion(id, root.authority(), { text: "c" }), InvalidArgumentError);
      await assert.rejects(brood.answerRequest({ requestId: id, authority: root.authority(), answer: "approve" }), InvalidArgumentError);
      assert.equal((await brood.getRequest({ requestId: id, authority: root.authority() })).state, "pending");
      const answered = await brood.answerQuestion(id, root.authority(), { text: "b" });
      assert.equal(answered.state, "answered");
      assert.equal(answered.answer?.text, "b");
      assert.equal(answered.answer?.by.kind, "agent");
      await assert.rejects(brood.answerQuestion(id, root.authority(), { text: "a" }), AlreadyAnsweredError);
      assert.equal((await run.result()).stopReason, "completed");
    } finally {
      await root.close();
    }
  });
});

describe("budgets", () => {
  test("a continuable child at its cap is paused; another root may not raise it; the parent's raise continues the same turn", async () => {
    const [root, other] = await Promise.all([brood.openRoot({ cwd, budget: { modelRequests: 10 } }), brood.openRoot({ cwd })]);
    try {
      const auth = root.authority();
      const start = await brood.startContinuable({
        provider: "spawn", parent: root.ref(), label: "capped",
        prompt: text('call read_file {"path":"nothing.txt"}\nsay done'), options: { budget: { modelRequests: 1 } },
      });
      await eventually("the child pauses at its cap", 20_000, async () => (await brood.state({ childId: start.childId, authority: auth })).state === "paused");
      const st = await brood.state({ childId: start.childId, authority: auth });
      assert.equal(st.budgetPause?.kind, "budget");
      const req = await brood.getRequest({ requestId: st.budgetPause!.requestId, authority: auth });
      assert.equal(req.kind, "budget");
      assert.equal(req.budgetOf, start.childId);
      const ledgers = await brood.budget(start.childId, auth);
      assert.equal(ledgers.own, true);
      assert.deepEqual(ledgers.budgets.map((b) => b.limits.modelRequests), [10, 1]);
      await assert.rejects(brood.raiseBudget(start.childId, other.authority(), { modelRequests: 1 }), UnauthorizedError);
      await assert.rejects(brood.raiseBudget(start.childId, auth, { modelRequests: 10 }), LimitExceededError);
      await assert.rejects(brood.raiseBudget(start.childId, auth, { modelRequests: -1 }), InvalidArgumentError);
      const raised = await brood.raiseBudget(start.childId, auth, { modelRequests: 1 });
      assert.equal(raised.budget.limits.modelRequests, 2);
      assert.deepEqual(raised.resumed, [req.id]);
      await eventually("the turn completes", 20_000, async () => (await brood.sessionResult({ sessionId: start.childId, authority: auth })).finished);
      const r = await brood.sessionResult({ sessionId: start.childId, authority: auth });
      assert.equal(r.stopReason, "completed");
      assert.deepEqual(r.output, text("done"));
    } finally {
      await Promise.all([root.close(), other.close()]);
    }
  });
});

describe("reads", () => {
  test("a root reads its child's header and log, page by page", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("call list_dir {}\nsay listed") });
      assert.equal((await run.result()).stopReason, "completed");
      const auth = root.authority();
      const { header, events } = await brood.log({ sessionId: run.childId, authority: auth });
      assert.equal(header.id, run.childId);
      assert.equal(header.parentSession, root.sessionId);
      assert.deepEqual(
        events.map((e) => e.seq),
        events.map((_, i) => i),
      );
      assert.equal(events[0]?.type, "turn/start");
      assert.equal(events.at(-1)?.type, "turn/end");
      const paged = [];
      let req = { sessionId: run.childId, authority: auth, eventsMax: 2, fromSeq: 0, cursor: undefined as string | undefined };
      for (;;) {
        const p = await brood.logPage(req);
        assert.ok(p.events.length <= 2);
        paged.push(...p.events);
        if (p.complete) break;
        req = { ...req, fromSeq: p.nextSeq, cursor: p.cursor };
      }
      assert.deepEqual(paged, events);
      const other = await brood.openRoot({ cwd });
      await assert.rejects(brood.header({ sessionId: run.childId, authority: other.authority() }), UnauthorizedError);
      await other.close();
    } finally {
      await root.close();
    }
  });

  test("past lifecycle events, and a live follow of the subtree", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const auth = root.authority();
      const follow = await brood.follow({ parent: root.sessionId, descendants: true, authority: auth, creditMsgs: 2 });
      const run = await brood.startRun({
        provider: "spawn",
        parent: root.ref(),
        prompt: text('call subagent {"description":"deeper","prompt":"say deep"}\nsay done'),
      });
      await run.result();
      const seen: LifecycleEvent[] = [];
      for (let i = 0; i < 4; i++) seen.push(await follow.next());
      await follow.close();
      assert.deepEqual(
        seen.map((e) => [e.type, e.id === run.childId ? "child" : "grandchild"]),
        [
          ["subagent/start", "child"],
          ["subagent/start", "grandchild"],
          ["subagent/end", "grandchild"],
          ["subagent/end", "child"],
        ],
      );
      for (let i = 1; i < seen.length; i++) assert.ok(BigInt(seen[i]!.seq!) > BigInt(seen[i - 1]!.seq!));
      const page = await brood.events({ parent: root.sessionId, authority: auth });
      assert.deepEqual(
        page.events.map((e) => [e.type, e.id, e.seq]),
        seen.filter((e) => e.parentSession === root.sessionId).map((e) => [e.type, e.id, e.seq]),
      );
      assert.equal(page.complete, true);
      // A follow resumed after the first event sees the other three.
      const resumed = await brood.follow({ parent: root.sessionId, descendants: true, authority: auth, afterSeq: seen[0]!.seq });
      const rest = [];
      for (let i = 0; i < 3; i++) rest.push((await resumed.next()).seq);
      await resumed.close();
      assert.deepEqual(
        rest,
        seen.slice(1).map((e) => e.seq),
      );
    } finally {
      await root.close();
    }
  });

  test("a root reads the notices of its three background children, then its inbox is empty", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const ids = new Set<string>();
      for (const n of [1, 2, 3]) {
        const s = await brood.startContinuable({ provider: "spawn", parent: root.ref(), label: `job ${n}`, prompt: text(`say result ${n}`) });
        ids.add(s.childId);
      }
      const notices = [];
      const deadline = Date.now() + 30_000;
      while (notices.length < 3 && Date.now() < deadline) notices.push(...(await root.notices(2_000)));
      assert.equal(notices.length, 3);
      for (const n of notices) {
        assert.equal(n.source.kind, "subagent-settled");
        assert.ok(ids.has(n.source.senderSessionId!));
        assert.match(plainText(n.content), /is done and idle until you send it more\.\nClosing message:\nresult [123]/);
      }
      assert.deepEqual((await root.inbox()).items, []);
      await assert.rejects(brood.ack({ sessionId: [...ids][0]!, authority: root.authority(), seqs: ["1"] }), UnauthorizedError);
    } finally {
      await root.close();
    }
  });
});

describe("the README", () => {
  test("its example delegates a task and prints the result", async () => {
    const readme = readFileSync(join(repoRoot, "clients/typescript/README.md"), "utf8");
    const example = readFileSync(join(repoRoot, "clients/typescript/examples/delegate.ts"), "utf8");
    assert.ok(readme.includes(example.trim()), "README.md shows examples/delegate.ts verbatim");
    const { stdout } = await promisify(execFile)(process.execPath, [join(repoRoot, "clients/typescript/dist/examples/delegate.js")], {
      env: { ...process.env, BROOD_NATS_URL: dev.url },
      timeout: 60_000,
    });
    assert.equal(stdout.trim(), "completed Hello from a child agent");
  });
});

describe("outages", () => {
  test("a run's result rejects UNAVAILABLE once its connection closed for good, instead of waiting forever", async () => {
    const nc = await connect({ servers: dev.url });
    const c = new Client(nc, { awaitFallbackMs: 200 });
    const root = await c.openRoot({ cwd });
    const run = await c.startRun({ provider: "spawn", parent: root.ref(), prompt: text("sleep 60s\nsay late") });
    const waiting = run.result();
    await nc.close();
    const started = Date.now();
    await assert.rejects(waiting, (err: unknown) => {
      assert.ok(err instanceof UnavailableError, `got ${String(err)}`);
      assert.match(err.message, /connection is closed/);
      return true;
    });
    assert.ok(Date.now() - started < 10_000, "rejected within 10 s of the close");
    await brood.dispose({ runId: run.runId, parent: root.ref() });
  });
});

describe("the error catalogue", () => {
  test("equals the table of docs/protocol.md §2.2, with a class per code", () => {
    const doc = readFileSync(join(repoRoot, "docs/protocol.md"), "utf8");
    const section = doc.slice(doc.indexOf("### 2.2 Catalogue"), doc.indexOf("### 2.3"));
    const table: Record<string, number> = {};
    const retry = new Set<string>();
    for (const m of section.matchAll(/^\| `([A-Z_]+)` \| (\d+) \| (yes|no) \|/gm)) {
      table[m[1]!] = Number(m[2]);
      if (m[3] === "yes") retry.add(m[1]!);
    }
    assert.deepEqual(table, { ...Catalogue });
    assert.deepEqual([...retry].sort(), [...Retryable].sort(), "the codes marked retry yes in §2.2");
    for (const [code, n] of Object.entries(Catalogue)) {
      const err = new ErrorClasses[code as keyof typeof Catalogue](code, "m");
      assert.equal(err.number, n);
      assert.ok(err instanceof BroodError);
    }
  });

  test("a 2 MB request is LIMIT_EXCEEDED (request bytes), not a retryable UNAVAILABLE", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const prompt = text("x".repeat(2 << 20));
      await assert.rejects(brood.startRun({ provider: "spawn", parent: root.ref(), prompt }), (err: unknown) => {
        assert.ok(err instanceof LimitExceededError, `got ${String(err)}`);
        assert.equal(err.code, "LIMIT_EXCEEDED");
        assert.equal(err.details.limit, "request bytes");
        assert.equal(isRetryable(err.code), false);
        return true;
      });
    } finally {
      await root.close();
    }
  });

  test("a run whose model failed ends with errorCode MODEL_ERROR, marked retryable", async () => {
    const root = await brood.openRoot({ cwd });
    try {
      const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("fail boom") });
      const res = await run.result();
      assert.equal(res.stopReason, "error");
      assert.equal(res.errorCode, "MODEL_ERROR");
      assert.equal(res.diagnostic, "boom");
      assert.equal(isRetryable(res.errorCode), true);
    } finally {
      await root.close();
    }
  });
});
