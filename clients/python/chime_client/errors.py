"""Errors, one class per error code of the API (``{"error": {"code", "message"}}``)."""

from typing import Optional


class ChimeError(Exception):
    """An answer of the API that is an error, or no answer at all.

    ``status`` is the HTTP status (None when no answer came), ``code`` the API's error code
    (``"key_conflict"``, ``"not_found"``…), ``message`` its explanation, ``retry_after``
    the seconds a 429 or 503 asked to wait, when it did.
    """

    code = "error"

    def __init__(self, message: str, status: Optional[int] = None, code: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def __str__(self):
        where = f"{self.status} " if self.status else ""
        return f"{where}{self.code}: {self.message}"


class TransportError(ChimeError):
    """No answer: the connection failed, broke or timed out. The request may have been done."""

    code = "transport"


class BadRequest(ChimeError):
    code = "bad_request"  # 400


class Unauthenticated(ChimeError):
    code = "unauthenticated"  # 401


class PermissionDenied(ChimeError):
    code = "permission_denied"  # 403


class NotFound(ChimeError):
    code = "not_found"  # 404


class MethodNotAllowed(ChimeError):
    code = "method_not_allowed"  # 405


class RequestTimeout(ChimeError):
    code = "request_timeout"  # 408


class Conflict(ChimeError):
    """409. The subclasses say which conflict it is."""

    code = "conflict"


class KeyConflict(Conflict):
    """409: the key is held by a task created by a different request."""

    code = "key_conflict"


class TaskRunning(Conflict):
    """409: an ``on_conflict="replace"`` met the key's task running."""

    code = "task_running"


class InvalidState(Conflict):
    """409: the operation needs another state (cancelling a finished task…)."""

    code = "invalid_state"


class StaleReceipt(Conflict):
    """409: a pull receipt whose reservation is over; drop the task."""

    code = "stale_receipt"


class PayloadTooLarge(ChimeError):
    code = "payload_too_large"  # 413


class InvalidArgument(ChimeError):
    """422: a field is invalid; the message names it."""

    code = "invalid_argument"


class RateLimited(ChimeError):
    """429: the biz type's create rate limit; ``retry_after`` says when to try again."""

    code = "rate_limited"


class Unavailable(ChimeError):
    """503: the database cannot be reached, or chime is starting or stopping; retry."""

    code = "unavailable"


class InternalError(ChimeError):
    code = "internal"  # 500


_BY_CODE = {cls.code: cls for cls in (
    BadRequest, Unauthenticated, PermissionDenied, NotFound, MethodNotAllowed, RequestTimeout,
    Conflict, KeyConflict, TaskRunning, InvalidState, StaleReceipt, PayloadTooLarge,
    InvalidArgument, RateLimited, Unavailable, InternalError,
)}
_BY_STATUS = {400: BadRequest, 401: Unauthenticated, 403: PermissionDenied, 404: NotFound,
              405: MethodNotAllowed, 408: RequestTimeout, 409: Conflict, 413: PayloadTooLarge,
              422: InvalidArgument, 429: RateLimited, 500: InternalError, 503: Unavailable}


def error_for(status: int, code: Optional[str], message: str, retry_after: Optional[float] = None) -> ChimeError:
    """The error for an answer: by its code, else (a code this client does not know, or
    an answer that is not chime's JSON, e.g. from a proxy) by its status."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or ChimeError
    return cls(message, status=status, code=code or cls.code, retry_after=retry_after)
