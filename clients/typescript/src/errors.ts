// Errors, one class per error code of the API (`{"error": {"code", "message"}}`).

/**
 * An answer of the API that is an error, or no answer at all. `status` is the HTTP status
 * (0 when no answer came), `code` the API's error code (`"key_conflict"`, `"not_found"`…),
 * `message` its explanation, `retryAfter` the seconds a 429 or 503 asked to wait, if it did.
 */
export class ChimeError extends Error {
  static readonly code: string = "error";
  readonly status: number;
  readonly code: string;
  readonly retryAfter: number | null;

  constructor(message: string, status = 0, code?: string | null, retryAfter: number | null = null, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.status = status;
    this.code = code ?? (new.target as unknown as typeof ChimeError).code;
    this.retryAfter = retryAfter;
  }
}

/** No answer: the connection failed, broke or timed out. The request may have been done. */
export class TransportError extends ChimeError { static override readonly code = "transport"; }
export class BadRequestError extends ChimeError { static override readonly code = "bad_request"; }
export class UnauthenticatedError extends ChimeError { static override readonly code = "unauthenticated"; }
export class PermissionDeniedError extends ChimeError { static override readonly code = "permission_denied"; }
export class NotFoundError extends ChimeError { static override readonly code = "not_found"; }
export class MethodNotAllowedError extends ChimeError { static override readonly code = "method_not_allowed"; }
export class RequestTimeoutError extends ChimeError { static override readonly code = "request_timeout"; }
/** 409; the subclasses say which conflict it is. */
export class ConflictError extends ChimeError { static override readonly code: string = "conflict"; }
/** 409: the key is held by a task created by a different request. */
export class KeyConflictError extends ConflictError { static override readonly code = "key_conflict"; }
/** 409: an `on_conflict: "replace"` met the key's task running. */
export class TaskRunningError extends ConflictError { static override readonly code = "task_running"; }
/** 409: the operation needs another state (cancelling a finished task…). */
export class InvalidStateError extends ConflictError { static override readonly code = "invalid_state"; }
/** 409: a pull receipt whose reservation is over; drop the task. */
export class StaleReceiptError extends ConflictError { static override readonly code = "stale_receipt"; }
export class PayloadTooLargeError extends ChimeError { static override readonly code = "payload_too_large"; }
/** 422: a field is invalid; the message names it. */
export class InvalidArgumentError extends ChimeError { static override readonly code = "invalid_argument"; }
/** 429: the biz type's create rate limit; `retryAfter` says when to try again. */
export class RateLimitedError extends ChimeError { static override readonly code = "rate_limited"; }
/** 503: the database cannot be reached, or chime is starting or stopping; retry. */
export class UnavailableError extends ChimeError { static override readonly code = "unavailable"; }
export class InternalError extends ChimeError { static override readonly code = "internal"; }

type ErrorClass = new (message: string, status?: number, code?: string | null, retryAfter?: number | null) => ChimeError;

const byCode: Record<string, ErrorClass> = Object.fromEntries(
  [BadRequestError, UnauthenticatedError, PermissionDeniedError, NotFoundError, MethodNotAllowedError, RequestTimeoutError,
    ConflictError, KeyConflictError, TaskRunningError, InvalidStateError, StaleReceiptError, PayloadTooLargeError,
    InvalidArgumentError, RateLimitedError, UnavailableError, InternalError].map((cls) => [cls.code, cls]),
);

const byStatus: Record<number, ErrorClass> = {
  400: BadRequestError, 401: UnauthenticatedError, 403: PermissionDeniedError, 404: NotFoundError,
  405: MethodNotAllowedError, 408: RequestTimeoutError, 409: ConflictError, 413: PayloadTooLargeError,
  422: InvalidArgumentError, 429: RateLimitedError, 500: InternalError, 503: UnavailableError,
};

/** The error for an answer: by its code, else (a code unknown here, or an answer that is not chime's JSON) by its status. */
export function errorFor(status: number, code: string | null | undefined, message: string, retryAfter: number | null = null): ChimeError {
  const cls = (code ? byCode[code] : undefined) ?? byStatus[status] ?? ChimeError;
  return new cls(message, status, code ?? null, retryAfter);
}
