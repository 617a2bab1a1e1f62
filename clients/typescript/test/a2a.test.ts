// `brood a2a-gateway` (docs/a2a.md) driven by the official A2A JavaScript
// SDK (@a2a-js/sdk, protocol v1.0): send, stream and cancel against a
// gateway over a fresh `brood dev`, on both of its bindings.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Message, TaskState, type Task } from "@a2a-js/sdk";
import { ClientFactory, JsonRpcTransportFactory, RestTransportFactory, type Client } from "@a2a-js/sdk/client";

import { eventually, startDev, type Dev } from "./dev.js";

const token = "ts-a2a-test-token";

let dev: Dev;
let gateway: ChildProcess;
let agentURL: string;

/** fetch with the caller's bearer token on every request. */
function withToken(tok: string): typeof fetch {
  return (input, init) => {
    const headers = new Headers(init?.headers);
    headers.set("Authorization", `Bearer ${tok}`);
    return fetch(input, { ...init, headers });
  };
}

before(async () => {
  dev = await startDev();
  const callers = join(dev.dir, "a2a-callers.json");
  const sha = createHash("sha256").update(token).digest("hex");
  writeFileSync(callers, JSON.stringify({ callers: [{ user: "ts", tokenSha256: sha }] }), { mode: 0o600 });
  gateway = spawn(dev.bin, ["a2a-gateway", "--nats", dev.url, "--callers", callers, "--listen", "127.0.0.1:0"], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const base = await new Promise<string>((resolve, reject) => {
    let stderr = "";
    const timer = setTimeout(() => reject(new Error(`brood a2a-gateway printed no address within 60 s:\n${stderr}`)), 60_000);
    gateway.stderr!.on("data", (b: Buffer) => {
      stderr += b.toString();
      const m = /msg="a2a gateway serving" addr=(\S+)/.exec(stderr);
      if (m?.[1]) {
        clearTimeout(timer);
        resolve(`http://${m[1]}`);
      }
    });
    gateway.on("exit", (code) => reject(new Error(`brood a2a-gateway exited ${code}:\n${stderr}`)));
  });
  agentURL = `${base}/agents/spawn`;
});

after(async () => {
  if (gateway && gateway.exitCode === null) {
    const exited = new Promise<void>((r) => gateway.once("exit", () => r()));
    gateway.kill("SIGINT");
    await exited;
  }
  await dev?.stop();
});

const bindings = {
  "JSON-RPC": () => new JsonRpcTransportFactory({ fetchImpl: withToken(token) }),
  "HTTP+JSON": () => new RestTransportFactory({ fetchImpl: withToken(token) }),
};

async function clientOf(binding: keyof typeof bindings): Promise<Client> {
  return new ClientFactory({ transports: [bindings[binding]()] }).createFromUrl(`${agentURL}/.well-known/agent-card.json`, "");
}

function message(text: string, contextId = ""): Message {
  return Message.fromJSON({ messageId: randomUUID(), role: "ROLE_USER", parts: [{ text }], contextId });
}

function artifactText(t: Task): string {
  return t.artifacts
    .flatMap((a) => a.parts)
    .map((p) => (p.content?.$case === "text" ? p.content.value : ""))
    .join("");
}

function asTask(r: unknown): Task {
  assert.ok(r && typeof r === "object" && "status" in r, `a task, not ${JSON.stringify(r)}`);
  return r as Task;
}

for (const binding of Object.keys(bindings) as (keyof typeof bindings)[]) {
  describe(`a2a gateway over ${binding}`, () => {
    test("the card names the provider, both bindings and the Brood extensions", async () => {
      const card = await (await fetch(`${agentURL}/.well-known/agent-card.json`)).json();
      assert.equal(card.name, "spawn");
      assert.deepEqual(card.supportedInterfaces.map((i: { protocolBinding: string }) => i.protocolBinding).sort(), ["HTTP+JSON", "JSONRPC"]);
      const uris = card.capabilities.extensions.map((x: { uri: string }) => x.uri);
      assert.ok(uris.includes("urn:brood:a2a:ext:cascading-cancel:v1"), uris.join(","));
    });

    test("send answers the completed task; a followup in its context is its next task", async () => {
      const a2a = await clientOf(binding);
      const first = asTask(await a2a.sendMessage({ message: message("say hello from ts"), tenant: "", configuration: undefined, metadata: undefined }));
      assert.equal(first.status?.state, TaskState.TASK_STATE_COMPLETED);
      assert.equal(artifactText(first), "hello from ts");
      const next = asTask(await a2a.sendMessage({ message: message("say again", first.contextId), tenant: "", configuration: undefined, metadata: undefined }));
      assert.equal(next.contextId, first.contextId);
      assert.notEqual(next.id, first.id);
      assert.equal(artifactText(next), "again");
    });

    test("stream: the task, working, the output and completed, in order", async () => {
      const a2a = await clientOf(binding);
      const seen: string[] = [];
      let output = "";
      for await (const ev of a2a.sendMessageStream({ message: message("sleep 200ms\nsay streamed"), tenant: "", configuration: undefined, metadata: undefined })) {
        const p = ev.payload;
        if (p?.$case === "task") seen.push(`task:${TaskState[p.value.status!.state]}`);
        if (p?.$case === "statusUpdate") seen.push(`status:${TaskState[p.value.status!.state]}`);
        if (p?.$case === "artifactUpdate") {
          seen.push("artifact");
          output = p.value.artifact!.parts.map((x) => (x.content?.$case === "text" ? x.content.value : "")).join("");
        }
      }
      assert.equal(seen[0], "task:TASK_STATE_SUBMITTED");
      assert.equal(seen.at(-1), "status:TASK_STATE_COMPLETED");
      assert.ok(seen.indexOf("status:TASK_STATE_WORKING") < seen.indexOf("artifact"), seen.join(" "));
      assert.equal(output, "streamed");
    });

    test("cancel ends a running task canceled", async () => {
      const a2a = await clientOf(binding);
      const task = asTask(
        await a2a.sendMessage({
          message: message("sleep 60s\nsay never"),
          tenant: "",
          configuration: { acceptedOutputModes: [], taskPushNotificationConfig: undefined, returnImmediately: true },
          metadata: undefined,
        }),
      );
      await eventually("the task works", 30_000, async () => (await a2a.getTask({ id: task.id, tenant: "" })).status?.state === TaskState.TASK_STATE_WORKING);
      const canceled = await a2a.cancelTask({ id: task.id, tenant: "", metadata: undefined });
      assert.equal(canceled.status?.state, TaskState.TASK_STATE_CANCELED);
      await assert.rejects(a2a.cancelTask({ id: task.id, tenant: "", metadata: undefined }));
    });

    test("a caller without a known token is refused", async () => {
      const factory = binding === "JSON-RPC" ? new JsonRpcTransportFactory({ fetchImpl: withToken("wrong") }) : new RestTransportFactory({ fetchImpl: withToken("wrong") });
      const a2a = await new ClientFactory({ transports: [factory] }).createFromUrl(`${agentURL}/.well-known/agent-card.json`, "");
      await assert.rejects(a2a.sendMessage({ message: message("say no"), tenant: "", configuration: undefined, metadata: undefined }));
    });
  });
}
