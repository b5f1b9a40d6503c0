// Context Mode design notes: a Figma plugin (the original design's section 3.3, scenario 3).
// Pushes the text of the selected text layers (each with its frame's name) to the Context Mode Service as
// units of a configurable type (design_note by default: the server needs CONTEXT_EXTRA_TYPES=design_note),
// and shows per layer what happened: pushed, already there, or rejected and why.
// Runs in Figma's plugin sandbox; ui.html is its window. clients/figma/test/ runs it in node with a stand-in
// `figma` global (Figma itself cannot run in CI).

const DEFAULTS = { url: "http://localhost:5000", apiKey: "", type: "design_note", source: "figma_plugin_v1.2" };
const SETTINGS_KEY = "context-mode-settings";
const PUSHED_KEY = "context-mode-pushed";      // layer + text -> timestamp of its first push (re-push = duplicate)
const MAX_REMEMBERED = 5000;
const BATCH = 500;
const FRAME_TYPES = ["FRAME", "COMPONENT", "COMPONENT_SET", "INSTANCE", "SECTION"];   // a group is not a frame

async function loadSettings() {
  const saved = await figma.clientStorage.getAsync(SETTINGS_KEY);
  return Object.assign({}, DEFAULTS, saved || {});
}

function checkSettings(s) {
  const problems = [];
  if (!/^https?:\/\/[^\s/]+/.test(String(s.url || ""))) problems.push("The server URL must start with http:// or https://");
  if (!/^[A-Za-z0-9_.-]{1,64}$/.test(String(s.type || ""))) problems.push("The unit type must be a name like design_note");
  if (!String(s.source || "").trim() || String(s.source).length > 200) problems.push("The source must be 1-200 characters");
  // The service serves a plugin's window (Origin null) only with keys, and then only the push route.
  if (!String(s.apiKey || "").trim()) problems.push("The API key is required (a key with the push scope)");
  return problems;
}

function frameOf(node) {
  for (let n = node.parent; n; n = n.parent) {
    if (FRAME_TYPES.indexOf(n.type) >= 0) return n;
  }
  return null;
}

// The text layers in the selection: selected text layers, and the text layers inside selected frames.
function textLayers(selection) {
  const seen = {};
  const out = [];
  const add = (n) => { if (!seen[n.id]) { seen[n.id] = true; out.push(n); } };
  for (const node of selection) {
    if (node.type === "TEXT") add(node);
    else if (typeof node.findAllWithCriteria === "function") node.findAllWithCriteria({ types: ["TEXT"] }).forEach(add);
  }
  return out;
}

// FNV-1a: a short, stable key for a layer's text (a collision only reuses a timestamp; the CID still differs).
function fnv1a(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16);
}

async function postUnits(settings, units) {
  const headers = { "Content-Type": "application/json" };
  if (settings.apiKey) headers.Authorization = "Bearer " + settings.apiKey;
  let rv;
  try {
    rv = await fetch(settings.url.replace(/\/+$/, "") + "/mcp/push", { method: "POST", headers, body: JSON.stringify({ units }) });
  } catch (e) {
    throw new Error("cannot reach " + settings.url + ": " + (e && e.message ? e.message : e));
  }
  let body = null;
  try { body = await rv.json(); } catch (e) { body = null; }
  if (!rv.ok) {
    const why = body && body.error ? body.error + " (" + body.code + ")" : "HTTP " + rv.status;
    throw new Error("the server refused the push: HTTP " + rv.status + " " + why);
  }
  if (!body || !Array.isArray(body.results)) throw new Error("the server's answer is not a push result");
  return body.results;
}

async function pushSelection() {
  const settings = await loadSettings();
  const problems = checkSettings(settings);
  const layers = textLayers(figma.currentPage.selection);
  if (problems.length || !layers.length) {
    const message = problems.length ? problems.join("; ") : "Select text layers, or frames that hold text, first.";
    figma.ui.postMessage({ type: "results", items: [], summary: message });
    figma.notify(message);
    return;
  }
  const remembered = (await figma.clientStorage.getAsync(PUSHED_KEY)) || {};
  const now = Math.floor(Date.now() / 1000);
  const items = [];
  const pending = [];
  for (const layer of layers) {
    const frame = frameOf(layer);
    const item = { node: layer.id, layer: layer.name, frame: frame ? frame.name : null, status: "", reason: "", cid: null };
    items.push(item);
    const text = String(layer.characters || "");
    if (!text.trim()) {
      item.status = "rejected";
      item.reason = "the layer has no text";
      continue;
    }
    const key = layer.id + ":" + fnv1a(text);
    const metadata = { frame: item.frame, layer: layer.name, node_id: layer.id, page: figma.currentPage.name,
                       file: figma.root ? figma.root.name : undefined, file_key: figma.fileKey || undefined };
    const unit = { type: settings.type, source: settings.source, timestamp: remembered[key] || now, content: text, metadata };
    pending.push({ item, key, unit });
  }
  for (let i = 0; i < pending.length; i += BATCH) {
    const batch = pending.slice(i, i + BATCH);
    let results;
    try {
      results = await postUnits(settings, batch.map((p) => p.unit));
    } catch (e) {
      for (const p of batch) { p.item.status = "rejected"; p.item.reason = e.message; }
      continue;
    }
    for (const r of results) {
      const p = batch[r.index];
      if (r.status === "ok" || r.status === "duplicate") {
        p.item.status = r.status === "ok" ? "pushed" : "already there";
        p.item.cid = r.cid;
        remembered[p.key] = p.unit.timestamp;
      } else {
        p.item.status = "rejected";
        p.item.reason = (r.error || "rejected") + (r.code ? " (" + r.code + ")" : "");
      }
    }
  }
  const keys = Object.keys(remembered);
  for (const k of keys.slice(0, Math.max(0, keys.length - MAX_REMEMBERED))) delete remembered[k];
  await figma.clientStorage.setAsync(PUSHED_KEY, remembered);
  const count = (s) => items.filter((it) => it.status === s).length;
  const summary = count("pushed") + " pushed, " + count("already there") + " already there, " + count("rejected") + " rejected";
  figma.ui.postMessage({ type: "results", items, summary });
  figma.notify(summary);
}

async function saveSettings(input) {
  const settings = Object.assign({}, DEFAULTS, input || {});
  const problems = checkSettings(settings);
  if (problems.length) {
    figma.ui.postMessage({ type: "settings-error", problems });
    return;
  }
  await figma.clientStorage.setAsync(SETTINGS_KEY, settings);
  figma.ui.postMessage({ type: "settings", settings });
}

figma.showUI(__html__, { width: 380, height: 520, themeColors: true });
figma.ui.onmessage = async (msg) => {
  try {
    if (msg && msg.type === "push") return await pushSelection();
    if (msg && msg.type === "save-settings") return await saveSettings(msg.settings);
    if (msg && msg.type === "close") return figma.closePlugin();
  } catch (e) {
    figma.ui.postMessage({ type: "results", items: [], summary: "Error: " + (e && e.message ? e.message : e) });
  }
};
loadSettings().then((settings) => figma.ui.postMessage({ type: "settings", settings }));
