// Checking a callback's `Chime-Signature` header (docs/book/src/callbacks.md).
import { createHmac, timingSafeEqual } from "node:crypto";

const T = /^[0-9]{1,12}$/;
const V1 = /^[0-9a-f]{64}$/;

/**
 * Whether `header` (the `Chime-Signature` of a callback) signs `body`, the request body
 * exactly as received (a Buffer/Uint8Array, or text taken as UTF-8: read the raw body, do not
 * re-serialise parsed JSON).
 *
 * `secrets` is the biz type's signing secret, or several (the old and the new one while a
 * rotation overlaps); the header may carry several `v1=` during a rotation too: any secret
 * matching any `v1` is enough. A `t` more than `tolerance` seconds from `now` (unix seconds,
 * default: this machine's clock), before or after, is refused, so that a captured callback
 * cannot be replayed later. Compares in constant time. A malformed header is simply not a
 * valid signature: this never throws on one.
 */
export function verifySignature(
  body: Uint8Array | string,
  header: string | null | undefined,
  secrets: string | readonly string[],
  tolerance = 300,
  now?: number,
): boolean {
  if (typeof header !== "string" || header === "") return false;
  const keys = (typeof secrets === "string" ? [secrets] : [...secrets]).filter((s) => typeof s === "string" && s !== "");
  if (keys.length === 0) return false;
  let t: string | null = null;
  const sent: string[] = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) return false;
    const name = part.slice(0, eq);
    const value = part.slice(eq + 1);
    if (name === "t") {
      if (t !== null || !T.test(value)) return false;
      t = value;
    } else if (name === "v1") {
      sent.push(value);
    }
    // Other schemes (v0=…) are ignored, so that a later one can be added beside v1.
  }
  if (t === null || sent.length === 0) return false;
  const clock = now ?? Date.now() / 1000;
  if (Math.abs(clock - Number(t)) > tolerance) return false;
  const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body;
  let valid = false;
  for (const key of keys) {
    const expected = Buffer.from(createHmac("sha256", key).update(`${t}.`).update(bytes).digest("hex"));
    for (const candidate of sent) {
      // Every pair is compared, so the time taken does not say which one matched.
      if (V1.test(candidate) && timingSafeEqual(expected, Buffer.from(candidate))) valid = true;
    }
  }
  return valid;
}
