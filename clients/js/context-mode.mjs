// Context Mode Service client for VS Code / Cursor extensions and Node 18+: one file, no dependencies.
// Uses only fetch and WebCrypto (globalThis.crypto.subtle), both built into Node 18+ and VS Code.
//
//   import { ContextModeClient } from "./context-mode.mjs";
//   const cm = new ContextModeClient({ url: "http://localhost:5000", apiKey: process.env.CONTEXT_API_KEY });
//   await cm.push("订单 ORD-7890 shipped", { type: "tool_output", source: "vscode_ext_1.0_dev", ttl: 3600 });
//   const hits = await cm.recall("ORD-7890");

/** HTTP statuses worth retrying: busy (429) or storage briefly unavailable (503). Other 4xx never. */
export const RETRY_STATUSES = new Set([429, 503]);

/** The server's CID rule: first 12 hex digits of sha256(content + String(timestamp) + source), UTF-8. */
export async function computeCid(content, timestamp, source) {
  const data = new TextEncoder().encode(String(content) + String(timestamp) + String(source));
  const digest = await globalThis.crypto.subtle.digest("SHA-256", data);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("").slice(0, 12);
}

/**
 * A unit object with its CID filled in; timestamp defaults to now (integer seconds), no ttl to the server's default.
 * Async (WebCrypto digests are): `const unit = await makeUnit(...)`. push() and pushBatch() also take the promise itself.
 */
export async function makeUnit(content, { type = "tool_output", source, ttl, timestamp, metadata, parentCid } = {}) {
  if (!source) throw new TypeError("makeUnit: 'source' is required");
  const ts = timestamp ?? Math.floor(Date.now() / 1000);
  const unit = { cid: await computeCid(content, ts, source), type, source, timestamp: ts, content };
  if (ttl !== undefined && ttl !== null) unit.ttl = ttl;
  if (metadata !== undefined) unit.metadata = metadata;
  if (parentCid !== undefined) unit.parent_cid = parentCid;
  return unit;
}

/** An error answer from the service (`code` is its machine code), or a network failure (`status` null). */
export class ContextModeError extends Error {
  constructor(message, { status = null, code = "http_error", field = null, body = null } = {}) {
    super(message);
    this.name = "ContextModeError";
    this.status = status;
    this.code = code;
    this.field = field;
    this.body = body;
  }

  get retryable() {
    return this.status === null || RETRY_STATUSES.has(this.status);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class ContextModeClient {
  /**
   * @param {object} options
   * @param {string} [options.url] base URL, e.g. "http://localhost:5000"
   * @param {string} [options.apiKey] sent as "Authorization: Bearer <key>"
   * @param {number} [options.timeoutMs] per attempt
   * @param {number} [options.retries] extra attempts on 429/503/network errors
   * @param {number} [options.backoffMs] first delay, doubled each retry (with jitter)
   * @param {Function} [options.fetch] a fetch implementation (default: globalThis.fetch)
   */
  constructor({ url = "http://127.0.0.1:5000", apiKey, timeoutMs = 10000, retries = 4, backoffMs = 250,
                maxBackoffMs = 8000, fetch = globalThis.fetch } = {}) {
    this.url = url.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.timeoutMs = timeoutMs;
    this.retries = retries;
    this.backoffMs = backoffMs;
    this.maxBackoffMs = maxBackoffMs;
    this.fetch = fetch;
  }

  /** One API call with retries; resolves to the decoded JSON or rejects with ContextModeError. */
  async request(method, path, body) {
    const headers = { Accept: "application/json" };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    for (let attempt = 0; ; attempt++) {
      let error;
      let retryAfterMs = null;
      try {
        const rv = await this.fetch(this.url + path, {
          method, headers, body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(this.timeoutMs),
        });
        const text = await rv.text();
        let data = null;
        try { data = text ? JSON.parse(text) : null; } catch { data = null; }
        if (rv.ok) {
          if (data === null) throw new ContextModeError("The server answered with a body that is not JSON.", { status: rv.status, code: "invalid_response" });
          return data;
        }
        error = errorFrom(rv, data, text);
        const ra = Number(rv.headers.get("retry-after"));
        if (rv.headers.has("retry-after") && Number.isFinite(ra)) retryAfterMs = ra * 1000;
      } catch (e) {
        if (e instanceof ContextModeError) throw e;
        error = new ContextModeError(`${e.name}: ${e.message}`, { code: "connection_error" });
      }
      if (!error.retryable || attempt >= this.retries) throw error;
      let delay = Math.min(this.maxBackoffMs, this.backoffMs * 2 ** attempt) * (0.5 + Math.random() / 2);
      if (retryAfterMs !== null) delay = Math.min(this.maxBackoffMs, Math.max(delay, retryAfterMs));
      await sleep(delay);
    }
  }

  /** Push one unit: a unit object (or makeUnit()'s promise of one), or content plus makeUnit() options (`source` required). */
  async push(contentOrUnit, options = {}) {
    // awaited here, as Python's make_unit needs no await: a forgotten await once posted "{}" (400 missing_field type)
    const given = await contentOrUnit;
    const unit = typeof given === "string" ? await makeUnit(given, options) : given;
    return this.request("POST", "/mcp/push", unit);
  }

  /** One batch (at most 1,000 units, or makeUnit() promises): per unit {index, status, cid, seq} or {index, status: "error", code, error}. */
  async pushBatch(units) {
    return (await this.request("POST", "/mcp/push", { units: await Promise.all(units) })).results;
  }

  /** POST /mcp/search; params: top_k, types, source, since, until, min_score, consistency ("strong"), ... */
  async search(query, params = {}) {
    return this.request("POST", "/mcp/search", { query, ...params });
  }

  /** POST /mcp/context: prompt-ready text with [type cid] citations under a token budget. */
  async context(query, params = {}) {
    return this.request("POST", "/mcp/context", { query, ...params });
  }

  async getUnit(cid) { return this.request("GET", `/mcp/units/${encodeURIComponent(cid)}`); }

  async lineage(cid) { return this.request("GET", `/mcp/units/${encodeURIComponent(cid)}/lineage`); }

  async deleteUnit(cid) { return this.request("DELETE", `/mcp/units/${encodeURIComponent(cid)}`); }

  /** GET /mcp/units: one page, latest stored first: {units, next_cursor}. Filters: types, source, since, until, parent_cid. */
  async listUnits({ limit = 50, cursor, ...filters } = {}) {
    return this.request("GET", withQuery("/mcp/units", { ...filters, limit, cursor }));
  }

  /** Every live unit matching the filters, latest stored first, page after page (an async iterator). */
  async *iterUnits({ pageSize = 200, ...filters } = {}) {
    let cursor;
    do {
      const page = await this.listUnits({ ...filters, limit: pageSize, cursor });
      yield* page.units;
      cursor = page.next_cursor;
    } while (cursor);
  }

  /** GET /mcp/stats: units and bytes per type and per day, oldest/newest, index backlog, day files. */
  async stats() { return this.request("GET", "/mcp/stats"); }

  /** GET /mcp/export: every live unit (optionally filtered), oldest first, streamed as an async iterator
   * of unit objects a push takes back with the same CIDs. */
  async *exportUnits(filters = {}) {
    const headers = { Accept: "application/x-ndjson" };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    let rv;
    try {
      rv = await this.fetch(this.url + withQuery("/mcp/export", filters), { headers });
    } catch (e) {
      throw new ContextModeError(`${e.name}: ${e.message}`, { code: "connection_error" });
    }
    if (!rv.ok) {
      const text = await rv.text();
      let data = null;
      try { data = JSON.parse(text); } catch { data = null; }
      throw errorFrom(rv, data, text);
    }
    const decoder = new TextDecoder();
    let rest = "";
    for await (const chunk of rv.body) {
      rest += decoder.decode(chunk, { stream: true });
      const lines = rest.split("\n");
      rest = lines.pop();
      for (const line of lines) if (line.trim()) yield JSON.parse(line);
    }
    rest += decoder.decode();
    if (rest.trim()) yield JSON.parse(rest);
  }

  /** POST /mcp/forget (admin key). Without `confirm`: a dry run {count, sample, confirm}; call again with the
   * same filters and `confirm` to forget them. Filters: types, source, since, until, parent_cid, query, operator, cids. */
  async forget(params = {}) { return this.request("POST", "/mcp/forget", params); }

  // --- live context (issue 16) ------------------------------------------------------------------

  /**
   * GET /mcp/stream: new units matching `params` ({query, types, source, operator}) as they are indexed.
   *   const s = cm.stream({ query: "ORD-7890" });
   *   for await (const unit of s) { ... }      // s.close() (any time) ends it
   * Reconnects after a dropped connection or a server end, resuming after `s.lastEventId` (a unit's seq),
   * so nothing is lost. Pass `lastEventId` to resume an earlier stream.
   */
  stream(params = {}, { lastEventId = null, reconnect = true } = {}) {
    return new UnitStream(this, params, lastEventId, reconnect);
  }

  /** Call `onUnit(unit)` for each new matching unit; returns the stream (call `.close()` to stop). */
  watch(onUnit, params = {}, options = {}) {
    const s = this.stream(params, options);
    (async () => { for await (const unit of s) await onUnit(unit); })().catch(() => s.close());
    return s;
  }

  // --- tool registry (issue 16) ------------------------------------------------------------------

  /** Register a tool (admin key): {name, description, input_schema, title?, endpoint?, auth_type?, tags?, metadata?, output_schema?}. */
  async registerTool(tool) { return this.request("POST", "/mcp/tools", tool); }

  async updateTool(name, tool) { return this.request("PUT", `/mcp/tools/${encodeURIComponent(name)}`, tool); }

  async getTool(name) { return this.request("GET", `/mcp/tools/${encodeURIComponent(name)}`); }

  async deleteTool(name) { return this.request("DELETE", `/mcp/tools/${encodeURIComponent(name)}`); }

  /** The registered tools best matching what they should do, with their JSON Schemas: {topK, tags, authType}. */
  async findTools(query, { topK = 5, tags, authType } = {}) {
    const qs = new URLSearchParams({ q: query, top_k: String(topK) });
    if (tags?.length) qs.set("tags", tags.join(","));
    if (authType) qs.set("auth_type", authType);
    return (await this.request("GET", `/mcp/tools?${qs}`)).tools;
  }

  /** Every registered tool by name, page by page. */
  async *listTools({ tags, authType, pageSize = 100 } = {}) {
    const qs = new URLSearchParams({ limit: String(pageSize) });
    if (tags?.length) qs.set("tags", tags.join(","));
    if (authType) qs.set("auth_type", authType);
    for (;;) {
      const page = await this.request("GET", `/mcp/tools?${qs}`);
      yield* page.tools;
      if (!page.next_after) return;
      qs.set("after", page.next_after);
    }
  }

  /** The plugin habit: the top `topK` results scoring above `threshold`, each cut to `maxChars` characters. */
  async recall(query, { threshold = 0.5, topK = 3, maxChars = 200, ...params } = {}) {
    const { results } = await this.search(query, { top_k: topK, ...params });
    return results.filter((r) => r.score > threshold).slice(0, topK).map((r) => ({
      cid: r.cid, type: r.type, source: r.source, score: r.score,
      text: r.content.length > maxChars ? r.content.slice(0, maxChars) + "…" : r.content,
    }));
  }
}

function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null) continue;
    q.set(name, Array.isArray(value) ? value.join(",") : String(value));
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** An open GET /mcp/stream: an async iterable of units that resumes after `lastEventId` when it reconnects. */
export class UnitStream {
  constructor(client, params, lastEventId, reconnect) {
    this.client = client;
    this.params = params;
    this.lastEventId = lastEventId;
    this.reconnect = reconnect;
    this.closed = false;
    this.controller = null;
  }

  close() {
    this.closed = true;
    this.controller?.abort();
  }

  async *[Symbol.asyncIterator]() {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(this.params)) {
      if (v !== undefined && v !== null && v !== "") qs.set(k, Array.isArray(v) ? v.join(",") : String(v));
    }
    try {
      yield* this.#run(qs);
    } finally {
      this.controller?.abort();          // a consumer that stops iterating (break) closes the connection
    }
  }

  async *#run(qs) {
    let retryMs = 2000;
    let attempt = 0;
    while (!this.closed) {
      const headers = { Accept: "text/event-stream" };
      if (this.client.apiKey) headers.Authorization = `Bearer ${this.client.apiKey}`;
      if (this.lastEventId !== null && this.lastEventId !== undefined) headers["Last-Event-ID"] = String(this.lastEventId);
      this.controller = new AbortController();
      let error = null;
      try {
        const rv = await this.client.fetch(`${this.client.url}/mcp/stream?${qs}`, { headers, signal: this.controller.signal });
        if (!rv.ok) {
          const text = await rv.text();
          let data = null;
          try { data = JSON.parse(text); } catch { data = null; }
          error = errorFrom(rv, data, text);
          if (!error.retryable) throw error;
        } else {
          attempt = 0;
          for await (const { event, data, id } of sseEvents(rv.body)) {
            if (event === "unit") {
              const unit = JSON.parse(data);
              this.lastEventId = id ? Number(id) : unit.seq;
              yield unit;
            } else if (event === "retry") {
              retryMs = Math.max(100, Number(data));
            }
          }
        }
      } catch (e) {
        if (e instanceof ContextModeError && !e.retryable) throw e;
        if (this.closed) return;
        error = e instanceof ContextModeError ? e : new ContextModeError(`${e.name}: ${e.message}`, { code: "connection_error" });
      }
      if (this.closed || !this.reconnect) return;
      if (error && attempt >= this.client.retries) throw error;
      const delay = error ? Math.min(this.client.maxBackoffMs, this.client.backoffMs * 2 ** attempt) : retryMs;
      if (error) attempt++;
      await sleep(delay * (0.5 + Math.random() / 2));
    }
  }
}

/** {event, data, id} of each SSE event of a byte stream; `retry:` fields come out as {event: "retry"}. */
async function* sseEvents(body) {
  const decoder = new TextDecoder();
  let buffer = "", tail = "";
  let event = "message", data = [], id = null;
  for await (const chunk of body) {
    // Lines end in \n, \r\n or \r; a \r at the end of a chunk waits for the next (it may precede a \n).
    const text = tail + decoder.decode(chunk, { stream: true });
    const cut = text.endsWith("\r") ? text.length - 1 : text.length;
    buffer += text.slice(0, cut).replace(/\r\n?/g, "\n");
    tail = text.slice(cut);
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (line === "") {
        if (data.length) yield { event, data: data.join("\n"), id };
        event = "message"; data = []; id = null;
        continue;
      }
      if (line.startsWith(":")) continue;          // a comment: the server's heartbeat
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
      else if (field === "retry" && /^\d+$/.test(value)) yield { event: "retry", data: value, id: null };
    }
  }
}

function errorFrom(rv, data, text) {
  if (data && typeof data === "object" && "code" in data) {
    return new ContextModeError(String(data.error ?? ""), { status: rv.status, code: String(data.code), field: data.field ?? null, body: data });
  }
  if (data && typeof data === "object" && "error_code" in data) {
    return new ContextModeError(String(data.error_msg ?? ""), { status: rv.status, code: String(data.error_code), body: data });
  }
  return new ContextModeError((text || rv.statusText || "HTTP error").slice(0, 200), { status: rv.status, body: data });
}
