// The vectors the server's signing is tested on too (src/engine/deliver.rs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { verifySignature } from "chime-client";

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

test("odd arguments are refused, not thrown", () => {
  assert.equal(verifySignature("{}", undefined, ["s"]), false);
  assert.equal(verifySignature("{}", `t=1,v1=${"0".repeat(64)}`, ["", null], 300, 1), false);
});
