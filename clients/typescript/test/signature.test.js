// The vectors the server's signing is tested on too (src/engine/deliver.rs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { verifySignature, verifyWebhook } from "chime-client";

const vectors = JSON.parse(readFileSync(new URL("../../signature-vectors.json", import.meta.url), "utf8"));

test("every verify vector", () => {
  assert.ok(vectors.verify.length > 20);
  for (const c of vectors.verify) {
    assert.equal(verifySignature(Buffer.from(c.body, "utf8"), c.header, c.secrets, c.tolerance, c.now), c.expected, c.name);
    assert.equal(verifySignature(c.body, c.header, c.secrets, c.tolerance, c.now), c.expected, `${c.name} (body as text)`);
  }
});

test("the server's headers verify", () => {
  for (const v of vectors.signatures) {
    assert.equal(verifySignature(v.body, v.header, [v.secret], 300, v.t), true, v.name);
  }
});

test("every Standard Webhooks vector", () => {
  const swh = vectors.standard_webhooks;
  assert.ok(swh.verify.length > 20);
  for (const c of swh.verify) {
    assert.equal(verifyWebhook(Buffer.from(c.body, "utf8"), c.headers, c.secrets, c.tolerance, c.now), c.expected, c.name);
    assert.equal(verifyWebhook(c.body, new Headers(c.headers), c.secrets, c.tolerance, c.now), c.expected, `${c.name} (fetch Headers)`);
  }
  for (const v of swh.signatures) {
    const headers = { "webhook-id": v.id, "webhook-timestamp": String(v.t), "webhook-signature": v.signature };
    assert.equal(verifyWebhook(v.body, headers, v.secret, 300, v.t), true, v.name);
  }
});

test("odd arguments are refused, not thrown", () => {
  assert.equal(verifyWebhook("{}", { "webhook-signature": "v1,x", "webhook-id": "m", "webhook-timestamp": "1" }, ["", null], 300, 1), false);
  assert.equal(verifySignature("{}", undefined, ["s"]), false);
  assert.equal(verifySignature("{}", `t=1,v1=${"0".repeat(64)}`, ["", null], 300, 1), false);
});
