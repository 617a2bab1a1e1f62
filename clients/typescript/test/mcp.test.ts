// `brood mcp` driven by the official MCP TypeScript SDK as the host
// (docs/mcp.md): a fresh `brood dev`, and `brood mcp --listen` on it over
// streamable HTTP.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { after, before, describe, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

import { startDev, type Dev } from "./dev.js";

let dev: Dev;
let mcpProc: ChildProcess;
let host: Client;

/** Starts `brood mcp --listen` on the dev server and resolves its URL. */
async function startMCP(): Promise<string> {
  mcpProc = spawn(dev.bin, ["mcp", "--nats", dev.url, "--listen", "127.0.0.1:0", "--cwd", dev.dir], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  mcpProc.stderr!.on("data", (b: Buffer) => (stderr += b.toString()));
  return new Promise<string>((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`brood mcp printed no URL within 30 s; stderr:\n${stderr}`)), 30_000);
    mcpProc.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const m = /MCP URL (http:\/\/\S+)/.exec(out);
      if (m?.[1]) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    mcpProc.on("exit", (code) => reject(new Error(`brood mcp exited ${code}; stderr:\n${stderr}`)));
  });
}

before(async () => {
  dev = await startDev();
  const url = await startMCP();
  host = new Client({ name: "ts-host", version: "1.0.0" });
  await host.connect(new StreamableHTTPClientTransport(new URL(url)));
});

after(async () => {
  await host?.close();
  if (mcpProc && mcpProc.exitCode === null) {
    const exited = new Promise<void>((r) => mcpProc.once("exit", () => r()));
    mcpProc.kill("SIGINT");
    await exited;
  }
  await dev?.stop();
});

interface Status {
  childId: string;
  runId?: string;
  kind: string;
  state: string;
  messageId?: string;
  disposed?: string[];
  result?: { stopReason: string; output: string; structured?: unknown; turn?: number };
}

/** Calls a tool that must succeed and returns its structured content. */
async function call<T = Status>(name: string, args: Record<string, unknown> = {}): Promise<T> {
  const res = await host.callTool({ name, arguments: args });
  assert.ok(!res.isError, `${name} failed: ${JSON.stringify(res.content)}`);
  return res.structuredContent as T;
}

/** Calls a tool that must fail and returns its error text. */
async function callError(name: string, args: Record<string, unknown>): Promise<string> {
  const res = await host.callTool({ name, arguments: args });
  assert.equal(res.isError, true, `${name} succeeded: ${JSON.stringify(res.structuredContent)}`);
  return (res.content as { type: string; text: string }[]).map((c) => c.text).join("\n");
}

describe("brood mcp with the MCP TypeScript SDK as the host", () => {
  test("lists Brood's tools", async () => {
    const { tools } = await host.listTools();
    assert.deepEqual(
      tools.map((t) => t.name).sort(),
      ["children", "delegate", "dispose", "followup", "interrupt", "providers", "result", "state"],
    );
    const delegate = tools.find((t) => t.name === "delegate")!;
    assert.deepEqual((delegate.inputSchema.required as string[]).sort(), ["prompt", "provider"]);
  });

  test("delegate answers at once with ids; result waits for the answer", async () => {
    const st = await call("delegate", { provider: "spawn", prompt: "sleep 300ms\nsay hello", waitSeconds: 0 });
    assert.equal(st.kind, "one-shot");
    assert.equal(st.state, "running");
    assert.ok(st.runId && st.childId);
    const res = await call("result", { id: st.childId, waitSeconds: 30 });
    assert.equal(res.state, "settled");
    assert.equal(res.result?.stopReason, "completed");
    assert.equal(res.result?.output, "hello");
  });

  test("a continuable child: followup, children, dispose", async () => {
    const st = await call("delegate", { provider: "spawn", prompt: "say one", continuable: true });
    assert.equal(st.kind, "continuable");
    assert.equal(st.result?.output, "one");
    const up = await call("followup", { childId: st.childId, message: "say two" });
    assert.equal(up.result?.output, "two");
    assert.equal(up.result?.turn, 2);
    const kids = await call<{ children: { id: string }[] }>("children");
    assert.ok(kids.children.some((c) => c.id === st.childId), JSON.stringify(kids));
    await call("followup", { childId: st.childId, message: "sleep 60s\nsay never", waitSeconds: 0 });
    const gone = await call("dispose", { id: st.childId });
    assert.ok(Array.isArray(gone.disposed));
  });

  test("an error is a tool error that starts with its code", async () => {
    assert.match(await callError("delegate", { provider: "nobody", prompt: "say x" }), /^NO_PROVIDER: /);
    assert.match(await callError("state", { id: "01NOSUCHCHILD0000000000000" }), /^(NOT_FOUND|UNAUTHORIZED): /);
  });
});
