// An editor written with the ACP TypeScript SDK's client side
// (@agentclientprotocol/sdk), for Brood's test of `brood acp-agent` asking
// the editor about its tree's requests (issue 33, item 4):
//
//   node ts-editor.mjs BROOD NATS_URL CWD OPTION PROMPT
//
// runs `BROOD acp-agent --nats NATS_URL` as its agent, initializes, opens a
// session in CWD and sends PROMPT; it answers every session/request_permission
// by selecting OPTION (the SDK validates what the agent sends against the ACP
// schema). It writes one JSON line per event on stdout: {"session": id} after
// session/new, {"stop": reason} after the prompt, {"ask": params} for each
// session/request_permission, {"update": {toolCallId, status}} for each
// session/update of a tool call. When its stdin closes it closes the agent's
// and exits once the agent did.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { client, methods, ndJsonStream } from "@agentclientprotocol/sdk";

const [bin, url, cwd, option, prompt] = process.argv.slice(2);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const agentProc = spawn(bin, ["acp-agent", "--nats", url, "--log-level", "info"], { stdio: ["pipe", "pipe", "inherit"] });
const exited = new Promise((resolve) => agentProc.on("exit", resolve));

const app = client({ name: "brood-ts-test-editor" })
  .onRequest(methods.client.session.requestPermission, ({ params }) => {
    out({ ask: params });
    return { outcome: { outcome: "selected", optionId: option } };
  })
  .onNotification(methods.client.session.update, ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "tool_call" || u.sessionUpdate === "tool_call_update") {
      out({ update: { toolCallId: u.toolCallId, status: u.status ?? null } });
    }
  });
const conn = app.connect(ndJsonStream(Writable.toWeb(agentProc.stdin), Readable.toWeb(agentProc.stdout)));
const agent = conn.agent;
await agent.request(methods.agent.initialize, { protocolVersion: 1, clientCapabilities: {} });
const { sessionId } = await agent.request(methods.agent.session.new, { cwd, mcpServers: [] });
out({ session: sessionId });
const r = await agent.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: prompt }] });
out({ stop: r.stopReason });

process.stdin.resume();
await new Promise((resolve) => process.stdin.on("end", resolve));
agentProc.stdin.end();
await exited;
process.exit(0);
