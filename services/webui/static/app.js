// Brood's web view: the live delegation tree (left) and one session's log as
// a conversation (right). Data comes from the server's event streams:
// /api/tree ("tree", then "nodes") and /api/sessions/ID/log ("header", then
// "events"). Everything from the server is shown with textContent, never as
// HTML.
"use strict";

const nodes = new Map(); // id -> node {id, parent, root, label, provider, mode, runId, state, stopReason, errorCode, start, end, epochs, usage}
// The tree's indexes, kept as nodes arrive (issue 37, item 5: a tree of
// 30,000 nodes was rebuilt by scanning every node for each node's children):
const kids = new Map(); // parent id -> Set of child ids
const items = new Map(); // id -> its rendered <li>
const running = new Set(); // ids of running nodes (their durations tick)
const pendingBy = new Map(); // session id -> how many pending requests it has (its row is marked)
const pausedBy = new Set(); // session ids with a pending budget request: paused at the cap (§5.5)
let selected = "";
// Timings of the last renders (ms), read by the browser tests.
const perf = { tree: 0, update: 0, search: 0, nodes: 0 };
window.broodPerf = perf;

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

function isRoot(n) {
  return !n.parent || !nodes.has(n.parent);
}

function byStart(a, b) {
  return (a.start || 0) - (b.start || 0) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

// put stores n and keeps the indexes; it reports whether the tree's shape
// changed in a way an in-place update cannot follow (a node moved, or a new
// node adopted nodes shown as roots).
function put(n) {
  const old = nodes.get(n.id);
  n.key = (n.id + "\n" + (n.label || "")).toLowerCase(); // what search matches
  nodes.set(n.id, n);
  if (n.state === "running") running.add(n.id); else running.delete(n.id);
  let reshaped = false;
  if (old && old.parent !== n.parent) {
    const set = kids.get(old.parent);
    if (set) set.delete(n.id);
    reshaped = true;
  }
  if (n.parent) {
    let set = kids.get(n.parent);
    if (!set) kids.set(n.parent, (set = new Set()));
    set.add(n.id);
  }
  if (!old && kids.has(n.id) && kids.get(n.id).size) reshaped = true;
  return reshaped;
}

function childrenOf(id) {
  const set = kids.get(id);
  if (!set) return [];
  const out = [];
  for (const k of set) {
    const n = nodes.get(k);
    if (n) out.push(n);
  }
  return out.sort(byStart);
}

// A row's fixed part, cloned for each row (cheaper than building it).
const rowTemplate = (() => {
  const row = el("div", "row");
  row.appendChild(el("span", "dot"));
  row.appendChild(el("span", "id"));
  return row;
})();

function renderRow(n) {
  const row = rowTemplate.cloneNode(true);
  if (n.id === selected) row.className = "row selected";
  row.setAttribute("data-id", n.id);
  row.setAttribute("data-state", n.state || "");
  row.title = n.label ? n.label + "\n" + n.id : n.id;
  row.firstChild.className = "dot " + dotClass(n);
  row.lastChild.textContent = n.root ? "root " + shortId(n.id) : shortId(n.id);
  if (n.label) row.appendChild(el("span", "nlabel", n.label));
  if (pausedBy.has(n.id)) {
    row.dataset.paused = "1";
    const p = el("span", "badge state-paused", "paused");
    p.title = "paused at its budget's cap: raise its budget in the panel above (or brood budget " + n.id + " --raise tokens=+N)";
    row.appendChild(p);
  }
  const asks = pendingBy.get(n.id);
  if (asks) {
    row.dataset.requests = String(asks);
    const b = el("span", "badge request-pending", asks === 1 ? "awaits an answer" : asks + " requests await answers");
    b.title = "a pending request for approval or a question: answer it in the panel above";
    row.appendChild(b);
  }
  if (n.provider) row.appendChild(el("span", "badge provider", n.provider));
  if (n.mode === "continuable") row.appendChild(el("span", "badge", "continuable" + (n.epochs > 1 ? " ×" + n.epochs : "")));
  if (n.state === "running" || n.state === "idle") row.appendChild(el("span", "badge state-" + n.state, n.state));
  if (n.stopReason && n.state !== "running") {
    const r = el("span", "badge reason-" + n.stopReason, n.stopReason + (n.errorCode ? " " + n.errorCode : ""));
    r.dataset.stopReason = n.stopReason;
    row.appendChild(r);
  }
  if (n.usage) {
    const u = el("span", "badge usage", usageBadge(n.usage));
    u.title = usageTitle(n.usage);
    u.dataset.tokens = String(n.usage.subtree.inputTokens + n.usage.subtree.outputTokens);
    row.appendChild(u);
  }
  const d = el("span", "dur", nodeDuration(n));
  d.setAttribute("data-duration-of", n.id);
  row.appendChild(d);
  return row;
}

// Usage (docs/protocol.md §6.6): a node's own and subtree tokens; "+?"
// marks a lower bound (some requests' tokens were not reported).
function usageTokens(u) {
  return String(u.inputTokens + u.outputTokens) + (u.unreportedRequests ? "+?" : "");
}

function usageBadge(usage) {
  const own = usageTokens(usage.own), tree = usageTokens(usage.subtree);
  return own === tree ? own + " tok" : own + " tok (tree " + tree + ")";
}

function usageTitle(usage) {
  const line = (name, u) => name + ": " + u.inputTokens + " in + " + u.outputTokens + " out tokens, " +
    u.modelRequests + " model requests" + (u.unreportedRequests ? " (" + u.unreportedRequests + " unreported)" : "") +
    ", " + u.toolCalls + " tool calls, " + (u.wallMs / 1000).toFixed(1) + "s";
  return line("own", usage.own) + "\n" + line("subtree", usage.subtree);
}

function renderItem(n, depth) {
  const li = document.createElement("li");
  li.setAttribute("data-node", n.id);
  li.appendChild(renderRow(n));
  items.set(n.id, li);
  const ks = depth < 64 ? childrenOf(n.id) : [];
  if (ks.length) {
    const ul = el("ul", "children");
    for (const k of ks) ul.appendChild(renderItem(k, depth + 1));
    li.appendChild(ul);
  }
  return li;
}

function renderTree() {
  const t0 = performance.now();
  const nav = document.getElementById("tree");
  const roots = [];
  for (const n of nodes.values()) if (isRoot(n)) roots.push(n);
  roots.sort((a, b) => byStart(b, a)); // newest first
  items.clear();
  nav.replaceChildren();
  if (!roots.length) {
    nav.appendChild(el("div", "empty", 'No delegations yet. Run brood run --provider spawn "say hi".'));
  } else {
    const ul = el("ul", "roots");
    ul.id = "roots";
    for (const r of roots) ul.appendChild(renderItem(r, 0));
    nav.appendChild(ul);
  }
  summarize();
  refreshChildLinks();
  perf.build = performance.now() - t0;
  void nav.offsetHeight; // lay it out within the measurement
  perf.tree = performance.now() - t0;
  perf.layout = perf.tree - perf.build;
  perf.nodes = nodes.size;
}

function summarize() {
  document.getElementById("summary").textContent = nodes.size + " sessions, " + running.size + " running";
}

// insertSorted puts li into ul among its siblings in order (newest first
// for roots, oldest first for children); new nodes are usually the newest,
// so the scan starts at the end that takes them.
function insertSorted(ul, li, n, newestFirst) {
  const after = (other) => {
    const o = nodes.get(other.dataset.node);
    if (!o) return false;
    return newestFirst ? byStart(o, n) > 0 : byStart(o, n) < 0;
  };
  if (newestFirst) {
    let c = ul.firstElementChild;
    while (c && after(c)) c = c.nextElementSibling;
    ul.insertBefore(li, c);
  } else {
    let c = ul.lastElementChild;
    while (c && !after(c)) c = c.previousElementSibling;
    ul.insertBefore(li, c ? c.nextElementSibling : ul.firstElementChild);
  }
}

// place renders a node that has no item yet under its parent's item (or
// among the roots); false when its parent has no item yet.
function place(n) {
  let ul;
  if (isRoot(n)) {
    ul = document.getElementById("roots");
    if (!ul) return false;
  } else {
    const p = items.get(n.parent);
    if (!p) return false;
    ul = p.querySelector(":scope > ul.children");
    if (!ul) p.appendChild((ul = el("ul", "children")));
  }
  insertSorted(ul, renderItem(n, 0), n, isRoot(n));
  return true;
}

// update applies changed nodes in place: a changed row is replaced, a new
// node is inserted under its parent; anything that reshapes the tree
// renders it whole.
function update(changed) {
  const t0 = performance.now();
  let whole = !document.getElementById("roots");
  for (const n of changed) if (put(n)) whole = true;
  if (whole) {
    renderTree();
    perf.update = perf.tree;
    return;
  }
  let pending = [];
  for (const n of changed) {
    const li = items.get(n.id);
    if (li) li.replaceChild(renderRow(nodes.get(n.id)), li.firstElementChild);
    else pending.push(nodes.get(n.id));
  }
  // New nodes whose parents are new too wait for them.
  while (pending.length) {
    const left = pending.filter((n) => !place(n));
    if (left.length === pending.length) {
      renderTree();
      perf.update = perf.tree;
      return;
    }
    pending = left;
  }
  for (const n of changed) if (pendingBy.has(n.id)) refreshRequestLabels(n.id);
  summarize();
  refreshChildLinks();
  void document.getElementById("tree").offsetHeight;
  perf.update = performance.now() - t0;
}

function connectTree() {
  const es = new EventSource("/api/tree");
  es.addEventListener("tree", (e) => {
    const t0 = performance.now();
    nodes.clear();
    kids.clear();
    running.clear();
    const all = JSON.parse(e.data);
    perf.parse = performance.now() - t0;
    for (const n of all) put(n);
    perf.index = performance.now() - t0 - perf.parse;
    setStatus("live", "live");
    renderTree();
    perf.tree = performance.now() - t0; // parse, index, render, layout
    runSearch();
  });
  es.addEventListener("nodes", (e) => {
    const t0 = performance.now();
    update(JSON.parse(e.data));
    perf.update = performance.now() - t0;
    if (searchBox && searchBox.value) runSearch();
  });
  es.addEventListener("requests", (e) => updateRequests(JSON.parse(e.data).requests || []));
  es.onerror = () => setStatus("reconnecting", "down"); // EventSource retries by itself
}

// One click handler for every row.
document.getElementById("tree").addEventListener("click", (e) => {
  const row = e.target.closest(".row");
  if (row) location.hash = "#/s/" + encodeURIComponent(row.dataset.id);
});

// ---- search by label or id ----

const searchBox = document.getElementById("search");
const searchResults = document.getElementById("search-results");
const searchShown = 50;

function runSearch() {
  if (!searchBox) return;
  const t0 = performance.now();
  const q = searchBox.value.trim().toLowerCase();
  searchResults.replaceChildren();
  if (!q) {
    searchResults.hidden = true;
    perf.search = performance.now() - t0;
    return;
  }
  const hits = [];
  let count = 0;
  for (const n of nodes.values()) {
    if (n.key.includes(q)) {
      count++;
      if (hits.length < searchShown) hits.push(n);
    }
  }
  hits.sort((a, b) => byStart(b, a));
  for (const n of hits) {
    const li = el("li", "hit");
    li.dataset.id = n.id;
    li.appendChild(el("span", "dot " + dotClass(n)));
    li.appendChild(el("span", "id", shortId(n.id)));
    if (n.label) li.appendChild(el("span", "nlabel", n.label));
    li.title = n.id;
    searchResults.appendChild(li);
  }
  const more = count > hits.length ? " (first " + hits.length + " shown)" : "";
  const head = el("li", "hits", count + (count === 1 ? " match" : " matches") + more);
  searchResults.insertBefore(head, searchResults.firstChild);
  searchResults.hidden = false;
  perf.search = performance.now() - t0;
}

let searchTimer = 0;
if (searchBox) {
  searchBox.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(runSearch, 60);
  });
  searchResults.addEventListener("click", (e) => {
    const hit = e.target.closest("li.hit");
    if (!hit) return;
    location.hash = "#/s/" + encodeURIComponent(hit.dataset.id);
    const li = items.get(hit.dataset.id);
    if (li) li.scrollIntoView({ block: "center" });
  });
}

// Running durations tick once a second (only the running rows).
setInterval(() => {
  for (const id of running) {
    const li = items.get(id);
    const d = li && li.firstElementChild.querySelector("[data-duration-of]");
    if (d) d.textContent = nodeDuration(nodes.get(id));
  }
  if (view && running.has(view.id)) refreshChildLinks();
  for (const d of document.querySelectorAll("#requests-list .deadline")) d.textContent = deadlineText(Number(d.dataset.deadline));
}, 1000);

// ---- the providers' models ----

let providerModels = new Map(); // provider name -> "adapter/id, …"

async function loadProviders() {
  try {
    const r = await fetch("/api/providers");
    if (!r.ok) return;
    const body = await r.json();
    const m = new Map();
    for (const d of body.providers || []) {
      if (d.models && d.models.length) m.set(d.name, d.models.map((x) => x.adapter + "/" + x.id).join(", "));
    }
    providerModels = m;
    refreshChildLinks();
  } catch (_) {
    // the next load tries again
  }
}

// ---- interrupt and dispose (with the view's grant, as the CLI's) ----

async function act(what, id) {
  const out = document.getElementById("action-result");
  if (out) { out.textContent = what + " " + shortId(id) + " …"; out.dataset.result = "pending"; }
  let text, ok = false;
  try {
    const r = await fetch("/api/sessions/" + encodeURIComponent(id) + "/" + what, { method: "POST", headers: { "X-Brood-Action": "1" } });
    const body = await r.json().catch(() => ({}));
    ok = r.ok;
    if (!r.ok) text = what + " failed: " + (body.code ? body.code + ": " + body.message : r.status);
    else if (what === "interrupt") text = body.interrupted ? "interrupted its turn" : "nothing to interrupt: no live activation";
    else if (body.result) text = "disposed: the run settled " + body.result.stopReason;
    else if (body.disposed) text = body.disposed.length ? "disposed " + body.disposed.length + " activation(s), child first" : "nothing to dispose: no live activation";
    else text = "dispose answered: the run is " + (body.state || "unknown");
  } catch (err) {
    text = what + " failed: " + err;
  }
  const now = document.getElementById("action-result");
  if (now && view && view.id === id) { now.textContent = text; now.dataset.result = ok ? "ok" : "error"; }
}

// ---- pending requests: approvals and questions (docs/protocol.md §5.21) ----
//
// The list comes with the tree stream ("requests", whenever it changes);
// answers go through POST /api/requests/ID/answer, which asks the
// coordinator (requests.answer) with the view's grant: the coordinator
// decides, and its error code is shown on the card.

const reqCards = new Map(); // request id -> its card (kept while pending, so typing survives updates)
let reqListed = new Set(); // the ids of the last list

function deadlineText(ms) {
  const left = ms - Date.now();
  const at = new Date(ms).toLocaleTimeString();
  return left > 0 ? "deadline " + at + " (in " + duration(Math.floor(left / 1000) * 1000) + ")" : "deadline " + at + " (passed)";
}

function sessionName(id) {
  const n = nodes.get(id);
  return n && n.label ? n.label : shortId(id);
}

function refreshRequestLabels(id) {
  for (const a of document.querySelectorAll('#requests-list a.request-session[data-session="' + CSS.escape(id) + '"]')) a.textContent = sessionName(id);
}

function updateRequests(list) {
  // Mark the rows whose count of pending requests changed (only those).
  const counts = new Map();
  for (const r of list) counts.set(r.sessionId, (counts.get(r.sessionId) || 0) + 1);
  const touched = new Set();
  // A pending budget request is a turn paused at its budget's cap (§5.5
  // "Pause and raise"): its row says paused.
  const paused = new Set(list.filter((r) => r.kind === "budget").map((r) => r.sessionId));
  for (const id of paused) if (!pausedBy.has(id)) touched.add(id);
  for (const id of pausedBy) if (!paused.has(id)) touched.add(id);
  pausedBy.clear();
  for (const id of paused) pausedBy.add(id);
  for (const [id, k] of counts) if (pendingBy.get(id) !== k) touched.add(id);
  for (const id of pendingBy.keys()) if (!counts.has(id)) touched.add(id);
  pendingBy.clear();
  for (const [id, k] of counts) pendingBy.set(id, k);
  for (const id of touched) {
    const li = items.get(id);
    const n = nodes.get(id);
    if (li && n) li.replaceChild(renderRow(n), li.firstElementChild);
  }
  // The panel: cards of requests no longer pending go (unless this page
  // just answered them: their outcome stays a moment), new ones come in
  // the list's order (oldest first).
  const box = document.getElementById("requests-list");
  const ids = new Set(list.map((r) => r.id));
  reqListed = ids;
  for (const [id, card] of reqCards) {
    if (ids.has(id) || card.dataset.keep) continue;
    card.remove();
    reqCards.delete(id);
  }
  let at = box.firstElementChild;
  for (const r of list) {
    let card = reqCards.get(r.id);
    if (!card) reqCards.set(r.id, (card = renderRequest(r)));
    if (card === at) { at = at.nextElementSibling; continue; }
    box.insertBefore(card, at);
  }
  requestsCount(list.length);
}

function requestsCount(pending) {
  document.getElementById("requests-count").textContent = "(" + pending + ")";
  document.getElementById("requests").hidden = reqCards.size === 0;
}

function renderRequest(r) {
  const card = el("div", "request");
  card.dataset.requestId = r.id;
  card.dataset.session = r.sessionId;
  card.dataset.kind = r.kind;
  const head = el("div", "rhead");
  head.appendChild(el("span", "badge", r.kind === "question" ? "question" : r.kind === "budget" ? "budget" : "approval"));
  const who = link(r.sessionId, sessionName(r.sessionId));
  who.classList.add("request-session");
  who.title = r.sessionId;
  head.appendChild(who);
  head.appendChild(el("span", "mono rtool", r.kind === "question" ? "ask" : r.kind === "budget" ? "paused at its cap" : r.tool));
  // Who it waits on (§5.21 handler): the ancestor agent told of it, else
  // the user; passedBy, when it was passed up, in the title.
  const handler = el("span", "rhandler", r.handler ? "waits on " + sessionName(r.handler) : "waits on you");
  const passed = r.passedBy && r.passedBy.length ? "passed up by " + r.passedBy.join(", ") : "";
  handler.title = [r.handler || "", passed].filter(Boolean).join("; ");
  head.appendChild(handler);
  const dl = el("span", "deadline", deadlineText(r.deadline));
  dl.dataset.deadline = String(r.deadline);
  head.appendChild(dl);
  card.appendChild(head);
  const bar = el("div", "ractions");
  const result = el("div", "rresult");
  const send = (body) => answerRequest(r, card, body);
  if (r.kind === "question") {
    card.appendChild(el("div", "question", r.question));
    if (r.choices && r.choices.length) {
      for (const c of r.choices) {
        const b = el("button", "choice", c);
        b.addEventListener("click", () => send({ answer: "answer", text: c }));
        bar.appendChild(b);
      }
    } else if (r.answerSchema) {
      const sch = el("details", "schema");
      sch.appendChild(el("summary", "label", "the answer is JSON this schema accepts"));
      sch.appendChild(el("pre", "", pretty(r.answerSchema)));
      card.appendChild(sch);
      const ta = el("textarea", "answer-json");
      ta.placeholder = "JSON";
      card.appendChild(ta);
      const b = el("button", "answer", "Answer");
      b.addEventListener("click", () => send({ answer: "answer", json: ta.value }));
      bar.appendChild(b);
    } else {
      const inp = el("input", "answer-text");
      inp.placeholder = "your answer";
      const asJSON = el("input", "as-json");
      asJSON.type = "checkbox";
      const lab = el("label", "label", " JSON");
      lab.insertBefore(asJSON, lab.firstChild);
      const b = el("button", "answer", "Answer");
      b.addEventListener("click", () => send(asJSON.checked ? { answer: "answer", json: inp.value } : { answer: "answer", text: inp.value }));
      inp.addEventListener("keydown", (e) => { if (e.key === "Enter") b.click(); });
      bar.appendChild(inp);
      bar.appendChild(lab);
      bar.appendChild(b);
    }
  } else if (r.kind === "budget") {
    card.appendChild(el("div", "question", r.exhausted || "its budget is spent"));
    const lim = el("select", "raise-limit");
    for (const k of ["tokens", "modelRequests", "toolCalls", "children"]) lim.appendChild(el("option", "", k));
    const amt = el("input", "raise-amount");
    amt.placeholder = "amount to add";
    const up = el("button", "raise", "Raise");
    up.title = "raise the child's own budget by the amount; its paused turn goes on within about 2 s (as brood budget ID --raise)";
    up.addEventListener("click", () => raiseBudget(r, card, { [lim.value]: Number(amt.value) }));
    const no = el("button", "deny", "End the turn");
    no.title = "deny: the turn ends BUDGET_EXHAUSTED (as brood deny)";
    no.addEventListener("click", () => send({ answer: "deny" }));
    bar.appendChild(lim);
    bar.appendChild(amt);
    bar.appendChild(up);
    bar.appendChild(no);
  } else {
    card.appendChild(el("pre", "args", pretty(r.arguments || "")));
    const ok = el("button", "approve", "Approve");
    ok.title = "the call runs and the child's turn goes on (as brood approve)";
    ok.addEventListener("click", () => send({ answer: "approve" }));
    const reason = el("input", "reason");
    reason.placeholder = "reason for a denial (optional)";
    const no = el("button", "deny", "Deny");
    no.title = "the call gets the denial and the reason as its result (as brood deny)";
    no.addEventListener("click", () => send(reason.value ? { answer: "deny", reason: reason.value } : { answer: "deny" }));
    bar.appendChild(ok);
    bar.appendChild(no);
    bar.appendChild(reason);
  }
  card.appendChild(bar);
  card.appendChild(result);
  return card;
}

function answerText(rec) {
  const a = rec.answer || {};
  switch (rec.state) {
    case "answered": return "answered: " + (a.json !== undefined && a.json !== "" ? a.json : a.text);
    case "denied": return "denied" + (a.reason ? ": " + a.reason : "");
    default: return rec.state;
  }
}

function answerRequest(r, card, body) {
  return postDecision(r, card, "/api/requests/" + encodeURIComponent(r.id) + "/answer", body, body.answer, answerText);
}

// raiseBudget raises the paused child's own budget (POST
// /api/sessions/{id}/budget/raise: budget.raise with the page's grant,
// as brood budget ID --raise); the raise answers the request.
function raiseBudget(r, card, raise) {
  return postDecision(r, card, "/api/sessions/" + encodeURIComponent(r.sessionId) + "/budget/raise", raise, "raise",
    (rb) => "raised: " + Object.entries(raise).map(([k, v]) => k + " +" + v).join(", ") + raisedPauses(rb.resumed));
}

// raisedPauses says what a raise did to the paused turns it answered
// (budget.raise's resumed, the request ids): each goes on when it next
// looks for its answer, within about 2 s, and shows paused until then (as
// brood budget --raise says).
function raisedPauses(resumed) {
  const n = (resumed || []).length;
  if (!n) return "";
  return "; answered the budget pause of " + n + (n === 1 ? " turn" : " turns") +
    ": " + (n === 1 ? "it goes" : "each goes") + " on within about 2 s (until then it shows paused)";
}

// postDecision posts body to url for request r's card, shows what the
// coordinator said (okText of its reply, or its refusal's code), and
// removes the card a moment after a decision.
async function postDecision(r, card, url, body, verb, okText) {
  const out = card.querySelector(".rresult");
  const buttons = card.querySelectorAll("button");
  for (const b of buttons) b.disabled = true;
  out.textContent = verb + " …";
  out.dataset.result = "pending";
  delete out.dataset.code;
  let ok = false, code = "", text;
  card.dataset.keep = "1"; // an answer in flight: the card stays when the list drops it
  try {
    const resp = await fetch(url, {
      method: "POST", headers: { "X-Brood-Action": "1", "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const rb = await resp.json().catch(() => ({}));
    ok = resp.ok;
    if (ok) text = okText(rb);
    else { code = rb.code || String(resp.status); text = code + ": " + (rb.message || resp.statusText); }
  } catch (err) {
    text = "failed: " + err;
  }
  out.textContent = text;
  out.dataset.result = ok ? "ok" : "error";
  if (code) out.dataset.code = code;
  if (ok || code === "ALREADY_ANSWERED") {
    // Decided: the card shows the outcome a moment, then goes.
    card.classList.add("decided");
    setTimeout(() => {
      delete card.dataset.keep;
      if (!card.isConnected) return;
      card.remove();
      reqCards.delete(r.id);
      requestsCount(reqListed.size);
    }, 5000);
    return;
  }
  delete card.dataset.keep;
  if (!reqListed.has(r.id)) { // decided meanwhile: the outcome stays a moment
    setTimeout(() => { if (!card.dataset.keep && !reqListed.has(r.id)) { card.remove(); reqCards.delete(r.id); requestsCount(reqListed.size); } }, 5000);
    return;
  }
  for (const b of buttons) b.disabled = false; // the request is still pending: try again
}

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
  const label = el("span", "", "");
  label.id = "session-label";
  add("label", label);
  if (h.parentSession) {
    const mod = el("span", "mono", "");
    mod.id = "session-model";
    mod.title = "the model its provider's workers answer with (adapter/id)";
    add("model", mod);
  }
  const run = el("span", "", "");
  run.id = "session-run";
  add("run", run);
  add("depth", h.delegationDepth || 0);
  if (h.cwd) add("cwd", h.cwd);
  if (h.createdAt) add("created", new Date(h.createdAt).toLocaleString());
  if (h.seedLength) add("inherited", h.seedLength + " events of its parent's log");
  sec.appendChild(meta);
  if (h.parentSession) {
    const bar = el("div", "actions");
    const intr = el("button", "", "Interrupt");
    intr.id = "action-interrupt";
    intr.title = "stop the turn running now (continuable children; as brood interrupt)";
    intr.addEventListener("click", () => act("interrupt", h.id));
    const disp = el("button", "", "Dispose");
    disp.id = "action-dispose";
    disp.title = "end the run, or the activation and its subtree's (as brood dispose)";
    // Two clicks: the first arms the button for a few seconds.
    disp.addEventListener("click", () => {
      if (disp.dataset.armed) { delete disp.dataset.armed; disp.textContent = "Dispose"; act("dispose", h.id); return; }
      disp.dataset.armed = "1";
      disp.textContent = "Confirm dispose";
      setTimeout(() => { if (disp.dataset.armed) { delete disp.dataset.armed; disp.textContent = "Dispose"; } }, 5000);
    });
    bar.appendChild(intr);
    bar.appendChild(disp);
    const res = el("span", "note");
    res.id = "action-result";
    bar.appendChild(res);
    sec.appendChild(bar);
  }
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
    case "request/open":
      node = el("div", "note request-event", (d.kind === "question" ? "asks a question" : d.kind === "budget" ? "paused at its budget's cap" : "asks for approval of " + (d.tool || "a call")) +
        " · request " + d.requestId + " · deadline " + new Date(d.deadline).toLocaleTimeString());
      break;
    case "request/answer": {
      const by = d.by || {};
      const who = by.kind === "timeout" ? "the timeout" : by.kind === "agent" ? "ancestor " + shortId(by.sessionId || "") : "the user" + (by.user ? " " + by.user : "");
      node = el("div", "note request-event", "request " + d.requestId + " " + answerText({ state: d.state, answer: d }) + " (by " + who + ")");
      break;
    }
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
      [n.provider, n.mode, n.state, n.stopReason, n.errorCode, nodeDuration(n), n.usage ? usageBadge(n.usage) : ""].filter(Boolean).join(" · ");
    run.dataset.state = n ? n.state : "";
    const mod = document.getElementById("session-model");
    if (mod) mod.textContent = (n && providerModels.get(n.provider)) || "—";
    const label = document.getElementById("session-label");
    if (label) label.textContent = (n && n.label) || "—";
    const intr = document.getElementById("action-interrupt");
    if (intr) intr.disabled = !n || n.mode !== "continuable" || n.state !== "running";
    const disp = document.getElementById("action-dispose");
    if (disp) disp.disabled = !n || n.root || (n.mode !== "continuable" && n.state !== "running");
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
loadProviders();
setInterval(loadProviders, 30000);
connectTree();
route();
