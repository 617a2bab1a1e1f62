// An ACP agent written with the ACP TypeScript SDK (@agentclientprotocol/sdk),
// for Brood's ACP bridge and acp-agent tests: framing across implementations
// and the session/load (cold resume) path. It needs no model:
//
//   initialize    advertises loadSession
//   session/new   creates a session whose history is kept in
//                 $TS_AGENT_STATE_DIR/<sessionId>.json (default: the OS temp dir)
//   session/prompt  streams "ts: <prompt>" in three chunks and ends end_turn;
//                 "long N" streams one chunk of N bytes; "slow MS" streams
//                 "partial", then waits MS milliseconds honouring session/cancel;
//                 "turns" answers with the number of earlier prompts of the session
//   session/load  replays the history as user/agent message chunks
//   session/cancel  cancels the session's running prompt
import { Readable, Writable } from "node:stream";
import { randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { agent, methods, ndJsonStream, RequestError } from "@agentclientprotocol/sdk";

const stateDir = process.env.TS_AGENT_STATE_DIR || path.join(os.tmpdir(), "brood-ts-agent");
fs.mkdirSync(stateDir, { recursive: true });
const file = (id) => path.join(stateDir, id.replace(/[^A-Za-z0-9_-]/g, "_") + ".json");
const load = (id) => JSON.parse(fs.readFileSync(file(id), "utf8"));
const save = (s) => fs.writeFileSync(file(s.id), JSON.stringify(s));
const running = new Map(); // sessionId -> AbortController

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(() => resolve(true), ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(false); }, { once: true });
  });

const text = (blocks) => blocks.filter((b) => b.type === "text").map((b) => b.text).join("");

const chunk = (client, sessionId, kind, t) =>
  client.notify(methods.client.session.update, { sessionId, update: { sessionUpdate: kind, content: { type: "text", text: t } } });

const app = agent({ name: "brood-ts-test-agent" })
  .onRequest(methods.agent.initialize, () => ({
    protocolVersion: 1,
    agentCapabilities: { loadSession: true },
    authMethods: [],
    agentInfo: { name: "brood-ts-test-agent", version: "1" },
  }))
  .onRequest(methods.agent.session.new, ({ params }) => {
    const s = { id: "ts-" + randomUUID(), cwd: params.cwd, meta: params._meta ?? null, history: [] };
    save(s);
    return { sessionId: s.id };
  })
  .onRequest(methods.agent.session.load, async ({ params, client }) => {
    let s;
    try {
      s = load(params.sessionId);
    } catch {
      throw RequestError.resourceNotFound(params.sessionId);
    }
    for (const h of s.history) {
      await chunk(client, s.id, h.role === "user" ? "user_message_chunk" : "agent_message_chunk", h.text);
    }
    return {};
  })
  .onRequest(methods.agent.session.prompt, async ({ params, client }) => {
    const s = load(params.sessionId);
    const prompt = text(params.prompt);
    const ac = new AbortController();
    running.set(s.id, ac);
    try {
      let answer;
      const [word, arg] = prompt.trim().split(/\s+/, 2);
      if (word === "long") {
        answer = "z".repeat(Number(arg));
        await chunk(client, s.id, "agent_message_chunk", answer);
      } else if (word === "slow") {
        await chunk(client, s.id, "agent_message_chunk", "partial");
        if (!(await sleep(Number(arg), ac.signal))) return { stopReason: "cancelled" };
        answer = "partial done";
        await chunk(client, s.id, "agent_message_chunk", " done");
      } else if (word === "turns") {
        answer = `turns before this one: ${s.history.filter((h) => h.role === "user").length}`;
        await chunk(client, s.id, "agent_message_chunk", answer);
      } else {
        answer = "ts: " + prompt;
        const third = Math.ceil(answer.length / 3);
        for (let i = 0; i < answer.length; i += third) {
          await chunk(client, s.id, "agent_message_chunk", answer.slice(i, i + third));
          await sleep(10);
        }
      }
      s.history.push({ role: "user", text: prompt }, { role: "agent", text: answer });
      save(s);
      return { stopReason: "end_turn" };
    } finally {
      running.delete(s.id);
    }
  })
  .onNotification(methods.agent.session.cancel, ({ params }) => {
    running.get(params.sessionId)?.abort();
  });

const conn = app.connect(ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
await conn.closed;
process.exit(0);
