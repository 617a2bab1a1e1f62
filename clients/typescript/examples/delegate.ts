// Delegate a task to a child agent and print its result.
import { connect } from "@nats-io/transport-node";
import { Client, plainText, text } from "@brood-dev/client";

const nc = await connect({ servers: process.env.BROOD_NATS_URL ?? "nats://127.0.0.1:4222" });
const brood = new Client(nc);
const root = await brood.openRoot({ cwd: process.cwd() });
try {
  const run = await brood.startRun({ provider: "spawn", parent: root.ref(), prompt: text("say Hello from a child agent") });
  const result = await run.result();
  console.log(result.stopReason, plainText(result.output));
} finally {
  await root.close();
  await nc.close();
}
