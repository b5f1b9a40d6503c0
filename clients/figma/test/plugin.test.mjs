// node --test clients/figma/test/  with CONTEXT_URL and CONTEXT_API_KEY (push and search scopes) of a running
// service with keys that allows the design_note type (CONTEXT_EXTRA_TYPES=design_note); tests/test_figma_plugin.py
// starts that gunicorn.
// Figma cannot run here: code.js runs in a node vm with a stand-in `figma` global that records what the
// plugin asked of it (UI messages, notifications, clientStorage), while its fetch reaches the real service.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import vm from "node:vm";

const URL_ = process.env.CONTEXT_URL;
const KEY = process.env.CONTEXT_API_KEY;
// A key is needed: the plugin refuses to save settings without one, and a wrong key must be told from a good one.
const live = { skip: URL_ && KEY ? false : "set CONTEXT_URL and CONTEXT_API_KEY (push and search scopes) of a running "
  + "Context Mode Service started with keys" };
const CODE = readFileSync(new URL("../code.js", import.meta.url), "utf8");

function text(id, name, characters) {
  return { id, name, type: "TEXT", characters, parent: null };
}

function container(type, id, name, children) {
  const node = { id, name, type, children, parent: null };
  for (const c of children) c.parent = node;
  node.findAllWithCriteria = ({ types }) => {
    const out = [];
    const walk = (n) => { for (const c of n.children || []) { if (types.includes(c.type)) out.push(c); walk(c); } };
    walk(node);
    return out;
  };
  return node;
}

// A fresh plugin run: the stand-in figma global, code.js evaluated against it, the storage it keeps.
function startPlugin(selection, storage = new Map()) {
  const calls = { posted: [], notified: [], showUI: [], closed: false, storage };
  const figma = {
    showUI: (html, options) => calls.showUI.push({ html, options }),
    ui: { postMessage: (msg) => calls.posted.push(structuredClone(msg)), onmessage: null },
    clientStorage: {
      getAsync: async (key) => structuredClone(storage.get(key)),
      setAsync: async (key, value) => { storage.set(key, structuredClone(value)); },
    },
    notify: (message) => calls.notified.push(message),
    currentPage: { name: "Checkout flow", selection },
    root: { name: "Shop redesign" },
    fileKey: "FILEKEY123",
    closePlugin: () => { calls.closed = true; },
  };
  vm.runInNewContext(CODE, { figma, fetch, __html__: "<ui>", console, structuredClone });
  const send = (msg) => figma.ui.onmessage(msg);
  const last = (type) => calls.posted.filter((m) => m.type === type).at(-1);
  return { figma, calls, send, last };
}

const settings = (extra = {}) => ({ url: URL_, apiKey: KEY, type: "design_note", source: "figma_plugin_v1.2", ...extra });

async function search(query) {
  const rv = await fetch(URL_ + "/mcp/search", {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + KEY },
    body: JSON.stringify({ query, consistency: "strong", types: ["design_note"] }),
  });
  assert.equal(rv.status, 200);
  return (await rv.json()).results;
}

test("pushes the selected text with its frame's name and reports each layer", live, async () => {
  const tag = `FIGMA${Date.now()}`;
  const button = text("1:2", "CTA label", `${tag} 按钮文案: 立即支付 (primary, 48px high)`);
  const hint = text("1:3", "Hint", `${tag} the total includes VAT; show it under the button`);
  const empty = text("1:4", "Spacer text", "   ");
  const frame = container("FRAME", "1:1", "Checkout / Pay", [button, container("GROUP", "1:5", "Row", [hint]), empty]);
  const loose = text("2:1", "Sticky", `${tag} loose note outside any frame`);
  const plugin = startPlugin([frame, loose, button]);          // the button twice: once in the frame, once selected
  assert.equal(plugin.calls.showUI.length, 1);
  await plugin.send({ type: "save-settings", settings: settings() });
  await plugin.send({ type: "push" });

  const { items, summary } = plugin.last("results");
  assert.equal(summary, "3 pushed, 0 already there, 1 rejected");
  assert.deepEqual(items.map((i) => [i.layer, i.frame, i.status]), [   // the frame's text in order, each layer once
    ["CTA label", "Checkout / Pay", "pushed"], ["Hint", "Checkout / Pay", "pushed"],
    ["Spacer text", "Checkout / Pay", "rejected"], ["Sticky", null, "pushed"]]);
  assert.equal(items.find((i) => i.layer === "Spacer text").reason, "the layer has no text");
  assert.deepEqual(plugin.calls.notified, [summary]);

  const found = await search(tag);
  assert.equal(found.length, 3);
  const stored = found.find((r) => r.content.includes("立即支付"));
  assert.equal(stored.type, "design_note");
  assert.equal(stored.source, "figma_plugin_v1.2");
  assert.equal(stored.cid, items.find((i) => i.layer === "CTA label").cid);
  assert.deepEqual([stored.metadata.frame, stored.metadata.layer, stored.metadata.node_id, stored.metadata.page,
                    stored.metadata.file], ["Checkout / Pay", "CTA label", "1:2", "Checkout flow", "Shop redesign"]);

  // The same text again (a new plugin run, the same clientStorage): already there; an edited layer: pushed.
  hint.characters = `${tag} the total includes VAT and shipping`;
  const again = startPlugin([frame], plugin.calls.storage);
  await new Promise((r) => setTimeout(r, 10));                 // the start-up settings message is posted async
  assert.equal(again.last("settings").settings.url, URL_);     // settings came back from clientStorage
  await again.send({ type: "push" });
  const second = again.last("results");
  assert.equal(second.summary, "1 pushed, 1 already there, 1 rejected");
  assert.equal(second.items.find((i) => i.layer === "CTA label").status, "already there");
  assert.equal(second.items.find((i) => i.layer === "Hint").status, "pushed");
  assert.equal((await search(tag)).length, 4);
});

test("a type the server does not allow, a wrong key and an unreachable server are rejected with the reason", live, async () => {
  const layer = text("3:1", "Note", `FIGMAREJECT${Date.now()} a note`);
  const plugin = startPlugin([container("FRAME", "3:0", "Specs", [layer])]);
  await plugin.send({ type: "save-settings", settings: settings({ type: "not_a_type" }) });
  await plugin.send({ type: "push" });
  let [item] = plugin.last("results").items;
  assert.equal(item.status, "rejected");
  assert.match(item.reason, /invalid_type/);

  await plugin.send({ type: "save-settings", settings: settings({ apiKey: "wrong-key-0123456789" }) });
  await plugin.send({ type: "push" });
  [item] = plugin.last("results").items;
  assert.equal(item.status, "rejected");
  assert.match(item.reason, /HTTP 401/);

  await plugin.send({ type: "save-settings", settings: settings({ url: "http://127.0.0.1:9" }) });
  await plugin.send({ type: "push" });
  [item] = plugin.last("results").items;
  assert.equal(item.status, "rejected");
  assert.match(item.reason, /^cannot reach http:\/\/127\.0\.0\.1:9/);
});

test("bad settings are refused and kept out of clientStorage; an empty selection says what to do", async () => {
  const plugin = startPlugin([]);
  await plugin.send({ type: "save-settings", settings: { url: "localhost:5000", type: "design note" } });
  assert.deepEqual(plugin.last("settings-error").problems, [
    "The server URL must start with http:// or https://", "The unit type must be a name like design_note",
    "The API key is required (a key with the push scope)"]);
  assert.equal(plugin.calls.storage.has("context-mode-settings"), false);
  await plugin.send({ type: "push" });                            // the defaults hold no key
  assert.deepEqual(plugin.last("results"), { type: "results", items: [],
                                             summary: "The API key is required (a key with the push scope)" });
  await plugin.send({ type: "save-settings", settings: { apiKey: "cms_plugin-key" } });
  assert.equal(plugin.calls.storage.get("context-mode-settings").apiKey, "cms_plugin-key");
  await plugin.send({ type: "push" });
  assert.deepEqual(plugin.last("results"), { type: "results", items: [],
                                             summary: "Select text layers, or frames that hold text, first." });
  await plugin.send({ type: "close" });
  assert.equal(plugin.calls.closed, true);
});
