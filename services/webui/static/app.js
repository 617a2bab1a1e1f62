// Brood's web view: the live delegation tree (left) and one session's log as
// a conversation (right). Data comes from the server's event streams:
// /api/tree ("tree", then "nodes") and /api/sessions/ID/log ("header", then
// "events"). Everything from the server is shown with textContent, never as
// HTML.
"use strict";

const nodes = new Map(); // id -> node {id, parent, root, provider, mode, state, stopReason, errorCode, start, end, epochs}
let selected = "";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function shortId(id) {
  return id.length > 12 ? "…" + id.slice(-8) : id;
}

function duration(ms) {
  if (!(ms >= 0)) return "";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " m " + Math.floor(s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " m";
}

function nodeDuration(n) {
  if (!n.start || n.root) return "";
  const end = n.state === "running" ? Date.now() : n.end || Date.now();
  return duration(end - n.start);
}

function dotClass(n) {
  if (n.root) return "root";
  if (n.state === "running") return "running";
  if (n.state === "idle" && n.stopReason === "completed") return "idle";
  return n.stopReason || n.state;
}

function setStatus(text, cls) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = "status " + cls;
}

// ---- the tree ----

function childrenOf(id) {
  const out = [];
  for (const n of nodes.values()) if (n.parent === id) out.push(n);
  out.sort((a, b) => (a.start || 0) - (b.start || 0));
  return out;
}

function renderRow(n) {
  const row = el("div", "row" + (n.id === selected ? " selected" : ""));
  row.dataset.id = n.id;
  row.dataset.state = n.state || "";
  row.title = n.id;
  row.appendChild(el("span", "dot " + dotClass(n)));
  row.appendChild(el("span", "id", n.root ? "root " + shortId(n.id) : shortId(n.id)));
  if (n.provider) row.appendChild(el("span", "badge provider", n.provider));
  if (n.mode === "continuable") row.appendChild(el("span", "badge", "continuable" + (n.epochs > 1 ? " ×" + n.epochs : "")));
  if (n.state === "running" || n.state === "idle") row.appendChild(el("span", "badge state-" + n.state, n.state));
  if (n.stopReason && n.state !== "running") {
    const r = el("span", "badge reason-" + n.stopReason, n.stopReason + (n.errorCode ? " " + n.errorCode : ""));
    r.dataset.stopReason = n.stopReason;
    row.appendChild(r);
  }
  const d = el("span", "dur", nodeDuration(n));
  d.dataset.durationOf = n.id;
  row.appendChild(d);
  row.addEventListener("click", () => { location.hash = "#/s/" + encodeURIComponent(n.id); });
  return row;
}

function renderSubtree(n, depth) {
  const li = el("li");
  li.dataset.node = n.id;
  li.appendChild(renderRow(n));
  const kids = depth < 64 ? childrenOf(n.id) : [];
  if (kids.length) {
    const ul = el("ul", "children");
    for (const k of kids) ul.appendChild(renderSubtree(k, depth + 1));
    li.appendChild(ul);
  }
  return li;
}

function renderTree() {
  const nav = document.getElementById("tree");
  const roots = [];
  for (const n of nodes.values()) if (!n.parent || !nodes.has(n.parent)) roots.push(n);
  roots.sort((a, b) => (b.start || 0) - (a.start || 0)); // newest first
  nav.replaceChildren();
  if (!roots.length) {
    nav.appendChild(el("div", "empty", 'No delegations yet. Run brood run --provider spawn "say hi".'));
  } else {
    const ul = el("ul", "roots");
    for (const r of roots) ul.appendChild(renderSubtree(r, 0));
    nav.appendChild(ul);
  }
  let running = 0;
  for (const n of nodes.values()) if (n.state === "running") running++;
  document.getElementById("summary").textContent =
    nodes.size + " sessions, " + running + " running";
  refreshChildLinks();
}

let treeTimer = 0;
function scheduleTree() {
  if (!treeTimer) treeTimer = setTimeout(() => { treeTimer = 0; renderTree(); }, 50);
}

function connectTree() {
  const es = new EventSource("/api/tree");
  es.addEventListener("tree", (e) => {
    nodes.clear();
    for (const n of JSON.parse(e.data)) nodes.set(n.id, n);
    setStatus("live", "live");
    renderTree();
  });
  es.addEventListener("nodes", (e) => {
    for (const n of JSON.parse(e.data)) nodes.set(n.id, n);
    scheduleTree();
  });
  es.onerror = () => setStatus("reconnecting", "down"); // EventSource retries by itself
}

// Running durations tick once a second.
setInterval(() => {
  for (const d of document.querySelectorAll("[data-duration-of]")) {
    const n = nodes.get(d.dataset.durationOf);
    if (n && n.state === "running") d.textContent = nodeDuration(n);
  }
  if (view && nodes.has(view.id) && nodes.get(view.id).state === "running") refreshChildLinks();
}, 1000);

// ---- one session's conversation ----

let logStream = null;
let view = null; // {id, header, next, calls: Map(callId -> card), seed}

function link(id, text) {
  const a = el("a", "session-link", text || shortId(id));
  a.title = id;
  a.dataset.session = id;
  a.href = "#/s/" + encodeURIComponent(id);
  return a;
}

function textOf(blocks) {
  if (!Array.isArray(blocks)) return "";
  return blocks.filter((b) => b && b.type === "text" && !b.framing).map((b) => b.text).join("");
}

function pretty(args) {
  if (typeof args !== "string") return JSON.stringify(args, null, 2);
  try { return JSON.stringify(JSON.parse(args), null, 2); } catch (_) { return args; }
}

function openSession(id) {
  if (logStream) { logStream.close(); logStream = null; }
  selected = id;
  for (const r of document.querySelectorAll(".row.selected")) r.classList.remove("selected");
  for (const r of document.querySelectorAll('.row[data-id="' + CSS.escape(id) + '"]')) r.classList.add("selected");
  const sec = document.getElementById("session");
  sec.replaceChildren(el("div", "empty", "Loading " + id + " …"));
  view = { id, header: null, next: 0, calls: new Map(), seedBox: null, log: null };
  streamLog(view);
}

function streamLog(v) {
  const es = new EventSource("/api/sessions/" + encodeURIComponent(v.id) + "/log?from=" + v.next);
  logStream = es;
  es.addEventListener("header", (e) => { if (view === v && !v.header) renderHeader(v, JSON.parse(e.data)); });
  es.addEventListener("events", (e) => {
    if (view !== v) return;
    for (const ev of JSON.parse(e.data)) {
      if (ev.seq < v.next) continue; // already shown
      renderEvent(v, ev);
      v.next = ev.seq + 1;
    }
    refreshChildLinks();
  });
  es.addEventListener("failure", (e) => {
    if (view === v && v.log) v.log.appendChild(el("div", "note", "reading the log failed: " + JSON.parse(e.data).message + " (retrying)"));
  });
  es.onerror = () => {
    // Resume after the last event shown (EventSource would restart at the
    // first URL's from=).
    es.close();
    if (view !== v) return;
    if (!v.header) {
      document.getElementById("session").replaceChildren(el("div", "empty", "Cannot read session " + v.id + "."));
    }
    setTimeout(() => { if (view === v) streamLog(v); }, 1500);
  };
}

function renderHeader(v, h) {
  v.header = h;
  const sec = document.getElementById("session");
  sec.replaceChildren();
  const title = el("h2", "", "Session ");
  title.appendChild(el("span", "mono", h.id));
  sec.appendChild(title);
  const meta = el("dl", "meta");
  const add = (k, val) => { meta.appendChild(el("dt", "", k)); const dd = el("dd"); if (val instanceof Node) dd.appendChild(val); else dd.textContent = val; meta.appendChild(dd); };
  if (h.parentSession) add("parent", link(h.parentSession)); else add("kind", "root");
  const run = el("span", "", "");
  run.id = "session-run";
  add("run", run);
  add("depth", h.delegationDepth || 0);
  if (h.cwd) add("cwd", h.cwd);
  if (h.createdAt) add("created", new Date(h.createdAt).toLocaleString());
  if (h.seedLength) add("inherited", h.seedLength + " events of its parent's log");
  sec.appendChild(meta);
  const kids = el("div", "note");
  kids.id = "children-of";
  sec.appendChild(kids);
  v.log = el("div");
  v.log.id = "log";
  v.log.dataset.session = h.id;
  sec.appendChild(v.log);
  refreshChildLinks();
}

function container(v, ev) {
  // A fork child's inherited events are folded away.
  if (v.header && v.header.seedLength && ev.seq < v.header.seedLength) {
    if (!v.seedBox) {
      v.seedBox = el("details", "seed");
      v.seedBox.appendChild(el("summary", "", "context inherited from the parent (" + v.header.seedLength + " events)"));
      v.log.appendChild(v.seedBox);
    }
    return v.seedBox;
  }
  return v.log;
}

function sourceLabel(src) {
  if (!src || !src.kind || src.kind === "user") return null;
  const who = src.senderSessionId ? " " + shortId(src.senderSessionId) : "";
  switch (src.kind) {
    case "subagent-settled": return "notice: child" + who + " settled";
    case "report": return "report from child" + who;
    case "coordinator": return src.form === "relay" ? "message from parent" + who : "from the coordinator";
    default: return src.kind + who;
  }
}

function renderEvent(v, ev) {
  if (!v.log) return;
  const box = container(v, ev);
  const d = ev.data || {};
  let node = null;
  switch (ev.type) {
    case "turn/start":
      node = el("div", "turn", "Turn " + d.turn + " · " + new Date(ev.time).toLocaleTimeString());
      break;
    case "user/message": {
      const label = sourceLabel(d.source);
      node = el("div", "msg " + (label ? "notice" : "user"));
      const who = el("div", "who", label || "user");
      if (d.source && d.source.senderSessionId) { who.appendChild(document.createTextNode(" ")); who.appendChild(link(d.source.senderSessionId)); }
      node.appendChild(who);
      node.appendChild(el("div", "text", textOf(d.content)));
      break;
    }
    case "assistant/message": {
      const m = d.message || {};
      const text = textOf(m.content);
      if (!text && !d.interrupted) break; // tool calls follow as their own events
      node = el("div", "msg assistant" + (d.interrupted ? " interrupted" : ""));
      node.appendChild(el("div", "who", d.interrupted ? "assistant (cut off)" : "assistant"));
      node.appendChild(el("div", "text", text));
      break;
    }
    case "tool/call": {
      node = el("details", "tool pending");
      node.dataset.callId = d.callId;
      node.dataset.tool = d.name;
      const sum = el("summary");
      sum.appendChild(el("span", "badge", "tool"));
      sum.appendChild(el("span", "mono", d.name));
      node.appendChild(sum);
      const body = el("div", "body");
      body.appendChild(el("div", "label", "arguments"));
      body.appendChild(el("pre", "args", pretty(d.arguments)));
      node.appendChild(body);
      node.open = true;
      v.calls.set(d.callId, node);
      break;
    }
    case "tool/result": {
      const card = v.calls.get(d.callId);
      if (!card) break;
      card.classList.remove("pending");
      card.dataset.result = d.isError ? "error" : "ok";
      if (d.isError) card.classList.add("failed");
      const body = card.querySelector(".body");
      body.appendChild(el("div", "label", d.isError ? "result (error)" : "result"));
      body.appendChild(el("pre", "result", textOf(d.content)));
      const meta = d.meta || {};
      if (meta.childId) {
        const p = el("div", "note", "child ");
        p.appendChild(link(meta.childId));
        if (meta.stopReason) p.appendChild(document.createTextNode(" · " + meta.stopReason));
        body.appendChild(p);
        card.querySelector("summary").appendChild(link(meta.childId, "→ " + shortId(meta.childId)));
      }
      if (card.dataset.tool !== "subagent") card.open = false;
      break;
    }
    case "turn/end": {
      const r = d.reason || {};
      node = el("div", "end" + (r.kind === "error" ? " error" : ""), "turn " + d.turn + " ended: " + r.kind + (r.cause ? " (" + r.cause + ")" : "") + (r.error ? " — " + r.error : ""));
      break;
    }
    case "agent/inbox/enqueue":
    case "agent/inbox/discard":
      node = el("div", "note", ev.type.replace("agent/inbox/", "inbox: ") + (d.messageId ? " " + d.messageId : ""));
      break;
    case "acp/session":
      node = el("div", "note", "ACP session " + (d.sessionId || "") + (d.loaded ? " (loaded)" : ""));
      break;
    case "acp/permission":
      node = el("div", "note", "ACP permission request: " + (d.title || d.toolCallId || "") + " → " + (d.outcome || d.optionId || ""));
      break;
    default:
      break; // step/start, step/end, descriptors, claims: bookkeeping
  }
  if (node) {
    node.dataset.seq = ev.seq;
    node.dataset.type = ev.type;
    box.appendChild(node);
  }
}

// Children of the open session, from the tree: links that appear as soon as
// a child starts (a subagent call's result names its child only at the end).
function refreshChildLinks() {
  const run = document.getElementById("session-run");
  if (run && view) {
    const n = nodes.get(view.id);
    run.textContent = !n ? "—" : n.root ? "root (no run of its own)" :
      [n.provider, n.mode, n.state, n.stopReason, n.errorCode, nodeDuration(n)].filter(Boolean).join(" · ");
    run.dataset.state = n ? n.state : "";
  }
  const box = document.getElementById("children-of");
  if (!box || !view) return;
  const kids = childrenOf(view.id);
  box.replaceChildren();
  if (!kids.length) return;
  box.appendChild(document.createTextNode("children: "));
  kids.forEach((k, i) => {
    if (i) box.appendChild(document.createTextNode(", "));
    const a = link(k.id);
    a.classList.add("child-link");
    box.appendChild(a);
    box.appendChild(el("span", "label", " " + (k.state === "running" ? "running" : k.stopReason || k.state)));
  });
}

function route() {
  const m = location.hash.match(/^#\/s\/(.+)$/);
  if (m) openSession(decodeURIComponent(m[1]));
}

window.addEventListener("hashchange", route);
connectTree();
route();
