// A fresh `brood dev` for the tests: built from this repository (or
// $BROOD_BIN), on a free loopback port, with its data in a temp dir.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { connect, type NatsConnection } from "@nats-io/transport-node";

import { Client } from "../src/index.js";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository root (this file runs from clients/typescript/dist/test). */
export const repoRoot = resolve(here, "../../../..");

export interface Dev {
  url: string;
  nc: NatsConnection;
  client: Client;
  dir: string;
  bin: string;
  stop(): Promise<void>;
}

function broodBin(dir: string): string {
  if (process.env.BROOD_BIN) return process.env.BROOD_BIN;
  const bin = join(dir, "brood");
  execFileSync("go", ["build", "-o", bin, "./cmd/brood"], { cwd: repoRoot, stdio: "inherit" });
  return bin;
}

/** Starts brood dev and resolves once the spawn and fork providers are live. */
export async function startDev(): Promise<Dev> {
  const dir = mkdtempSync(join(tmpdir(), "brood-ts-"));
  const bin = broodBin(dir);
  const proc: ChildProcess = spawn(bin, ["dev", "--data", join(dir, "data"), "--listen", "127.0.0.1:0", "--log-level", "warn"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  proc.stderr!.on("data", (b: Buffer) => (stderr += b.toString()));
  const url = await new Promise<string>((resolveURL, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`brood dev printed no URL within 60 s; stderr:\n${stderr}`)), 60_000);
    proc.stdout!.on("data", (b: Buffer) => {
      out += b.toString();
      const m = /NATS client URL (nats:\/\/\S+)/.exec(out);
      if (m?.[1]) {
        clearTimeout(timer);
        resolveURL(m[1]);
      }
    });
    proc.on("exit", (code) => reject(new Error(`brood dev exited ${code}; stderr:\n${stderr}`)));
  });
  const nc = await connect({ servers: url });
  const client = new Client(nc, { awaitFallbackMs: 2_000 });
  const deadline = Date.now() + 30_000;
  for (;;) {
    const p = await client.providers().catch(() => undefined);
    if ((p?.instances["spawn"] ?? 0) > 0 && (p?.instances["fork"] ?? 0) > 0) break;
    if (Date.now() > deadline) throw new Error("spawn and fork not listed within 30 s");
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    nc,
    client,
    dir,
    bin,
    async stop() {
      client.close();
      await nc.close();
      const exited = new Promise<void>((r) => proc.once("exit", () => r()));
      proc.kill("SIGINT");
      const killer = setTimeout(() => proc.kill("SIGKILL"), 20_000);
      await exited;
      clearTimeout(killer);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Polls cond every 50 ms until it holds, or fails after ms. */
export async function eventually(what: string, ms: number, cond: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
