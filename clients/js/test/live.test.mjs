// Live context and the tool registry (issue 16) through the JS client, against CONTEXT_URL.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ContextModeClient, ContextModeError } from "../context-mode.mjs";

const URL_ = process.env.CONTEXT_URL;
const KEY = process.env.CONTEXT_API_KEY;
const live = { skip: URL_ ? false : "set CONTEXT_URL to a running Context Mode Service" };
const client = () => new ContextModeClient({ url: URL_, apiKey: KEY });

async function take(iterator, n, timeoutMs = 15000) {
  const out = [];
  const timer = setTimeout(() => { throw new Error(`only ${out.length} of ${n} units in time`); }, timeoutMs);
  for await (const unit of iterator) {
    out.push(unit);
    if (out.length === n) break;
  }
  clearTimeout(timer);
  return out;
}

test("stream: matching units in seq order, then a new stream resumes after lastEventId", live, async () => {
  const cm = client();
  const tag = `JSLIVE${Date.now()}`;
  const start = await cm.push(`before ${tag}`, { source: "js_live_1.0_ci" });
  const s = cm.stream({ query: tag, types: ["tool_output"] }, { lastEventId: start.seq - 1 });
  const first = [];
  for (let i = 0; i < 3; i++) first.push(await cm.push(`${tag} unit ${i}`, { source: "js_live_1.0_ci" }));
  await cm.push(`${tag} as a notice`, { type: "system_notice", source: "js_live_1.0_ci" });   // filtered by type
  const got = await take(s, 4);                     // the "before" unit matches the tag too
  assert.deepEqual(got.map((u) => u.cid), [start.cid, ...first.map((u) => u.cid)]);
  assert.ok(got.every((u, i) => i === 0 || u.seq > got[i - 1].seq));
  assert.equal(got[1].uri, `context://units/${first[0].cid}`);
  assert.equal(s.lastEventId, first[2].seq);
  s.close();

  const missed = [];
  for (let i = 0; i < 2; i++) missed.push(await cm.push(`${tag} missed ${i}`, { source: "js_live_1.0_ci" }));
  const again = cm.stream({ query: tag, types: ["tool_output"] }, { lastEventId: s.lastEventId });
  const resumed = await take(again, 2);
  again.close();
  assert.deepEqual(resumed.map((u) => u.cid), missed.map((u) => u.cid));
});

test("watch calls back for each new unit", live, async () => {
  const cm = client();
  const tag = `JSWATCH${Date.now()}`;
  const start = await cm.push(`${tag} first`, { source: "js_live_1.0_ci" });
  const seen = [];
  let resolve;
  const arrived = new Promise((r) => { resolve = r; });
  const handle = cm.watch((unit) => { seen.push(unit.content); if (seen.length === 2) resolve(); },
    { query: tag }, { lastEventId: start.seq - 1 });
  await cm.push(`${tag} second`, { source: "js_live_1.0_ci" });
  await arrived;
  handle.close();
  assert.deepEqual(seen, [`${tag} first`, `${tag} second`]);
});

test("tool registry: register, find by a paraphrase, read, update, delete; credentials refused", live, async () => {
  const cm = client();
  const name = `js_send_invoice_${Date.now()}`;
  const tool = {
    name, description: "Email a PDF invoice to a customer once an order has been paid.",
    endpoint: "https://billing.example.com/invoices/send", auth_type: "bearer", tags: ["billing"],
    input_schema: { type: "object", properties: { order_id: { type: "string" }, email: { type: "string" } },
                    required: ["order_id"] },
  };
  const created = await cm.registerTool(tool);
  assert.equal(created.version, 1);
  assert.equal(created.uri, `context://tools/${name}`);
  const found = await cm.findTools("bill the customer for their paid order by email", { tags: ["billing"] });
  assert.equal(found[0].name, name);
  assert.deepEqual(found[0].input_schema, tool.input_schema);
  assert.ok(found[0].score > 0 && found[0].score <= 1);
  const updated = await cm.updateTool(name, { ...tool, description: "Email a PDF invoice for a paid order." });
  assert.equal(updated.version, 2);
  const listed = [];
  for await (const t of cm.listTools({ tags: ["billing"] })) listed.push(t.name);
  assert.ok(listed.includes(name));
  await assert.rejects(cm.registerTool({ ...tool, name: `${name}_2`, metadata: { api_key: "abcdef0123456789" } }),
    (e) => e instanceof ContextModeError && e.status === 422 && e.code === "credential_not_allowed");
  await assert.rejects(cm.registerTool(tool), (e) => e.status === 409 && e.code === "tool_exists");
  assert.equal((await cm.deleteTool(name)).status, "deleted");
  await assert.rejects(cm.getTool(name), (e) => e.status === 404);
});
