export { Client, VERSION } from "./client.js";
export type { BatchResult, ClientOptions, ConsumerOptions } from "./client.js";
export { verifySignature } from "./signature.js";
export * from "./errors.js";
export type * from "./types.js";
