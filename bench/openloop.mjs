// Open-loop load generator (issue 17): requests are sent on a fixed schedule (rate per second),
// whether or not earlier ones were answered, so a slow server cannot slow the offered load down
// and hide its queueing (coordinated omission). Each latency is measured from the request's
// *scheduled* time to the end of its response. Bounded: `duration` seconds of sending, then at most
// `drain` seconds for answers; at most `maxInflight` open requests (more are counted as dropped).
//
//   node bench/openloop.mjs --url http://127.0.0.1:5000/mcp/push --bodies FILE --rate 1000 --duration 10
//
// FILE: one JSON body per line; "@N@" in a body is replaced by a unique nonce. Prints one line
// "JSON {...}" with the figures.
import fs from "node:fs";
import http from "node:http";
import { performance } from "node:perf_hooks";

const opts = { rate: 1000, duration: 10, drain: 30, maxInflight: 1024, nonce: `o${Date.now()}` };
const argv = process.argv.slice(2);
for (let k = 0; k < argv.length; k += 2) {
  const key = argv[k].replace(/^--/, "").replace(/-([a-z])/g, (_, c) => c.toUpperCase());
  opts[key] = ["url", "bodies", "nonce"].includes(key) ? argv[k + 1] : Number(argv[k + 1]);
}
const url = new URL(opts.url);
const bodies = fs.readFileSync(opts.bodies, "utf8").split("\n").filter(Boolean);
const agent = new http.Agent({ keepAlive: true, maxSockets: opts.maxInflight });
const total = Math.round(opts.rate * opts.duration);
const interval = 1000 / opts.rate;
const lat = [];
let inflight = 0, done = 0, errors = 0, socketErrors = 0, dropped = 0, i = 0;
const statuses = {};

function fire(n, scheduled) {
  if (inflight >= opts.maxInflight) { dropped++; return; }
  inflight++;
  const body = bodies[n % bodies.length].replace("@N@", `${opts.nonce}-${n}`);
  const req = http.request({ agent, host: url.hostname, port: url.port, path: url.pathname, method: "POST",
    headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) } }, (res) => {
    res.resume();
    res.on("end", () => {
      inflight--; done++;
      statuses[res.statusCode] = (statuses[res.statusCode] || 0) + 1;
      if (res.statusCode !== 200) errors++;
      lat.push(performance.now() - scheduled);
    });
  });
  // (a connection the server closed as the request went out: counted apart from HTTP errors)
  req.on("error", () => { inflight--; socketErrors++; });
  req.end(body);
}

function pct(sorted, p) {
  if (!sorted.length) return null;
  return Math.round(sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] * 1000) / 1000;
}

const start = performance.now();
const timer = setInterval(() => {
  const now = performance.now();
  while (i < total && start + i * interval <= now) { fire(i, start + i * interval); i++; }
  if (i >= total) {
    clearInterval(timer);
    const sendEnd = performance.now();
    const waitEnd = sendEnd + opts.drain * 1000;
    const finish = setInterval(() => {
      if (inflight > 0 && performance.now() < waitEnd) return;
      clearInterval(finish);
      const sorted = lat.slice().sort((a, b) => a - b);
      const out = { offered_per_s: opts.rate, scheduled: total, answered: done, errors, socket_errors: socketErrors, dropped,
        unanswered: inflight, send_s: Math.round(sendEnd - start) / 1000,
        achieved_per_s: Math.round(done / ((sendEnd - start) / 1000)), statuses,
        p50: pct(sorted, 50), p90: pct(sorted, 90), p99: pct(sorted, 99), "p99.9": pct(sorted, 99.9),
        max: pct(sorted, 100) };
      console.log("JSON " + JSON.stringify(out));
      agent.destroy();
      process.exit(0);
    }, 20);
  }
}, 1);
