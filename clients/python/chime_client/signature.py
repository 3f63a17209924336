"""Checking a callback's ``Chime-Signature`` header (docs/book/src/callbacks.md)."""

import hashlib
import hmac
import re
import time
from typing import Iterable, Optional, Union

# t in ASCII digits only: int() would also take "+1", " 1" and other scripts' digits.
_T = re.compile(r"[0-9]{1,12}\Z")
_V1 = re.compile(r"[0-9a-f]{64}\Z")


def verify_signature(
    body: Union[bytes, str],
    header: Optional[str],
    secrets: Union[str, bytes, Iterable[Union[str, bytes]]],
    tolerance: int = 300,
    now: Optional[float] = None,
) -> bool:
    """Whether ``header`` (the ``Chime-Signature`` of a callback) signs ``body``.

    ``body`` is the request body exactly as received (bytes; text is taken as UTF-8).
    ``secrets`` is the biz type's signing secret, or several (the old and the new one while a
    rotation overlaps); the header may carry several ``v1=`` during a rotation too: any
    secret matching any ``v1`` is enough. A ``t`` more than ``tolerance`` seconds from
    ``now`` (default: this machine's clock), before or after, is refused, so a captured
    callback cannot be replayed later. Compares in constant time. Never raises on a
    malformed header: it is simply not a valid signature.
    """
    if not isinstance(header, str) or not header:
        return False
    if isinstance(secrets, (str, bytes)):
        secrets = [secrets]
    keys = [s.encode() if isinstance(s, str) else bytes(s) for s in secrets if s]
    if not keys:
        return False
    if isinstance(body, str):
        body = body.encode()
    t = None
    sent = []
    for part in header.split(","):
        name, eq, value = part.partition("=")
        if not eq:
            return False
        if name == "t":
            if t is not None or not _T.match(value):
                return False
            t = value
        elif name == "v1":
            sent.append(value)
        # Other schemes (v0=…) are ignored, so that a later one can be added beside v1.
    if t is None or not sent:
        return False
    clock = time.time() if now is None else now
    if abs(clock - int(t)) > tolerance:
        return False
    signed = t.encode() + b"." + body
    valid = False
    for key in keys:
        expected = hmac.new(key, signed, hashlib.sha256).hexdigest()
        for candidate in sent:
            # Every pair is compared, so the time taken does not say which one matched.
            if _V1.match(candidate) and hmac.compare_digest(expected, candidate):
                valid = True
    return valid
