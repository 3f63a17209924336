// Checking a callback's signature (docs/book/src/callbacks.md): chime's own
// `Chime-Signature`, or Standard Webhooks' headers (docs/book/src/standard-webhooks.md).
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

/** A request's headers: a plain object (Node's `req.headers`, names lowercase or not) or a fetch `Headers`. */
export type HeadersLike = Record<string, string | string[] | undefined> | { get(name: string): string | null };

/**
 * Whether a callback or failure notice is signed, in either of a biz type's signing schemes.
 *
 * With a `webhook-signature` header (a biz type whose `signing_scheme` is
 * `standard-webhooks`): `v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">`,
 * keyed by the base64-decoded part of each `whsec_` secret, several space-separated during a
 * rotation; any secret matching any `v1` is enough. Otherwise the `Chime-Signature`, as
 * `verifySignature` checks it. `body`, `secrets`, `tolerance` and `now` are as
 * `verifySignature` takes them. Never throws on malformed headers.
 */
export function verifyWebhook(
  body: Uint8Array | string,
  headers: HeadersLike,
  secrets: string | readonly string[],
  tolerance = 300,
  now?: number,
): boolean {
  const header = (name: string): string | undefined => headerOf(headers, name);
  const signature = header("webhook-signature");
  if (signature === undefined) return verifySignature(body, header("chime-signature"), secrets, tolerance, now);
  const id = header("webhook-id");
  const t = header("webhook-timestamp");
  if (!signature || !id || !t || !T.test(t)) return false;
  const keys = (typeof secrets === "string" ? [secrets] : [...secrets]).map(whsecKey).filter((k): k is Buffer => k !== null);
  if (keys.length === 0) return false;
  const clock = now ?? Date.now() / 1000;
  if (Math.abs(clock - Number(t)) > tolerance) return false;
  const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body;
  const sent = signature.split(" ").filter((part) => part.startsWith("v1,")).map((part) => Buffer.from(part.slice(3)));
  let valid = false;
  for (const key of keys) {
    const expected = Buffer.from(createHmac("sha256", key).update(`${id}.${t}.`).update(bytes).digest("base64"));
    for (const candidate of sent) {
      // Every pair is compared, so the time taken does not say which one matched.
      if (candidate.length === expected.length && timingSafeEqual(expected, candidate)) valid = true;
    }
  }
  return valid;
}

function headerOf(headers: HeadersLike, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === "function") {
    return (headers as { get(name: string): string | null }).get(name) ?? undefined;
  }
  for (const [key, value] of Object.entries(headers as Record<string, string | string[] | undefined>)) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value.join(", ") : value;
  }
  return undefined;
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** The key of a `whsec_<base64>` secret; null for a secret not in that form. */
function whsecKey(secret: unknown): Buffer | null {
  if (typeof secret !== "string" || !secret.startsWith("whsec_")) return null;
  const encoded = secret.slice("whsec_".length);
  if (encoded === "" || !BASE64.test(encoded)) return null;
  return Buffer.from(encoded, "base64");
}
