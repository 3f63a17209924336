"""Checking a callback's signature (docs/book/src/callbacks.md): chime's own
``Chime-Signature``, or Standard Webhooks' headers (docs/book/src/standard-webhooks.md)."""

import base64
import binascii
import hashlib
import hmac
import re
import time
from typing import Iterable, Mapping, Optional, Union

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


def verify_webhook(
    body: Union[bytes, str],
    headers: Mapping[str, str],
    secrets: Union[str, bytes, Iterable[Union[str, bytes]]],
    tolerance: int = 300,
    now: Optional[float] = None,
) -> bool:
    """Whether a callback or failure notice is signed, in either of a biz type's signing schemes.

    ``headers`` are the request's (any mapping; names in any case). With a
    ``webhook-signature`` (a biz type whose ``signing_scheme`` is ``standard-webhooks``):
    ``v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">``, keyed by the
    base64-decoded part of each ``whsec_`` secret, several space-separated during a
    rotation; any secret matching any ``v1`` is enough. Otherwise the ``Chime-Signature``, as
    ``verify_signature`` checks it. ``body``, ``secrets``, ``tolerance`` and ``now`` are as
    ``verify_signature`` takes them. Never raises on malformed headers.
    """
    lowered = {str(k).lower(): v for k, v in headers.items()}
    signature = lowered.get("webhook-signature")
    if signature is None:
        return verify_signature(body, lowered.get("chime-signature"), secrets, tolerance, now)
    msg_id, t = lowered.get("webhook-id"), lowered.get("webhook-timestamp")
    if not all(isinstance(x, str) and x for x in (signature, msg_id, t)) or not _T.match(t):
        return False
    if isinstance(secrets, (str, bytes)):
        secrets = [secrets]
    keys = [k for k in (_whsec_key(s) for s in secrets) if k]
    if not keys:
        return False
    clock = time.time() if now is None else now
    if abs(clock - int(t)) > tolerance:
        return False
    if isinstance(body, str):
        body = body.encode()
    signed = msg_id.encode() + b"." + t.encode() + b"." + body
    sent = [part[3:] for part in signature.split(" ") if part.startswith("v1,")]
    valid = False
    for key in keys:
        expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for candidate in sent:
            # Every pair is compared, so the time taken does not say which one matched.
            if hmac.compare_digest(expected, candidate):
                valid = True
    return valid


def _whsec_key(secret: Union[str, bytes, None]) -> Optional[bytes]:
    """The key of a ``whsec_<base64>`` secret; None for a secret not in that form."""
    if isinstance(secret, bytes):
        secret = secret.decode("utf-8", "replace")
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        return None
    try:
        return base64.b64decode(secret[len("whsec_"):], validate=True) or None
    except (binascii.Error, ValueError):
        return None
