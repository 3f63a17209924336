export { Client, VERSION } from "./client.js";
export type { BatchResult, ClientOptions, ConsumerOptions } from "./client.js";
export { verifySignature, verifyWebhook } from "./signature.js";
export type { HeadersLike } from "./signature.js";
export * from "./errors.js";
export type * from "./types.js";
