// What the suite needs around the client: the chime that clients/test.sh starts
// (CHIME_TEST_URL, CHIME_TEST_ADMIN_TOKEN), biz types made through the admin API, a real
// receiver and a proxy that breaks a connection.
import { createServer } from "node:http";
import { randomBytes } from "node:crypto";

export const URL_ = process.env.CHIME_TEST_URL ?? "";
const ADMIN = process.env.CHIME_TEST_ADMIN_TOKEN ?? "";
const RUN = randomBytes(3).toString("hex");

export function requireChime() {
  if (!URL_ || !ADMIN) throw new Error("CHIME_TEST_URL and CHIME_TEST_ADMIN_TOKEN are not set: run the suite with clients/test.sh typescript");
}

async function admin(method, path, body) {
  const answer = await fetch(URL_ + path, {
    method,
    headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await answer.text();
  if (!answer.ok) throw new Error(`admin ${method} ${path}: ${answer.status} ${text}`);
  return JSON.parse(text);
}

/** A fresh biz type: its name, signing secret and an API token. */
export async function biz(purpose, settings) {
  requireChime();
  const name = `ts-${RUN}-${purpose}`;
  const created = await admin("POST", "/api/v1/admin/biz-types", { name, ...settings });
  const { token } = await admin("POST", `/api/v1/admin/biz-types/${name}/tokens`);
  return { name, secret: created.signing_secret, token };
}

const listen = (server) => new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server.address().port)));

/** A real receiver: every callback's headers and raw body are kept in `calls`; it answers 200. */
export async function receiver() {
  const calls = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      calls.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.end("ok");
    });
  });
  const port = await listen(server);
  return { url: `http://127.0.0.1:${port}/hook`, calls, close: () => server.close() };
}

/**
 * Forwards to chime; the first `POST /api/v1/tasks` is forwarded and answered by chime, then
 * the connection to the client is destroyed without an answer, as a network failure after
 * the server stored the task would.
 */
export async function droppingProxy({ unavailable = false } = {}) {
  const state = { dropped: 0, forwardedCreates: 0 };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      // `unavailable`: the first create is answered 503 as chime does without its database, not forwarded.
      if (unavailable && req.method === "POST" && req.url === "/api/v1/tasks" && state.dropped === 0) {
        state.dropped++;
        res.writeHead(503, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "unavailable", message: "the database is unavailable; retry shortly" } }));
        return;
      }
      const headers = { ...req.headers };
      delete headers.host;
      delete headers.connection;
      delete headers["content-length"];
      const body = chunks.length ? Buffer.concat(chunks) : undefined;
      const answer = await fetch(URL_ + req.url, { method: req.method, headers, body });
      const text = await answer.text();
      if (req.method === "POST" && req.url === "/api/v1/tasks") {
        state.forwardedCreates++;
        if (state.dropped === 0) {
          state.dropped++;
          req.socket.destroy();
          return;
        }
      }
      res.writeHead(answer.status, { "content-type": answer.headers.get("content-type") ?? "application/json" });
      res.end(text);
    });
  });
  const port = await listen(server);
  return {
    url: `http://127.0.0.1:${port}`,
    state,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

export async function waitFor(what, check, ms = 15000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const value = await check();
    if (value) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what}: not within ${ms} ms`);
}

export async function collect(iterable) {
  const all = [];
  for await (const item of iterable) all.push(item);
  return all;
}
