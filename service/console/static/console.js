// Context Mode console (docs/design.md §8). Plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Stored content is untrusted: every string from the API reaches the page as a text node
// (textContent / createTextNode), never as HTML, and links are built only from CIDs checked against
// /^[0-9a-f]{12}$/. The page's Content-Security-Policy requires Trusted Types, so an innerHTML
// assignment anywhere would throw instead of parsing markup.
//
// The API key lives in this tab's sessionStorage and travels only in the Authorization header.
"use strict";

(function () {
  const KEY_SLOT = "context-mode.key";
  const LANG_SLOT = "context-mode.lang";
  const CID_RE = /^[0-9a-f]{12}$/;
  const PAGE = 50;

  // --- text in two languages ---------------------------------------------------------------------
  const TEXT = {
    en: {
      skip: "Skip to content", nav: "Sections", search: "Search", units: "Units", timeline: "Timeline",
      forget: "Forget", signin: "Sign in", signout: "Sign out", key: "API key", keyHelp:
        "The key stays in this browser tab (session storage) and is sent only as the Authorization header.",
      badKey: "This key was not accepted.", signedOut: "Signed out.", openMode: "no keys configured, loopback only",
      tenant: "tenant", sourceLabel: "Source", filters: "Filters", query: "Query", topK: "Results", types: "Types", source: "Source (exact, or prefix*)",
      since: "Since", until: "Until", parent: "Parent CID", minScore: "Min score", operator: "Match",
      any: "any word", all: "all words", strong: "Strong consistency (see every push so far)",
      go: "Search", filter: "Apply filters", results: "{n} results", took: "{ms} ms, {shards} day files",
      freshness: "read index lag {lag} ms, {pending} not yet searchable", noResults: "No unit matched.",
      open: "open", score: "score", loading: "Loading…", loadMore: "Load more", end: "No more units.",
      noUnits: "No units.", unitsOrder: "Latest stored first: the order they arrived in (the time shown is each unit's own timestamp).", unit: "Unit", cid: "CID", type: "Type", timestamp: "Timestamp", ttl: "TTL",
      expires: "Expires", expiresIn: "in {t}", expired: "expired", never: "never (kept for good)",
      metadata: "Metadata", content: "Content", lineage: "Lineage", ancestors: "Ancestors (root first)",
      children: "Children", noChildren: "No children.", thisUnit: "this unit", notFound:
        "No live unit with this CID (expired, forgotten, or never stored).", seq: "seq",
      forgetUnit: "Forget this unit…", reallyForget: "Forget it", cancel: "Cancel", confirmOne:
        "Forget this unit everywhere? It leaves search at once; this cannot be undone.",
      forgotten: "Forgotten {n} unit(s).", dryRun: "Count matching units", forgetN: "Forget {n} units",
      dryRunResult: "{n} units match.", sample: "First matches", forgetHelp:
        "A dry run counts the matching units first; forgetting needs its confirmation and never removes more.",
      queryOpt: "Query (optional; units holding these words)", stats: "Stats", totalUnits: "Live units",
      totalBytes: "Content", oldest: "Oldest", newest: "Newest", pending: "Waiting for indexing",
      lag: "Read index lag", dayFiles: "Days stored", streams: "Live streams", perType: "By type", perDay: "Units per day and type",
      day: "Day", count: "Units", bytes: "Bytes", noData: "No live units yet.", truncated:
        "Lineage truncated (too much content); omitted: {n}.", adminOnly: "Needs an admin key.",
      language: "Language", switchTo: "中文", back: "Back", chart: "Units per day, stacked by type",
      help: "Keys: / search · g s search · g u units · g t timeline",
    },
    zh: {
      skip: "跳到内容", nav: "栏目", search: "搜索", units: "单元", timeline: "时间线", forget: "遗忘",
      signin: "登录", signout: "退出", key: "API 密钥", keyHelp: "密钥只保存在本标签页（session storage），只通过 Authorization 头发送。",
      badKey: "密钥无效。", signedOut: "已退出。", openMode: "未配置密钥，仅本机", tenant: "租户", sourceLabel: "来源", filters: "筛选", query: "查询",
      topK: "结果数", types: "类型", source: "来源（精确，或前缀*）", since: "起始", until: "截止",
      parent: "父 CID", minScore: "最低分", operator: "匹配", any: "任一词", all: "全部词",
      strong: "强一致（包含刚推送的单元）", go: "搜索", filter: "应用筛选", results: "{n} 条结果",
      took: "{ms} 毫秒，{shards} 个日文件", freshness: "读索引延迟 {lag} 毫秒，{pending} 条尚不可搜", noResults: "没有匹配的单元。",
      open: "打开", score: "得分", loading: "加载中…", loadMore: "加载更多", end: "没有更多了。", noUnits: "没有单元。", unitsOrder: "按存入先后排列，最近存入的在前（显示的时间是单元自带的时间戳）。",
      unit: "单元", cid: "CID", type: "类型", timestamp: "时间戳", ttl: "TTL", expires: "过期",
      expiresIn: "{t}后", expired: "已过期", never: "永不（永久保存）", metadata: "元数据", content: "内容",
      lineage: "血缘", ancestors: "祖先（根在前）", children: "子单元", noChildren: "没有子单元。", thisUnit: "本单元",
      notFound: "没有这个 CID 的有效单元（已过期、已遗忘或从未存储）。", seq: "序号",
      forgetUnit: "遗忘此单元…", reallyForget: "确认遗忘", cancel: "取消",
      confirmOne: "在所有地方遗忘此单元？它会立即从搜索中消失，且无法撤销。", forgotten: "已遗忘 {n} 个单元。",
      dryRun: "统计匹配的单元", forgetN: "遗忘 {n} 个单元", dryRunResult: "{n} 个单元匹配。", sample: "前几条匹配",
      forgetHelp: "先试运行统计匹配数；遗忘需要它的确认码，且不会删除更多。", queryOpt: "查询（可选；包含这些词的单元）",
      stats: "统计", totalUnits: "有效单元", totalBytes: "内容", oldest: "最早", newest: "最新", pending: "等待索引",
      lag: "读索引延迟", dayFiles: "存储天数", streams: "实时订阅", perType: "按类型", perDay: "每日单元（按类型）", day: "日期",
      count: "单元数", bytes: "字节", noData: "还没有有效单元。", truncated: "血缘已截断（内容过多）；省略 {n} 个。",
      adminOnly: "需要管理员密钥。", language: "语言", switchTo: "English", back: "返回", chart: "每日单元数，按类型堆叠",
      help: "快捷键：/ 搜索 · g s 搜索 · g u 单元 · g t 时间线",
    },
  };
  let lang = localStorage.getItem(LANG_SLOT) || ((navigator.language || "").toLowerCase().startsWith("zh") ? "zh" : "en");
  const t = (key, vars) => {
    let s = (TEXT[lang] && TEXT[lang][key]) || TEXT.en[key] || key;
    for (const [k, v] of Object.entries(vars || {})) s = s.split("{" + k + "}").join(String(v));
    return s;
  };

  // --- DOM helpers: elements and text nodes only -------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
      else if (name === "class") el.className = value;
      else if (name === "href") el.setAttribute("href", safeHref(value));
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    append(el, children);
    return el;
  }
  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  // Only the console's own hash routes are ever links.
  function safeHref(value) {
    return typeof value === "string" && /^#\/[A-Za-z0-9/_?=&%.,:*~-]*$/.test(value) ? value : "#/search";
  }
  const svg = (tag, attrs, ...children) => {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    return append(el, children);
  };
  const clear = (el) => { while (el.firstChild) el.removeChild(el.firstChild); return el; };
  const $ = (id) => document.getElementById(id);
  const unitLink = (cid, label) => CID_RE.test(cid || "") ? h("a", { href: "#/unit/" + cid, class: "cid" }, label || cid) : h("span", { class: "cid" }, String(cid));

  // --- session and API ---------------------------------------------------------------------------
  const session = { key: sessionStorage.getItem(KEY_SLOT), tenant: null, scopes: [], open: false, types: [] };
  const isAdmin = () => session.scopes.includes("admin");

  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.error) || ("HTTP " + status));
      this.status = status;
      this.code = body && body.code;
    }
  }

  async function api(method, path, { params, body, raw } = {}) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, Array.isArray(v) ? v.join(",") : v);
    }
    const headers = { Accept: "application/json" };
    if (session.key) headers.Authorization = "Bearer " + session.key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const rv = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit", cache: "no-store", redirect: "error", referrerPolicy: "no-referrer" });
    if (raw && rv.ok) return rv;
    let data = null;
    try { data = await rv.json(); } catch (e) { data = null; }
    if (!rv.ok) {
      if (rv.status === 401 && !session.open && path !== "/console/session") signOut(t("badKey"));
      throw new ApiError(rv.status, data);
    }
    return data;
  }

  async function startSession(key) {
    const previous = session.key;
    session.key = key;
    try {
      const who = await api("GET", "/console/session");
      Object.assign(session, { tenant: who.tenant, scopes: who.scopes, open: who.open, types: who.types });
      if (key) sessionStorage.setItem(KEY_SLOT, key);
      return true;
    } catch (e) {
      session.key = previous;
      if (e.status === 401) { sessionStorage.removeItem(KEY_SLOT); session.key = null; return false; }
      throw e;
    }
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY_SLOT);
    Object.assign(session, { key: null, tenant: null, scopes: [], open: false });
    flash = [message || t("signedOut"), Boolean(message)];
    if (location.hash === "#/signin") render();
    else location.hash = "#/signin";
  }

  // --- chrome: status line, navigation, language -------------------------------------------------
  function say(text, isError) {
    const box = clear($("status"));
    if (text) box.appendChild(h("p", { class: isError ? "error" : "muted" }, text));
  }
  const sayError = (e) => say(e instanceof ApiError ? e.message + (e.code ? " [" + e.code + "]" : "") : String(e), true);

  function renderChrome(route) {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    $("skip-link").textContent = t("skip");
    const lb = $("lang");
    lb.textContent = t("switchTo");
    lb.setAttribute("aria-label", t("language") + ": " + t("switchTo"));
    const nav = clear($("nav"));
    nav.setAttribute("aria-label", t("nav"));
    const signedIn = session.tenant !== null;
    nav.hidden = !signedIn;
    const who = clear($("who"));
    if (!signedIn) return;
    const items = [["search", "#/search"], ["units", "#/units"], ["timeline", "#/timeline"]];
    if (isAdmin()) items.push(["forget", "#/forget"]);
    for (const [name, href] of items) {
      nav.appendChild(h("a", { href, "aria-current": route.name === name ? "page" : null, id: "nav-" + name }, t(name)));
    }
    append(who, [h("span", {}, t("tenant") + ": ", h("b", { id: "tenant" }, session.tenant)),
      session.open ? h("span", { class: "small" }, "(" + t("openMode") + ")") :
        h("button", { type: "button", class: "quiet", id: "signout", onclick: () => signOut() }, t("signout"))]);
  }

  // --- formatting --------------------------------------------------------------------------------
  const MAX_DATE = 253402300799;
  function when(ts) {
    if (typeof ts !== "number" || ts > MAX_DATE) return "—";
    const d = new Date(ts * 1000);
    return d.toISOString().replace(".000Z", "Z") + " (" + d.toLocaleString(lang === "zh" ? "zh-CN" : "en-GB") + ")";
  }
  const shortWhen = (ts) => (typeof ts === "number" && ts <= MAX_DATE) ? new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ") : "—";
  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }
  function duration(s) {
    const parts = [];
    const d = Math.floor(s / 86400), hh = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
    const u = lang === "zh" ? ["天", "小时", "分", "秒"] : ["d ", "h ", "m ", "s"];
    if (d) parts.push(d + u[0]);
    if (d || hh) parts.push(hh + u[1]);
    if (d || hh || m) parts.push(m + u[2]);
    parts.push(sec + u[3]);
    return parts.join("").trim();
  }
  function typeClass(type) {
    const known = session.types.length ? session.types : ["user_input", "model_thinking", "tool_output", "system_notice"];
    const i = known.indexOf(type);
    return "c" + ((i < 0 ? known.length : i) % 8);
  }
  const typeBadge = (type) => h("span", { class: "badge " + typeClass(type) }, type);
  const preview = (text, n) => { const s = String(text).replace(/\s+/g, " ").trim(); return s.length > n ? s.slice(0, n) + "…" : s; };
  // A search snippet marks matches with ** **: the marked parts become <mark> text, the rest plain text.
  function snippetNodes(snippet) {
    return String(snippet).split("**").map((part, i) => i % 2 ? h("mark", {}, part) : document.createTextNode(part));
  }
  function toUnix(value) {
    if (!value) return undefined;
    const ms = new Date(value).getTime();
    return Number.isFinite(ms) ? Math.floor(ms / 1000) : undefined;
  }
  function toLocalInput(ts) {
    if (!ts) return "";
    const d = new Date(Number(ts) * 1000);
    if (!Number.isFinite(d.getTime())) return "";
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  // --- the filter form, shared by search, units and forget ---------------------------------------
  let fieldSeq = 0;
  function field(label, input, cls) {
    const id = input.id || ("f" + (++fieldSeq));
    input.id = id;
    return h("div", { class: "field " + (cls || "") }, h("label", { for: id }, label), input);
  }
  function filterForm(kind, state, onSubmit) {
    const form = h("form", { class: "filters", id: kind + "-form", novalidate: true });
    const inputs = {};
    if (kind === "search" || kind === "forget") {
      inputs.q = h("input", { type: "search", id: kind + "-q", name: "q", value: state.q || "", autocomplete: "off",
        required: kind === "search" });
      form.appendChild(field(kind === "search" ? t("query") : t("queryOpt"), inputs.q, "wide"));
    }
    // the filters fold away on search (open when one is set, or on a wide screen)
    const more = kind === "search" ? h("details", { class: "more", id: "search-filters" }, h("summary", {}, t("filters"))) : null;
    const grid = more ? h("div", { class: "filter-grid" }) : null;
    if (more) {
      more.appendChild(grid);
      more.open = ["types", "source", "since", "until", "parent_cid", "min_score", "operator", "top_k"].some((k) => state[k]);
    }
    const place = (el) => (grid || form).appendChild(el);
    const box = h("fieldset", {}, h("legend", {}, t("types")));
    const chosen = new Set((state.types || "").split(",").filter(Boolean));
    inputs.types = session.types.map((type) => {
      const cb = h("input", { type: "checkbox", value: type, checked: chosen.has(type), name: "types" });
      box.appendChild(h("label", {}, cb, typeBadge(type)));
      return cb;
    });
    place(box);
    inputs.source = h("input", { type: "text", name: "source", value: state.source || "", autocomplete: "off" });
    place(field(t("source"), inputs.source));
    inputs.since = h("input", { type: "datetime-local", name: "since", value: toLocalInput(state.since) });
    inputs.until = h("input", { type: "datetime-local", name: "until", value: toLocalInput(state.until) });
    place(field(t("since"), inputs.since));
    place(field(t("until"), inputs.until));
    inputs.parent_cid = h("input", { type: "text", name: "parent_cid", value: state.parent_cid || "", autocomplete: "off",
      pattern: "[0-9a-f]{12}", maxlength: "12", size: "12" });
    place(field(t("parent"), inputs.parent_cid, "narrow"));
    if (kind === "search") {
      inputs.top_k = h("select", { name: "top_k" }, [5, 10, 20, 50, 100].map((n) => h("option", { value: n, selected: String(n) === String(state.top_k || 10) }, String(n))));
      place(field(t("topK"), inputs.top_k, "narrow"));
      inputs.min_score = h("input", { type: "number", name: "min_score", min: "0", max: "1", step: "0.05", value: state.min_score || "" });
      place(field(t("minScore"), inputs.min_score, "narrow"));
    }
    if (kind === "search" || kind === "forget") {
      const op = state.operator || (kind === "forget" ? "and" : "or");
      inputs.operator = h("select", { name: "operator" }, h("option", { value: "or", selected: op === "or" }, t("any")),
        h("option", { value: "and", selected: op === "and" }, t("all")));
      place(field(t("operator"), inputs.operator, "narrow"));
    }
    if (kind === "search") {
      inputs.strong = h("input", { type: "checkbox", name: "strong", id: "search-strong", checked: state.consistency === "strong" });
      form.appendChild(h("label", { class: "toggle", for: "search-strong" }, inputs.strong, t("strong")));
    }
    const submit = h("button", { type: "submit", class: "primary", id: kind + "-submit" },
      kind === "search" ? t("go") : kind === "forget" ? t("dryRun") : t("filter"));
    if (more) form.insertBefore(h("div", { class: "actions" }, submit), null);
    if (more) form.appendChild(more);
    else form.appendChild(h("div", { class: "actions" }, submit));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const out = {};
      if (inputs.q) out.q = inputs.q.value.trim();
      const types = inputs.types.filter((c) => c.checked).map((c) => c.value);
      if (types.length) out.types = types.join(",");
      if (inputs.source.value.trim()) out.source = inputs.source.value.trim();
      const since = toUnix(inputs.since.value), until = toUnix(inputs.until.value);
      if (since !== undefined) out.since = since;
      if (until !== undefined) out.until = until;
      if (inputs.parent_cid.value.trim()) out.parent_cid = inputs.parent_cid.value.trim();
      if (inputs.top_k && inputs.top_k.value !== "10") out.top_k = inputs.top_k.value;
      if (inputs.min_score && inputs.min_score.value) out.min_score = inputs.min_score.value;
      if (inputs.operator) out.operator = inputs.operator.value;
      if (inputs.strong && inputs.strong.checked) out.consistency = "strong";
      onSubmit(out);
    });
    return form;
  }
  const hashFor = (name, state) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(state)) if (v !== undefined && v !== "") q.set(k, v);
    const s = q.toString();
    return "#/" + name + (s ? "?" + s : "");
  };
  function filtersBody(state) {
    const body = {};
    if (state.types) body.types = state.types.split(",");
    if (state.source) body.source = state.source;
    if (state.since) body.since = Number(state.since);
    if (state.until) body.until = Number(state.until);
    if (state.parent_cid) body.parent_cid = state.parent_cid;
    return body;
  }

  // --- views -------------------------------------------------------------------------------------
  function viewSignin(main) {
    const input = h("input", { type: "password", id: "key-input", name: "key", autocomplete: "off", spellcheck: "false", required: true });
    const form = h("form", { id: "signin-form" },
      h("label", { for: "key-input" }, t("key")), input,
      h("p", { class: "small muted" }, t("keyHelp")),
      h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", id: "signin-submit" }, t("signin"))));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      try {
        if (await startSession(key)) { input.value = ""; location.hash = "#/search"; }
        else say(t("badKey"), true);
      } catch (e) { sayError(e); }
    });
    append(main, [h("section", { class: "signin" }, h("h1", {}, t("signin")), form)]);
    input.focus();
  }

  async function viewSearch(main, state) {
    append(main, [h("h1", { tabindex: "-1" }, t("search")),
      filterForm("search", state, (s) => { location.hash = hashFor("search", s); })]);
    const out = h("section", { id: "search-results", "aria-live": "polite" });
    main.appendChild(out);
    if (!state.q) { $("search-q").focus(); return; }
    out.appendChild(h("p", { class: "muted" }, t("loading")));
    const body = { query: state.q, highlight: true, ...filtersBody(state) };
    if (state.top_k) body.top_k = Number(state.top_k);
    if (state.min_score) body.min_score = Number(state.min_score);
    if (state.operator) body.operator = state.operator;
    if (state.consistency) body.consistency = state.consistency;
    const found = await api("POST", "/mcp/search", { body });
    clear(out);
    out.appendChild(h("p", { class: "muted small", id: "search-summary" }, t("results", { n: found.results.length }), " · ",
      t("took", { ms: found.took_ms, shards: found.shards_searched }), " · ",
      t("freshness", { lag: found.freshness.replica_lag_ms, pending: found.freshness.index_pending })));
    if (!found.results.length) { out.appendChild(h("p", {}, t("noResults"))); return; }
    out.appendChild(h("ol", { class: "results" }, found.results.map((r) => h("li", { class: "card result", "data-cid": r.cid },
      h("header", {}, typeBadge(r.type), h("span", { class: "badge score", title: "bm25 " + r.bm25_score }, t("score") + " " + r.score.toFixed(3)),
        unitLink(r.cid), h("span", { class: "muted" }, r.source), h("span", { class: "muted" }, shortWhen(r.timestamp))),
      h("p", { class: "snippet" }, snippetNodes(r.snippet !== undefined ? r.snippet : preview(r.content, 200)))))));
  }

  let countdown = null;
  async function viewUnit(main, cid) {
    if (!CID_RE.test(cid)) { main.appendChild(h("p", { class: "error" }, t("notFound"))); return; }
    let lin;
    try { lin = await api("GET", "/mcp/units/" + cid + "/lineage"); }
    catch (e) {
      if (e.status === 404) { append(main, [h("h1", {}, t("unit") + " ", h("span", { class: "cid" }, cid)), h("p", { id: "unit-missing" }, t("notFound"))]); return; }
      throw e;
    }
    const u = lin.unit;
    const expires = h("span", { id: "expires" });
    const tick = () => {
      const left = u.expires_at - Math.floor(Date.now() / 1000);
      expires.textContent = u.expires_at > MAX_DATE ? t("never") : left > 0 ? t("expiresIn", { t: duration(left) }) + " · " + shortWhen(u.expires_at) : t("expired");
    };
    tick();
    countdown = setInterval(tick, 1000);
    append(main, [
      h("h1", { tabindex: "-1" }, t("unit") + " ", h("span", { class: "cid", id: "unit-cid" }, u.cid)),
      h("dl", { class: "meta" },
        h("dt", {}, t("type")), h("dd", {}, typeBadge(u.type)),
        h("dt", {}, t("cid")), h("dd", { class: "cid" }, u.cid),
        h("dt", {}, t("sourceLabel")), h("dd", { id: "unit-source" }, u.source),
        h("dt", {}, t("timestamp")), h("dd", {}, when(u.timestamp)),
        h("dt", {}, t("ttl")), h("dd", {}, u.ttl > 1e12 ? t("never") : duration(u.ttl)),
        h("dt", {}, t("expires")), h("dd", {}, expires),
        h("dt", {}, t("seq")), h("dd", {}, u.seq !== undefined ? String(u.seq) : "—"),
        h("dt", {}, t("parent")), h("dd", {}, u.parent_cid ? unitLink(u.parent_cid) : "—")),
      h("h2", {}, t("content")),
      h("pre", { class: "content", id: "unit-content", tabindex: "0" }, u.content),
      h("h2", {}, t("metadata")),
      h("pre", { class: "json", id: "unit-metadata", tabindex: "0" }, u.metadata === null ? "null" : JSON.stringify(u.metadata, null, 2)),
      h("h2", {}, t("lineage")),
      lineageTree(lin),
    ]);
    if (lin.truncated) main.appendChild(h("p", { class: "muted" }, t("truncated", { n: lin.omitted.length })));
    if (isAdmin()) main.appendChild(forgetOne(u.cid));
  }

  function lineageTree(lin) {
    const node = (u, current) => h("span", { class: "node" }, typeBadge(u.type),
      current ? h("span", { class: "cid" }, u.cid) : unitLink(u.cid), current ? h("span", { class: "muted" }, "(" + t("thisUnit") + ")") : null,
      h("span", { class: "muted small" }, preview(u.content, 80)));
    const root = h("ul", { class: "tree", id: "lineage" });
    let holder = root;
    for (const a of lin.ancestors.slice().reverse()) {
      const li = h("li", { class: "ancestor" }, node(a, false));
      holder.appendChild(li);
      const ul = h("ul");
      li.appendChild(ul);
      holder = ul;
    }
    const self = h("li", { class: "current" }, node(lin.unit, true));
    holder.appendChild(self);
    if (lin.children.length) self.appendChild(h("ul", { id: "children" }, lin.children.map((c) => h("li", { class: "child" }, node(c, false)))));
    else self.appendChild(h("p", { class: "muted small" }, t("noChildren")));
    return root;
  }

  function forgetOne(cid) {
    const box = h("section", { class: "actions", id: "forget-one" });
    const start = h("button", { type: "button", class: "plain", id: "forget-unit" }, t("forgetUnit"));
    start.addEventListener("click", () => {
      const yes = h("button", { type: "button", class: "danger", id: "forget-unit-confirm" }, t("reallyForget"));
      const no = h("button", { type: "button", class: "plain" }, t("cancel"));
      const confirmBox = h("div", { class: "confirm-box", role: "alertdialog", "aria-label": t("forgetUnit") },
        h("p", {}, t("confirmOne")), h("div", { class: "actions" }, yes, no));
      no.addEventListener("click", () => { confirmBox.remove(); start.hidden = false; start.focus(); });
      yes.addEventListener("click", async () => {
        yes.disabled = true;
        try {
          await api("DELETE", "/mcp/units/" + cid);
          flash = [t("forgotten", { n: 1 }), false];
          location.hash = "#/units";
        } catch (e) { sayError(e); yes.disabled = false; }
      });
      start.hidden = true;
      box.appendChild(confirmBox);
      yes.focus();
    });
    box.appendChild(start);
    return box;
  }

  async function viewUnits(main, state) {
    append(main, [h("h1", { tabindex: "-1" }, t("units")), h("p", { class: "muted", id: "units-order" }, t("unitsOrder")),
      filterForm("units", state, (s) => { location.hash = hashFor("units", s); })]);
    const list = h("ul", { class: "units", id: "unit-list" });
    const more = h("button", { type: "button", class: "plain", id: "load-more" }, t("loadMore"));
    const note = h("p", { class: "muted", id: "list-note" });
    const sentinel = h("div", { class: "sentinel", "aria-hidden": "true" });
    append(main, [list, note, h("div", { class: "actions" }, more), sentinel]);
    let cursor = null, busy = false, done = false;
    const params = { ...filtersBody(state), limit: PAGE };
    async function page() {
      if (busy || done) return;
      busy = true;
      more.disabled = true;
      note.textContent = t("loading");
      try {
        const rv = await api("GET", "/mcp/units", { params: cursor ? { ...params, cursor } : params });
        for (const u of rv.units) {
          list.appendChild(h("li", { class: "card unit", "data-cid": u.cid },
            h("header", {}, typeBadge(u.type), unitLink(u.cid), h("span", { class: "muted" }, u.source), h("span", { class: "muted" }, shortWhen(u.timestamp))),
            h("p", { class: "preview" }, preview(u.content, 160))));
        }
        cursor = rv.next_cursor;
        done = !cursor;
        note.textContent = done ? (list.children.length ? t("end") : t("noUnits")) : "";
        more.hidden = done;
      } catch (e) { sayError(e); note.textContent = ""; }
      finally { busy = false; more.disabled = false; }
      // a short page (selective filters) with more to come: keep going while the sentinel shows
      if (!done && sentinel.getBoundingClientRect().top < window.innerHeight + 200) setTimeout(page, 0);
    }
    more.addEventListener("click", page);
    const observer = new IntersectionObserver((entries) => { if (entries.some((e) => e.isIntersecting)) page(); }, { rootMargin: "200px" });
    observer.observe(sentinel);
    cleanups.push(() => observer.disconnect());
    await page();
  }

  async function viewTimeline(main) {
    main.appendChild(h("h1", { tabindex: "-1" }, t("timeline")));
    const s = await api("GET", "/mcp/stats");
    const kpi = (label, value, id) => h("div", { class: "kpi" }, h("span", { class: "muted small" }, label), h("b", { id }, value));
    append(main, [h("div", { class: "kpis", id: "stats" },
      kpi(t("totalUnits"), String(s.units), "stat-units"), kpi(t("totalBytes"), bytes(s.bytes), "stat-bytes"),
      kpi(t("oldest"), shortWhen(s.oldest)), kpi(t("newest"), shortWhen(s.newest)),
      kpi(t("pending"), String(s.index_pending)), kpi(t("lag"), s.replica_lag_ms + " ms"),
      kpi(t("dayFiles"), s.day_files.count + " · " + bytes(s.day_files.bytes)),
      s.streams ? kpi(t("streams"), s.streams.open + " / " + s.streams.tenant_limit, "stat-streams") : null)]);
    main.appendChild(h("h2", {}, t("perDay")));
    if (!s.days.length) { main.appendChild(h("p", {}, t("noData"))); return; }
    const types = Object.keys(s.types);
    main.appendChild(h("div", { class: "legend" }, types.map((type) => h("span", {}, h("i", { class: typeClass(type) }), type))));
    const wrap = h("div", { class: "chart-wrap" });
    main.appendChild(wrap);
    wrap.appendChild(chart(s.days, types, Math.max(280, wrap.clientWidth - 20)));
    main.appendChild(h("h2", {}, t("perType")));
    main.appendChild(h("div", { class: "table-wrap" }, h("table", { class: "stats", id: "type-table" },
      h("thead", {}, h("tr", {}, h("th", {}, t("type")), h("th", { class: "num" }, t("count")), h("th", { class: "num" }, t("bytes")))),
      h("tbody", {}, types.map((type) => h("tr", {}, h("td", {}, typeBadge(type)), h("td", { class: "num" }, String(s.types[type].units)),
        h("td", { class: "num" }, bytes(s.types[type].bytes))))))));
  }

  function chart(days, types, room) {
    const gap = 6, height = 180, top = 16, bottom = 36, left = 36;
    const bar = Math.max(8, Math.min(44, Math.floor((room - left - gap) / days.length) - gap));
    const every = Math.max(1, Math.ceil(44 / (bar + gap)));     // a label needs ~40 px
    const max = Math.max(1, ...days.map((d) => d.units));
    const width = left + days.length * (bar + gap) + gap;
    const root = svg("svg", { width, height: top + height + bottom, role: "img", "aria-label": t("chart"), id: "chart" });
    root.appendChild(svg("title", {}, t("chart")));
    root.appendChild(svg("text", { x: 2, y: top + 4 }, String(max)));
    root.appendChild(svg("text", { x: 2, y: top + height }, "0"));
    root.appendChild(svg("line", { x1: left - 4, y1: top + height + 0.5, x2: width, y2: top + height + 0.5, stroke: "#d0d7de" }));
    days.forEach((d, i) => {
      const x = left + gap + i * (bar + gap);
      let y = top + height;
      for (const type of types) {
        const n = d.types[type] || 0;
        if (!n) continue;
        const hgt = Math.max(1, Math.round(n / max * height));
        y -= hgt;
        const rect = svg("rect", { x, y, width: bar, height: hgt, class: typeClass(type), "data-day": d.day, "data-type": type });
        rect.appendChild(svg("title", {}, `${d.day} ${type}: ${n}`));
        root.appendChild(rect);
      }
      if (i % every === 0) {
        root.appendChild(svg("text", { x, y: top + height + 14 }, d.day.slice(5)));
      }
    });
    return root;
  }

  // The dry run a click on its button asked for in this page: a link to #/forget?run=… alone never runs one.
  let armedRun = null;
  async function viewForget(main, state) {
    main.appendChild(h("h1", { tabindex: "-1" }, t("forget")));
    if (!isAdmin()) { main.appendChild(h("p", {}, t("adminOnly"))); return; }
    main.appendChild(h("p", { class: "muted small" }, t("forgetHelp")));
    const result = h("section", { id: "forget-result", "aria-live": "polite" });
    const body = () => {
      const b = filtersBody(state);
      if (state.q) b.query = state.q;
      if (state.operator) b.operator = state.operator;
      return b;
    };
    main.appendChild(filterForm("forget", state, (s) => {
      armedRun = String(Date.now());
      location.hash = hashFor("forget", { ...s, run: armedRun });
    }));
    main.appendChild(result);
    if (!state.run || state.run !== armedRun) return;      // the filters are filled in; the button runs it
    armedRun = null;
    const dry = await api("POST", "/mcp/forget", { body: body() });
    append(result, [h("p", { id: "forget-count" }, t("dryRunResult", { n: dry.count }))]);
    if (dry.sample.length) {
      result.appendChild(h("h2", {}, t("sample")));
      result.appendChild(h("ul", { class: "units" }, dry.sample.map((u) => h("li", { class: "card" },
        h("header", {}, typeBadge(u.type), unitLink(u.cid), h("span", { class: "muted" }, u.source), h("span", { class: "muted" }, shortWhen(u.timestamp)))))));
    }
    if (!dry.count) return;
    const go = h("button", { type: "button", class: "danger", id: "forget-confirm" }, t("forgetN", { n: dry.count }));
    go.addEventListener("click", async () => {
      go.disabled = true;
      try {
        const rv = await api("POST", "/mcp/forget", { body: { ...body(), confirm: dry.confirm } });
        go.remove();
        result.appendChild(h("p", { id: "forget-done" }, t("forgotten", { n: rv.forgotten })));
        say(t("forgotten", { n: rv.forgotten }));
      } catch (e) { sayError(e); go.disabled = false; }
    });
    result.appendChild(h("div", { class: "actions" }, go));
  }

  // --- routing -----------------------------------------------------------------------------------
  let cleanups = [];
  function parseRoute() {
    const raw = location.hash.replace(/^#\/?/, "");
    const [path, query] = raw.split("?");
    const parts = path.split("/");
    const state = Object.fromEntries(new URLSearchParams(query || ""));
    return { name: parts[0] || "search", arg: parts[1], state };
  }

  let rendering = 0;
  let flash = null;     // [text, isError] shown once by the next render
  async function render() {
    const mine = ++rendering;
    if (countdown) { clearInterval(countdown); countdown = null; }
    cleanups.forEach((fn) => fn());
    cleanups = [];
    let route = parseRoute();
    if (session.tenant === null && route.name !== "signin") route = { name: "signin", state: {} };
    if (session.tenant !== null && route.name === "signin") route = { name: "search", state: {} };
    renderChrome(route);
    const main = clear($("main"));
    say(flash ? flash[0] : "", flash ? flash[1] : false);
    flash = null;
    try {
      if (route.name === "signin") viewSignin(main);
      else if (route.name === "units") await viewUnits(main, route.state);
      else if (route.name === "unit") await viewUnit(main, route.arg || "");
      else if (route.name === "timeline") await viewTimeline(main);
      else if (route.name === "forget") await viewForget(main, route.state);
      else await viewSearch(main, route.state);
    } catch (e) {
      if (mine === rendering) sayError(e);
    }
    main.dataset.ready = route.name;
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
  }

  // keyboard: "/" focuses the query; "g" then s/u/t/f switches sections
  let pendingG = false;
  document.addEventListener("keydown", (ev) => {
    const tag = (ev.target && ev.target.tagName) || "";
    if (["INPUT", "TEXTAREA", "SELECT"].includes(tag) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (ev.key === "/") {
      ev.preventDefault();
      if (parseRoute().name !== "search") location.hash = "#/search";
      else if ($("search-q")) $("search-q").focus();
      return;
    }
    if (pendingG) {
      pendingG = false;
      const to = { s: "#/search", u: "#/units", t: "#/timeline", f: "#/forget" }[ev.key];
      if (to) { ev.preventDefault(); location.hash = to; }
      return;
    }
    if (ev.key === "g") pendingG = true;
  });

  // after a route change the new page's heading takes the focus, unless the page gave it to a field
  window.addEventListener("hashchange", () => {
    render().then(() => {
      const main = $("main"), hd = main.querySelector("h1");
      if (hd && !main.contains(document.activeElement)) hd.focus({ preventScroll: true });
    });
  });
  // the skip link moves the focus only: its #main must not become a route
  $("skip-link").addEventListener("click", (ev) => { ev.preventDefault(); $("main").focus(); });
  $("lang").addEventListener("click", () => {
    lang = lang === "zh" ? "en" : "zh";
    localStorage.setItem(LANG_SLOT, lang);
    render();
  });

  async function boot() {
    try {
      // A stored key, or no key at all: the open (no-keys, loopback) mode answers without one.
      await startSession(session.key);
    } catch (e) {
      if (!(e instanceof ApiError)) sayError(e);
    }
    await render();
    document.body.dataset.booted = "1";
  }
  boot();
})();
