// The client against a real chime (clients/test.sh starts it) and a real receiver.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import {
  Client, ChimeError, InvalidArgumentError, InvalidStateError, KeyConflictError, NotFoundError, PermissionDeniedError,
  StaleReceiptError, TransportError, UnauthenticatedError, UnavailableError, verifySignature,
} from "chime-client";
import { URL_ as URL, biz, collect, droppingProxy, receiver, requireChime, waitFor } from "./support.js";

let hooks, pull, other, rx;

before(async () => {
  requireChime();
  rx = await receiver();
  hooks = await biz("hooks", { callback_url: rx.url, timeout_ms: 5000, backoff_initial_ms: 100, backoff_max_ms: 1000 });
  pull = await biz("pull", { mode: "pull", timeout_ms: 30000, backoff_initial_ms: 100, backoff_max_ms: 1000 });
  other = await biz("other", { callback_url: rx.url });
});

after(() => rx.close());

/** Rejects with an error of `cls`; answers it. */
async function rejects(cls, promise) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    assert.ok(e instanceof ChimeError);
    return e;
  }
  assert.fail(`expected ${cls.name}, nothing was thrown`);
}

describe("callbacks", () => {
  test("a task is called back and its signature verifies", async () => {
    const client = new Client(URL, hooks.token);
    const key = `order-${randomUUID()}`;
    const task = await client.create({ biz_type: hooks.name, key, payload: { order: 123, name: "Zoë" } });
    assert.deepEqual([task.status, task.key, task.payload, task.created], ["pending", key, { order: 123, name: "Zoë" }, true]);
    const call = await waitFor("the callback", () => rx.calls.find((c) => c.headers["chime-task-id"] === task.id));
    const signature = call.headers["chime-signature"];
    assert.equal(verifySignature(call.body, signature, hooks.secret), true);
    assert.equal(verifySignature(call.body, signature, ["whsec_old_one_000000000", hooks.secret]), true);
    assert.equal(verifySignature(call.body, signature, other.secret), false);
    assert.equal(verifySignature(Buffer.concat([call.body, Buffer.from(" ")]), signature, hooks.secret), false);
    assert.deepEqual(JSON.parse(call.body.toString("utf8")).payload, { order: 123, name: "Zoë" });
    const done = await waitFor("succeeded", async () => {
      const t = await client.get(task.id);
      return t.status === "succeeded" && t;
    });
    assert.equal(done.attempts[0].status_code, 200);
  });
});

describe("tasks", () => {
  test("by key: read, reschedule, cancel", async () => {
    const client = new Client(URL, hooks.token);
    const key = `order/${randomUUID()}`;
    const created = await client.create({ biz_type: hooks.name, key, delay_ms: 3_600_000, payload: { n: 1 } });
    const found = await client.getByKey(hooks.name, key);
    assert.deepEqual([found.id, found.payload], [created.id, { n: 1 }]);
    const moved = await client.rescheduleByKey(hooks.name, key, { run_at: "2030-01-01T09:00:00Z", payload: { n: 2 } });
    assert.deepEqual([moved.id, moved.run_at, moved.payload], [created.id, "2030-01-01T09:00:00Z", { n: 2 }]);
    assert.equal((await client.cancelByKey(hooks.name, key)).status, "cancelled");
    assert.equal((await client.getByKey(hooks.name, key)).status, "cancelled");
    const e = await rejects(InvalidStateError, client.cancelByKey(hooks.name, key));
    assert.deepEqual([e.status, e.code], [409, "invalid_state"]);
    assert.equal((await client.replay(created.id)).status, "pending");
    // Due now, so delivered.
    await waitFor("succeeded", async () => (await client.getByKey(hooks.name, key)).status === "succeeded");
  });

  test("deadlines: expires_at, ttl_ms", async () => {
    const client = new Client(URL, hooks.token);
    const at = await client.create({ biz_type: hooks.name, delay_ms: 3_600_000, expires_at: new Date("2031-01-01T00:00:00Z") });
    assert.equal(at.expires_at, "2031-01-01T00:00:00Z");
    const ttl = await client.create({ biz_type: hooks.name, run_at: "2030-01-01T00:00:00Z", ttl_ms: 60_000 });
    assert.equal(ttl.expires_at, "2030-01-01T00:01:00Z");
    const e = await rejects(InvalidArgumentError, client.create({ biz_type: hooks.name, delay_ms: 3_600_000, ttl_ms: 0 }));
    assert.match(e.message, /ttl_ms/);
    await client.cancel(at.id);
    await client.cancel(ttl.id);
  });

  test("priority", async () => {
    const client = new Client(URL, hooks.token);
    const urgent = await client.create({ biz_type: hooks.name, delay_ms: 3_600_000, priority: 8 });
    assert.equal(urgent.priority, 8);
    const plain = await client.create({ biz_type: hooks.name, delay_ms: 3_600_000 });
    assert.equal(plain.priority, 5, "5 when left out");
    assert.equal((await client.reschedule(urgent.id, { priority: 2 })).priority, 2);
    const e = await rejects(InvalidArgumentError, client.create({ biz_type: hooks.name, delay_ms: 3_600_000, priority: 10 }));
    assert.equal(e.status, 422);
    assert.match(e.message, /priority/);
    await client.cancel(urgent.id);
    await client.cancel(plain.id);
  });

  test("flow key", async () => {
    const client = new Client(URL, hooks.token);
    const task = await client.create({ biz_type: hooks.name, delay_ms: 3_600_000, flow_key: "merchant-7" });
    assert.equal(task.flow_key, "merchant-7");
    assert.equal((await client.create({ biz_type: hooks.name, delay_ms: 3_600_000 })).flow_key, null);
    const e = await rejects(InvalidArgumentError, client.create({ biz_type: hooks.name, delay_ms: 3_600_000, flow_key: "" }));
    assert.equal(e.status, 422);
    assert.match(e.message, /flow_key/);
    await client.cancel(task.id);
  });

  test("bulk cancel and replay", async () => {
    const client = new Client(URL, hooks.token);
    const prefix = `bulk-${randomUUID()}-`;
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push((await client.create({ biz_type: hooks.name, key: `${prefix}${i}`, delay_ms: 3_600_000 })).id);
    assert.deepEqual(await client.cancelMatching(hooks.name, { key_prefix: prefix, dry_run: true }), { matched: 3, cancelled: 0, more: false });
    assert.deepEqual(await client.cancelMatching(hooks.name, { key_prefix: prefix }), { matched: 3, cancelled: 3 });
    for (const id of ids) assert.equal((await client.get(id)).status, "cancelled");
    assert.deepEqual(await client.replayMatching(hooks.name, { status: "failed", key_prefix: prefix }), { matched: 0, replayed: 0 });
    await rejects(InvalidArgumentError, client.cancelMatching(hooks.name, {}));
  });

  test("stats", async () => {
    // A paused biz type of its own: its tasks stay as created.
    const quiet = await biz("stats", { callback_url: rx.url, paused: true, max_in_flight: 4 });
    const client = new Client(URL, quiet.token);
    for (const delay_ms of [0, 3_600_000, 3_600_000]) await client.create({ biz_type: quiet.name, delay_ms });
    const stats = await client.stats(quiet.name);
    assert.deepEqual(stats.counts, { due: 1, pending: 3, running: 0, retrying: 0, failed: 0, expired: 0 });
    assert.deepEqual([stats.biz_type, stats.count_cap, stats.capped], [quiet.name, 10_000, []]);
    assert.deepEqual(stats.in_flight, { count: 0, max: 4 });
    assert.deepEqual(stats.lateness, { window_s: 60, attempts: 0, p50_ms: null, p99_ms: null });
    assert.ok(stats.oldest_due_age_ms >= 0);
    await rejects(PermissionDeniedError, new Client(URL, hooks.token).stats(quiet.name));
  });

  test("reschedule and cancel by id", async () => {
    const client = new Client(URL, hooks.token);
    const task = await client.create({ biz_type: hooks.name, delay_ms: 3_600_000 });
    assert.equal((await client.reschedule(task.id, { payload: null })).payload, null);
    assert.equal((await client.reschedule(task.id, { delay_ms: 7_200_000 })).id, task.id);
    assert.equal((await client.cancel(task.id)).status, "cancelled");
    assert.deepEqual((await client.get(task.id)).attempts, []);
  });

  test("on_conflict: reject, replace, keep", async () => {
    const client = new Client(URL, hooks.token);
    const key = `meeting-${randomUUID()}`;
    const request = { biz_type: hooks.name, key, delay_ms: 3_600_000, payload: { v: 1 } };
    const first = await client.create(request);
    const again = await client.create(request);
    assert.deepEqual([again.id, again.created], [first.id, false]);
    const e = await rejects(KeyConflictError, client.create({ ...request, payload: { v: 2 } }));
    assert.deepEqual([e.status, e.code], [409, "key_conflict"]);
    assert.ok(e.message.includes(key), e.message);
    const replaced = await client.create({ biz_type: hooks.name, key, run_at: "2031-01-01T00:00:00Z", payload: { v: 3 }, on_conflict: "replace" });
    assert.deepEqual([replaced.id, replaced.run_at, replaced.payload], [first.id, "2031-01-01T00:00:00Z", { v: 3 }]);
    const kept = await client.create({ biz_type: hooks.name, key, payload: { v: 4 }, on_conflict: "keep" });
    assert.deepEqual([kept.id, kept.payload, kept.created], [first.id, { v: 3 }, false]);
    await client.cancelByKey(hooks.name, key);
  });

  test("batch", async () => {
    const client = new Client(URL, hooks.token);
    const key = `batch-${randomUUID()}`;
    const results = await client.createBatch([
      { biz_type: hooks.name, key, delay_ms: 3_600_000 },
      { biz_type: hooks.name, key, delay_ms: 3_600_000 },
      { biz_type: hooks.name, run_at: "not a time" },
    ]);
    assert.deepEqual(results.map((r) => r.status), [201, 200, 422]);
    assert.equal(results[0].task.id, results[1].task.id);
    assert.ok(results[2].error instanceof InvalidArgumentError);
    assert.match(results[2].error.message, /run_at/);
    await client.cancel(results[0].task.id);
  });

  test("list iterates every page", async () => {
    const own = await biz("list", { callback_url: rx.url });
    const client = new Client(URL, own.token);
    const ids = [];
    for (let i = 0; i < 7; i++) ids.push((await client.create({ biz_type: own.name, delay_ms: 3_600_000 + i, payload: { i } })).id);
    assert.deepEqual((await collect(client.list({ status: "pending", limit: 3 }))).map((t) => t.id), ids);
    assert.equal((await client.listPage({ limit: 3 })).items.length, 3);
    assert.deepEqual(await collect(client.list({ status: "succeeded" })), []);
  });
});

describe("errors", () => {
  test("401, 403, 404, 409 and 422 each have their type", async () => {
    const client = new Client(URL, hooks.token);
    let e = await rejects(UnauthenticatedError, new Client(URL, "chime_not_a_token").get(randomUUID()));
    assert.deepEqual([e.status, e.code], [401, "unauthenticated"]);
    const theirs = await new Client(URL, other.token).create({ biz_type: other.name, delay_ms: 3_600_000 });
    assert.equal((await rejects(PermissionDeniedError, client.get(theirs.id))).status, 403);
    await rejects(PermissionDeniedError, client.getByKey(other.name, "anything"));
    e = await rejects(NotFoundError, client.get(randomUUID()));
    assert.deepEqual([e.status, e.code], [404, "not_found"]);
    await rejects(NotFoundError, client.getByKey(hooks.name, `never-${randomUUID()}`));
    e = await rejects(InvalidArgumentError, client.create({ biz_type: hooks.name, run_at: "tomorrow" }));
    assert.equal(e.status, 422);
    assert.match(e.message, /^run_at/);
    const done = await client.create({ biz_type: hooks.name, delay_ms: 3_600_000 });
    await client.cancel(done.id);
    assert.equal((await rejects(InvalidStateError, client.reschedule(done.id, { delay_ms: 1000 }))).status, 409);
  });
});

describe("retries with the same key", () => {
  test("a keyed create whose answer was lost is sent again and answers the stored task", async () => {
    const proxy = await droppingProxy();
    try {
      const client = new Client(proxy.url, hooks.token, { backoffMs: 50 });
      const key = `retry-${randomUUID()}`;
      const task = await client.create({ biz_type: hooks.name, key, delay_ms: 3_600_000, payload: { order: 7 } });
      assert.deepEqual([proxy.state.dropped, proxy.state.forwardedCreates], [1, 2]);
      assert.equal(task.created, false, "the retry found the task the first try stored (200)");
      const direct = new Client(URL, hooks.token);
      assert.equal((await direct.getByKey(hooks.name, key)).id, task.id);
      const mine = (await collect(direct.list({ status: "pending" }))).filter((t) => t.key === key);
      assert.equal(mine.length, 1);
      await direct.cancel(task.id);
    } finally {
      proxy.close();
    }
  });

  test("a keyed create answered 503 is sent again; an unkeyed one is not", async () => {
    const proxy = await droppingProxy({ unavailable: true });
    const unkeyed = await droppingProxy({ unavailable: true });
    try {
      const task = await new Client(proxy.url, hooks.token, { backoffMs: 50 }).create({ biz_type: hooks.name, key: `retry-${randomUUID()}`, delay_ms: 3_600_000 });
      assert.deepEqual([proxy.state.dropped, proxy.state.forwardedCreates, task.created], [1, 1, true]);
      await new Client(URL, hooks.token).cancel(task.id);
      const e = await rejects(UnavailableError, new Client(unkeyed.url, hooks.token, { backoffMs: 50 }).create({ biz_type: hooks.name, delay_ms: 3_600_000 }));
      assert.deepEqual([e.status, unkeyed.state.forwardedCreates], [503, 0]);
    } finally {
      proxy.close();
      unkeyed.close();
    }
  });

  test("an unkeyed create is not sent twice", async () => {
    const proxy = await droppingProxy();
    try {
      const client = new Client(proxy.url, hooks.token, { backoffMs: 50 });
      const marker = randomUUID();
      await rejects(TransportError, client.create({ biz_type: hooks.name, delay_ms: 3_600_000, payload: { marker } }));
      assert.equal(proxy.state.forwardedCreates, 1);
      const direct = new Client(URL, hooks.token);
      const stored = (await collect(direct.list({ status: "pending" }))).filter((t) => t.payload?.marker === marker);
      assert.equal(stored.length, 1, "the server stored the one try; the client did not send another");
      await direct.cancel(stored[0].id);
    } finally {
      proxy.close();
    }
  });
});

describe("timers", () => {
  test("create, get, update, deactivate, activate, list, delete", async () => {
    const client = new Client(URL, hooks.token);
    const key = `nightly-${randomUUID()}`;
    const timer = await client.createTimer({ biz_type: hooks.name, key, cron: "0 30 2 * * *", timezone: "Europe/Berlin", payload: { report: "daily" } });
    assert.deepEqual([timer.key, timer.active, timer.timezone, timer.next_fire_times.length], [key, true, "Europe/Berlin", 5]);
    assert.equal((await client.getTimer(timer.id)).cron, "0 30 2 * * *");
    const changed = await client.updateTimer(timer.id, { cron: "0 0 3 * * *", payload: { report: "weekly" } });
    assert.deepEqual([changed.cron, changed.payload], ["0 0 3 * * *", { report: "weekly" }]);
    const off = await client.deactivateTimer(timer.id);
    assert.deepEqual([off.active, off.next_fire_times], [false, []]);
    assert.equal((await client.activateTimer(timer.id)).active, true);
    assert.ok((await collect(client.listTimers({ limit: 1 }))).some((t) => t.id === timer.id));
    await rejects(InvalidArgumentError, client.updateTimer(timer.id, { cron: "every day" }));
    await client.deleteTimer(timer.id);
    await rejects(NotFoundError, client.getTimer(timer.id));
  });
});

describe("pull", () => {
  test("a consumer handles N tasks, then returns", async () => {
    const client = new Client(URL, pull.token);
    const ids = [];
    for (let i = 0; i < 5; i++) ids.push((await client.create({ biz_type: pull.name, payload: { i } })).id);
    const seen = [];
    const handled = await client.consume(pull.name, async (task) => { seen.push(task.id); }, { max: 2, wait_ms: 5000, limit: 5 });
    assert.equal(handled, 5);
    assert.deepEqual([...seen].sort(), [...ids].sort());
    for (const id of ids) assert.equal((await client.get(id)).status, "succeeded");
  });

  test("a failing handler nacks; aborting the signal stops the loop", async () => {
    const client = new Client(URL, pull.token);
    const task = await client.create({ biz_type: pull.name, payload: { fail: true } });
    assert.equal(await client.consume(pull.name, () => { throw new Error("no stock"); }, { wait_ms: 5000, limit: 1 }), 1);
    const afterNack = await client.get(task.id);
    assert.equal(afterNack.status, "pending");
    assert.match(afterNack.last_error, /no stock/);
    const stop = new AbortController();
    const handled = await client.consume(pull.name, () => stop.abort(), { wait_ms: 5000, signal: stop.signal });
    assert.equal(handled, 1, "the handler stopped the loop after the retried task");
    assert.equal((await client.get(task.id)).status, "succeeded");
  });

  test("a waiting consumer stops within wait_ms of the abort", async () => {
    const client = new Client(URL, pull.token);
    const stop = new AbortController();
    const started = Date.now();
    setTimeout(() => stop.abort(), 200);
    assert.equal(await client.consume(pull.name, () => {}, { wait_ms: 500, signal: stop.signal }), 0);
    assert.ok(Date.now() - started < 3000);
  });

  test("reserve, touch, ack; a stale receipt", async () => {
    const client = new Client(URL, pull.token);
    const task = await client.create({ biz_type: pull.name, payload: { touch: true } });
    const reserved = await waitFor("reserved", async () => {
      const tasks = await client.reserve(pull.name, { wait_ms: 2000, ttr_ms: 5000 });
      return tasks.length > 0 && tasks;
    });
    assert.equal(reserved[0].id, task.id);
    const touched = await client.touch(task.id, reserved[0].receipt, 60000);
    assert.ok(Date.parse(touched.reserved_until) > Date.parse(reserved[0].reserved_until));
    assert.equal((await client.ack(task.id, reserved[0].receipt)).status, "succeeded");
    await rejects(StaleReceiptError, client.ack(task.id, reserved[0].receipt));
  });
});
