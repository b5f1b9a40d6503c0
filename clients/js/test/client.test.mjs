// node --test clients/js/test/  with CONTEXT_URL (and CONTEXT_API_KEY when the server has keys).
// tests/test_js_client.py starts a real gunicorn and runs this file against it.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { ContextModeClient, ContextModeError, computeCid, makeUnit } from "../context-mode.mjs";

const URL_ = process.env.CONTEXT_URL;
const KEY = process.env.CONTEXT_API_KEY;
const live = { skip: URL_ ? false : "set CONTEXT_URL to a running Context Mode Service" };
const client = () => new ContextModeClient({ url: URL_, apiKey: KEY });

test("computeCid matches the server's rule (vectors from service.units.compute_cid)", async () => {
  assert.equal(await computeCid("订单 ORD-7890 shipped", 1715824391, "curl_tool_v2.1"), "c86ef048ceca");
  assert.equal(await computeCid('{"order_id":"ORD-7890","status":"shipped"}', 1715824391, "curl_tool_v2.1"), "70d2f8236430");
  assert.equal(await computeCid("", 0, "x"), "a54942c8e365");
  assert.equal(await computeCid("emoji 😀 é", 1700000000, "src_é"), "b868ca7c390f");
});

test("push, search with read-your-writes, get, lineage, context, recall", live, async () => {
  const cm = client();
  const tag = `JSTEST${Date.now()}`;
  const parent = await makeUnit(`${tag} 用户问订单 ORD-7890 的状态`, { type: "user_input", source: "js_test_1.0_ci" });
  const rv = await cm.push(parent);
  assert.equal(rv.status, "ok");
  assert.equal(rv.cid, parent.cid);
  assert.equal((await cm.push(parent)).status, "duplicate");
  const child = await cm.push(`${tag} order ORD-7890 shipped`, { source: "js_test_1.0_ci", parentCid: parent.cid, metadata: { http_status: 200 } });

  const found = await cm.search(tag, { consistency: "strong" });
  const cids = found.results.map((r) => r.cid).sort();
  assert.deepEqual(cids, [parent.cid, child.cid].sort());
  for (const r of found.results) {
    for (const k of ["cid", "type", "source", "timestamp", "ttl", "content", "metadata", "bm25_score", "score"]) assert.ok(k in r, k);
    assert.ok(r.score > 0 && r.score <= 1);
  }

  const unit = await cm.getUnit(child.cid);
  assert.equal(unit.parent_cid, parent.cid);
  assert.deepEqual(unit.metadata, { http_status: 200 });
  const lineage = await cm.lineage(child.cid);
  assert.deepEqual(lineage.ancestors.map((u) => u.cid), [parent.cid]);

  const ctx = await cm.context(tag, { budget_tokens: 500, consistency: "strong" });
  assert.match(ctx.context, new RegExp(child.cid));

  const hits = await cm.recall(tag, { threshold: 0, maxChars: 10, consistency: "strong" });
  assert.ok(hits.length >= 1 && hits.length <= 3);
  for (const h of hits) assert.ok(h.text.length <= 11);
});

test("pushBatch reports each unit; errors carry the server's code", live, async () => {
  const cm = client();
  const good = await makeUnit(`batch ${Date.now()}`, { source: "js_test_1.0_ci" });
  const results = await cm.pushBatch([good, { ...good, cid: "000000000000", content: "other" }]);
  assert.equal(results[0].status, "ok");
  assert.equal(results[1].status, "error");
  assert.equal(results[1].code, "invalid_cid");

  await assert.rejects(cm.search("x", { top_k: 0 }), (e) => e instanceof ContextModeError && e.status === 400 && e.field === "top_k");
  await assert.rejects(cm.getUnit("ffffffffffff"), (e) => e.status === 404 && e.code === "not_found");
});

test("makeUnit without await: push and pushBatch take its promise, as Python's make_unit needs no await", live, async () => {
  const cm = client();
  const tag = `JSNOAWAIT${Date.now()}`;
  const pending = makeUnit(`${tag} one`, { source: "js_test_1.0_ci" });
  assert.ok(pending instanceof Promise);
  const rv = await cm.push(pending);                                  // was 400 missing_field type: "{}" was posted
  assert.equal(rv.status, "ok");
  assert.equal(rv.cid, (await pending).cid);
  const results = await cm.pushBatch([makeUnit(`${tag} two`, { source: "js_test_1.0_ci" }), await pending]);
  assert.deepEqual(results.map((r) => r.status), ["ok", "duplicate"]);
  const found = await cm.search(tag, { consistency: "strong" });
  assert.equal(found.results.length, 2);
});

test("retries 503 with backoff, never 400 (local stub server)", async () => {
  let calls = 0;
  let mode = "503";
  const server = createServer((req, res) => {
    calls++;
    res.setHeader("Content-Type", "application/json");
    if (mode === "503" && calls < 3) {
      res.writeHead(503, { "Retry-After": "0" });
      res.end(JSON.stringify({ error: "busy", code: "storage_unavailable" }));
    } else if (mode === "400") {
      res.writeHead(400);
      res.end(JSON.stringify({ error: "bad", code: "invalid_field", field: "ttl" }));
    } else {
      res.end(JSON.stringify({ status: "ok", cid: "abcdefabcdef", seq: 1, indexed: false }));
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const cm = new ContextModeClient({ url: `http://127.0.0.1:${server.address().port}`, backoffMs: 1 });
    const rv = await cm.push("x", { source: "stub" });
    assert.equal(rv.status, "ok");
    assert.equal(calls, 3);
    calls = 0;
    mode = "400";
    await assert.rejects(cm.push("x", { source: "stub" }), (e) => e.code === "invalid_field" && e.field === "ttl");
    assert.equal(calls, 1);
  } finally {
    server.close();
  }
});

test("listUnits pages latest stored first, stats count them, exportUnits streams them, forget needs a dry run", live, async () => {
  const cm = client();
  const tag = `JSMANAGE${Date.now()}`;
  const source = `js_manage_${Date.now()}`;
  const pushed = [];
  for (let i = 0; i < 5; i++) pushed.push((await cm.push(`${tag} 第${i}条 note ${i}`, { source, type: i % 2 ? "user_input" : "tool_output" })).cid);

  const first = await cm.listUnits({ source, limit: 2 });
  assert.equal(first.units.length, 2);
  assert.ok(first.next_cursor);
  const all = [];
  for await (const u of cm.iterUnits({ source, pageSize: 2 })) all.push(u.cid);
  assert.deepEqual(all, pushed.slice().reverse());                     // latest stored first
  const inputs = await cm.listUnits({ source, types: ["user_input"] });
  assert.deepEqual(inputs.units.map((u) => u.cid), [pushed[3], pushed[1]]);

  const stats = await cm.stats();
  assert.ok(stats.units >= 5 && stats.types.tool_output.units >= 3);

  const exported = [];
  for await (const u of cm.exportUnits({ source })) exported.push(u);
  assert.deepEqual(exported.map((u) => u.cid), pushed);                 // oldest first
  assert.deepEqual(Object.keys(exported[0]).sort(), ["cid", "content", "metadata", "parent_cid", "source", "timestamp", "ttl", "type"]);

  const dry = await cm.forget({ source, query: tag, types: ["user_input"] });
  assert.equal(dry.dry_run, true);
  assert.equal(dry.count, 2);
  await assert.rejects(cm.forget({ source, query: tag, confirm: dry.confirm }), (e) => e.code === "invalid_confirm");
  const done = await cm.forget({ source, query: tag, types: ["user_input"], confirm: dry.confirm });
  assert.equal(done.forgotten, 2);
  const left = [];
  for await (const u of cm.iterUnits({ source })) left.push(u.cid);
  assert.deepEqual(left, [pushed[4], pushed[2], pushed[0]]);
  await assert.rejects(cm.getUnit(pushed[3]), (e) => e.status === 404);
});
