"""Client of chime, the timer service on PostgreSQL: its REST API and the check of its callbacks' signatures."""

__version__ = "0.1.0"

from .client import BatchResult, Client, Consumer, Page, Resource  # noqa: E402
from .errors import (  # noqa: E402
    BadRequest, ChimeError, Conflict, InternalError, InvalidArgument, InvalidState, KeyConflict,
    MethodNotAllowed, NotFound, PayloadTooLarge, PermissionDenied, RateLimited, RequestTimeout,
    StaleReceipt, TaskRunning, TransportError, Unauthenticated, Unavailable,
)
from .signature import verify_signature, verify_webhook  # noqa: E402

__all__ = [
    "Client", "Consumer", "Page", "Resource", "BatchResult", "verify_signature", "verify_webhook",
    "ChimeError", "TransportError", "BadRequest", "Unauthenticated", "PermissionDenied", "NotFound",
    "MethodNotAllowed", "RequestTimeout", "Conflict", "KeyConflict", "TaskRunning", "InvalidState",
    "StaleReceipt", "PayloadTooLarge", "InvalidArgument", "RateLimited", "Unavailable", "InternalError",
]
