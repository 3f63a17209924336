"""The REST API of chime (docs/book/src/api.md) on the standard library's urllib."""

import datetime
import http.client
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from . import __version__
from .errors import ChimeError, StaleReceipt, TransportError, Unavailable, error_for

# Sentinel for "not given", so that `payload=None` can mean JSON null where the API allows it.
_UNSET: Any = object()

Time = Union[str, datetime.datetime]


class Resource(dict):
    """A JSON object of the API: a dict whose fields are also attributes (``task.status``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _resource(value):
    if isinstance(value, dict):
        return Resource((k, _resource(v) if k != "payload" else v) for k, v in value.items())
    if isinstance(value, list):
        return [_resource(v) for v in value]
    return value


def _time(value: Optional[Time]) -> Optional[str]:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError("a datetime sent to chime needs a time zone (tzinfo)")
        return value.isoformat()
    return value


class Page:
    """One page of a list: ``items`` and the ``next_cursor`` to pass for the next (None on the last)."""

    def __init__(self, items: List[Resource], next_cursor: Optional[str]):
        self.items = items
        self.next_cursor = next_cursor

    def __repr__(self):
        return f"Page(items=<{len(self.items)}>, next_cursor={self.next_cursor!r})"


class BatchResult(Resource):
    """One item of a batch create: ``status`` 201 or 200 with ``task``, else ``error`` (a ChimeError)."""

    @property
    def ok(self) -> bool:
        return self["status"] in (200, 201)


class Client:
    """A client of one chime, acting with one biz type's API token.

    ``retries``: how many times a keyed create (or a batch whose every item has a key) is
    tried in all when it meets a 503 or no answer, with the same key, since the server may
    have stored it (the repeat then answers 200 with that task). Nothing else is retried.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.2, user_agent: Optional[str] = None):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = max(1, retries)
        self.backoff = backoff
        self.user_agent = user_agent or f"chime-client-python/{__version__}"

    # --- transport -------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = _UNSET, *, query: Optional[Dict[str, Any]] = None,
                timeout: Optional[float] = None, headers: Optional[Dict[str, str]] = None):
        """One call: the answer's JSON (None for 204), or raises the ChimeError it amounts to."""
        return self._request(method, path, body, query, timeout, headers)[1]

    def _request(self, method, path, body=_UNSET, query=None, timeout=None, headers=None):
        url = self.base_url + path
        if query:
            pairs = [(k, v) for k, v in query.items() if v is not None]
            if pairs:
                url += "?" + urllib.parse.urlencode(pairs)
        sent = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                "User-Agent": self.user_agent}
        data = None
        if body is not _UNSET:
            data = json.dumps(body, separators=(",", ":")).encode()
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        req = urllib.request.Request(url, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as answer:
                status, raw = answer.status, answer.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            raise self._error(e.code, raw, e.headers.get("Retry-After")) from None
        except (urllib.error.URLError, OSError, socket.timeout, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            raise TransportError(f"{method} {path}: no answer from chime: {reason}") from e
        except http.client.HTTPException as e:
            raise TransportError(f"{method} {path}: the connection broke: {e!r}") from e
        if not raw:
            return status, None
        return status, json.loads(raw)

    @staticmethod
    def _error(status, raw, retry_after) -> ChimeError:
        code, message = None, None
        try:
            detail = json.loads(raw)["error"]
            code, message = detail.get("code"), detail.get("message")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        if message is None:
            message = raw[:200].decode("utf-8", "replace") or f"HTTP {status}"
        wait = None
        if retry_after:
            try:
                wait = float(retry_after)
            except ValueError:
                pass
        return error_for(status, code, message, wait)

    def _with_retries(self, retry: bool, call: Callable[[], Any]):
        tries = self.retries if retry else 1
        for attempt in range(1, tries + 1):
            try:
                return call()
            except (TransportError, Unavailable) as e:
                if attempt == tries:
                    raise
                # Exponential backoff with full jitter, at least what a Retry-After asked.
                wait = random.uniform(0, self.backoff * 2 ** (attempt - 1))
                time.sleep(max(wait, e.retry_after or 0))

    # --- tasks -----------------------------------------------------------------------------

    def create(self, biz_type: str, *, key: Optional[str] = None, run_at: Optional[Time] = None,
               delay_ms: Optional[int] = None, payload: Any = _UNSET, on_conflict: Optional[str] = None,
               expires_at: Optional[Time] = None, ttl_ms: Optional[int] = None, priority: Optional[int] = None,
               flow_key: Optional[str] = None, traceparent: Optional[str] = None) -> Resource:
        """Schedules a task (``POST /api/v1/tasks``). ``on_conflict``: ``"reject"`` (default),
        ``"replace"`` or ``"keep"``. ``priority``: 0 to 9, 9 the most urgent (5 when left
        out). ``flow_key``: what the task is for (a merchant, a user), which the biz type's
        per-key limits count by. The task has ``.created`` True when this call made it (201), False when the
        key's task answered (200)."""
        body: Dict[str, Any] = {"biz_type": biz_type}
        for name, value in (("key", key), ("run_at", _time(run_at)), ("delay_ms", delay_ms),
                            ("on_conflict", on_conflict), ("expires_at", _time(expires_at)), ("ttl_ms", ttl_ms),
                            ("priority", priority), ("flow_key", flow_key)):
            if value is not None:
                body[name] = value
        if payload is not _UNSET:
            body["payload"] = payload
        headers = {"traceparent": traceparent} if traceparent else None
        status, task = self._with_retries(key is not None, lambda: self._request("POST", "/api/v1/tasks", body, headers=headers))
        task = _resource(task)
        task["created"] = status == 201
        return task

    def create_batch(self, tasks: List[Dict[str, Any]], *, traceparent: Optional[str] = None) -> List[BatchResult]:
        """Creates up to 1000 tasks (each a dict of create's fields, ``biz_type`` included);
        one BatchResult per item, in order. Retried like a keyed create when every item has a key."""
        headers = {"traceparent": traceparent} if traceparent else None
        retry = bool(tasks) and all(item.get("key") is not None for item in tasks)
        _, answer = self._with_retries(retry, lambda: self._request("POST", "/api/v1/tasks/batch", {"tasks": tasks}, headers=headers))
        results = []
        for item in answer["results"]:
            result = BatchResult(status=item["status"])
            if "task" in item:
                result["task"] = _resource(item["task"])
            else:
                detail = item.get("error") or {}
                result["error"] = error_for(item["status"], detail.get("code"), detail.get("message", ""))
            results.append(result)
        return results

    def get(self, task_id: str) -> Resource:
        """One task with its ``attempts``."""
        return _resource(self.request("GET", f"/api/v1/tasks/{_seg(task_id)}"))

    def get_by_key(self, biz_type: str, key: str) -> Resource:
        """The task holding ``key`` (the newest, if the key changed hands)."""
        return _resource(self.request("GET", _by_key(biz_type, key)))

    def list_page(self, *, status: Optional[str] = None, from_: Optional[Time] = None, to: Optional[Time] = None,
                  limit: Optional[int] = None, cursor: Optional[str] = None) -> Page:
        """One page of the token's tasks by ``run_at``."""
        query = {"status": status, "from": _time(from_), "to": _time(to), "limit": limit, "cursor": cursor}
        page = self.request("GET", "/api/v1/tasks", query=query)
        return Page(_resource(page["items"]), page["next_cursor"])

    def list(self, *, status: Optional[str] = None, from_: Optional[Time] = None, to: Optional[Time] = None,
             page_size: Optional[int] = None) -> Iterator[Resource]:
        """Every task matching, page after page (fetched as the iteration reaches them)."""
        cursor = None
        while True:
            page = self.list_page(status=status, from_=from_, to=to, limit=page_size, cursor=cursor)
            yield from page.items
            cursor = page.next_cursor
            if not cursor:
                return

    def reschedule(self, task_id: str, *, run_at: Optional[Time] = None, delay_ms: Optional[int] = None,
                   payload: Any = _UNSET, priority: Optional[int] = None) -> Resource:
        """Moves a pending task, replaces its payload (``payload=None`` sets it to null) and/or
        changes its priority."""
        return _resource(self.request("PATCH", f"/api/v1/tasks/{_seg(task_id)}", _changes(run_at, delay_ms, payload, priority)))

    def reschedule_by_key(self, biz_type: str, key: str, *, run_at: Optional[Time] = None,
                          delay_ms: Optional[int] = None, payload: Any = _UNSET, priority: Optional[int] = None) -> Resource:
        return _resource(self.request("PATCH", _by_key(biz_type, key), _changes(run_at, delay_ms, payload, priority)))

    def cancel(self, task_id: str) -> Resource:
        """Cancels a pending task; answers it, ``cancelled``."""
        return _resource(self.request("DELETE", f"/api/v1/tasks/{_seg(task_id)}"))

    def cancel_by_key(self, biz_type: str, key: str) -> Resource:
        return _resource(self.request("DELETE", _by_key(biz_type, key)))

    def replay(self, task_id: str) -> Resource:
        """A failed, expired, succeeded or cancelled task back to pending, due now."""
        return _resource(self.request("POST", f"/api/v1/tasks/{_seg(task_id)}/replay"))

    def cancel_matching(self, biz_type: str, **filter: Any) -> Resource:
        """Bulk cancel of pending tasks (docs/book/src/concepts/keys.md) matching ``key_prefix``, ``run_at_from``,
        ``run_at_to``, ``timer_id`` (or ``all=True``); ``dry_run=True`` only counts, up to 10,000
        (``"more"`` says whether more match). Answers ``{"matched", "cancelled"}`` once every
        batch is done."""
        return _resource(self.request("POST", f"/api/v1/biz-types/{_seg(biz_type)}/tasks/cancel", _filter(filter)))

    def replay_matching(self, biz_type: str, status: str, **filter: Any) -> Resource:
        """Bulk replay of ``failed`` or ``expired`` tasks; answers ``{"matched", "replayed"}``."""
        return _resource(self.request("POST", f"/api/v1/biz-types/{_seg(biz_type)}/tasks/replay",
                                      {"status": status, **_filter(filter)}))

    def stats(self, biz_type: str) -> Resource:
        """The biz type's queue right now, whole cluster: ``counts`` per state (due, pending,
        running, retrying, failed, expired; each exact below ``count_cap``, 10,000, and named
        in ``capped`` when it reached it), ``oldest_due_age_ms``, the last minute's
        ``lateness`` (p50_ms, p99_ms) and ``in_flight`` against ``max_in_flight``. Cheap
        enough to poll every second, for autoscaling receivers or consumers."""
        return _resource(self.request("GET", f"/api/v1/biz-types/{_seg(biz_type)}/stats"))

    # --- timers ----------------------------------------------------------------------------

    def create_timer(self, biz_type: str, key: str, cron: str, *, timezone: Optional[str] = None,
                     payload: Any = _UNSET, active: Optional[bool] = None, catch_up: Optional[bool] = None) -> Resource:
        """A periodic schedule; ``cron`` has a seconds field (``"0 */15 * * * *"``)."""
        body: Dict[str, Any] = {"biz_type": biz_type, "key": key, "cron": cron}
        for name, value in (("timezone", timezone), ("active", active), ("catch_up", catch_up)):
            if value is not None:
                body[name] = value
        if payload is not _UNSET:
            body["payload"] = payload
        return _resource(self.request("POST", "/api/v1/timers", body))

    def get_timer(self, timer_id: str) -> Resource:
        """A timer with its ``next_fire_times``."""
        return _resource(self.request("GET", f"/api/v1/timers/{_seg(timer_id)}"))

    def list_timers(self, *, page_size: Optional[int] = None) -> Iterator[Resource]:
        """Every timer of the token's biz type, by key, page after page."""
        cursor = None
        while True:
            page = self.request("GET", "/api/v1/timers", query={"limit": page_size, "cursor": cursor})
            yield from _resource(page["items"])
            cursor = page["next_cursor"]
            if not cursor:
                return

    def update_timer(self, timer_id: str, *, cron: Optional[str] = None, timezone: Optional[str] = None,
                     payload: Any = _UNSET, active: Optional[bool] = None, catch_up: Optional[bool] = None) -> Resource:
        body: Dict[str, Any] = {}
        for name, value in (("cron", cron), ("timezone", timezone), ("active", active), ("catch_up", catch_up)):
            if value is not None:
                body[name] = value
        if payload is not _UNSET:
            body["payload"] = payload
        return _resource(self.request("PATCH", f"/api/v1/timers/{_seg(timer_id)}", body))

    def activate_timer(self, timer_id: str) -> Resource:
        return _resource(self.request("POST", f"/api/v1/timers/{_seg(timer_id)}/activate"))

    def deactivate_timer(self, timer_id: str) -> Resource:
        return _resource(self.request("POST", f"/api/v1/timers/{_seg(timer_id)}/deactivate"))

    def delete_timer(self, timer_id: str) -> None:
        self.request("DELETE", f"/api/v1/timers/{_seg(timer_id)}")

    # --- pull ------------------------------------------------------------------------------

    def reserve(self, biz_type: str, *, max: int = 1, wait_ms: int = 0, ttr_ms: Optional[int] = None) -> List[Resource]:
        """Reserves up to ``max`` due tasks of a pull biz type, waiting up to ``wait_ms`` (at
        most 30000) for one; each comes with its ``receipt``."""
        body: Dict[str, Any] = {"max": max, "wait_ms": wait_ms}
        if ttr_ms is not None:
            body["ttr_ms"] = ttr_ms
        # The answer may take wait_ms to come: the socket must wait longer than that.
        answer = self.request("POST", f"/api/v1/biz-types/{_seg(biz_type)}/reserve", body,
                              timeout=self.timeout + wait_ms / 1000)
        return _resource(answer["tasks"])

    def ack(self, task_id: str, receipt: str) -> Resource:
        return _resource(self.request("POST", f"/api/v1/tasks/{_seg(task_id)}/ack", {"receipt": receipt}))

    def nack(self, task_id: str, receipt: str, *, delay_ms: Optional[int] = None, error: Optional[str] = None) -> Resource:
        body: Dict[str, Any] = {"receipt": receipt}
        if delay_ms is not None:
            body["delay_ms"] = delay_ms
        if error is not None:
            body["error"] = error[:1000]
        return _resource(self.request("POST", f"/api/v1/tasks/{_seg(task_id)}/nack", body))

    def touch(self, task_id: str, receipt: str, *, ttr_ms: Optional[int] = None) -> Resource:
        body: Dict[str, Any] = {"receipt": receipt}
        if ttr_ms is not None:
            body["ttr_ms"] = ttr_ms
        return _resource(self.request("POST", f"/api/v1/tasks/{_seg(task_id)}/touch", body))

    def consumer(self, biz_type: str, handler: Callable[[Resource], Any], **options: Any) -> "Consumer":
        """A Consumer of this biz type's tasks (see Consumer)."""
        return Consumer(self, biz_type, handler, **options)


class Consumer:
    """Reserves a pull biz type's tasks and hands each to ``handler(task)``: a return acks
    it, an exception nacks it (its text as the task's error, retried after the biz type's
    backoff). A receipt that went stale meanwhile (the handler outlived ``ttr_ms``) is
    dropped: the task is another reservation's now.

    ``run()`` loops until ``stop()`` is called (from a handler, another thread or a signal
    handler) or, with ``limit``, until that many tasks were handled. Stopping is clean: the
    tasks already reserved are handled, no new ones are reserved; a waiting reserve ends
    within ``wait_ms``.
    """

    def __init__(self, client: Client, biz_type: str, handler: Callable[[Resource], Any], *, max: int = 10,
                 wait_ms: int = 20000, ttr_ms: Optional[int] = None, limit: Optional[int] = None,
                 error_pause: float = 1.0):
        self.client, self.biz_type, self.handler = client, biz_type, handler
        self.max, self.wait_ms, self.ttr_ms, self.limit = max, wait_ms, ttr_ms, limit
        self.error_pause = error_pause
        self.handled = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Runs until stopped; answers how many tasks were handled."""
        while not self._stop.is_set() and (self.limit is None or self.handled < self.limit):
            want = self.max if self.limit is None else min(self.max, self.limit - self.handled)
            try:
                tasks = self.client.reserve(self.biz_type, max=want, wait_ms=self.wait_ms, ttr_ms=self.ttr_ms)
            except (TransportError, Unavailable):
                # chime restarting or unreachable: try again shortly, unless told to stop.
                self._stop.wait(self.error_pause)
                continue
            for task in tasks:
                self._handle(task)
        return self.handled

    def _handle(self, task: Resource) -> None:
        try:
            self.handler(task)
        except Exception as e:  # the handler's failure is the task's, not the loop's
            failure: Optional[str] = f"{type(e).__name__}: {e}"
        else:
            failure = None
        try:
            if failure is None:
                self.client.ack(task["id"], task["receipt"])
            else:
                self.client.nack(task["id"], task["receipt"], error=failure)
        except (StaleReceipt, TransportError, Unavailable):
            # Unsettled, the task comes back when its reservation ends (at least once).
            pass
        self.handled += 1


def _seg(value: str) -> str:
    return urllib.parse.quote(str(value), safe="")


def _by_key(biz_type: str, key: str) -> str:
    return f"/api/v1/biz-types/{_seg(biz_type)}/tasks/by-key/{_seg(key)}"


def _changes(run_at, delay_ms, payload, priority) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if run_at is not None:
        body["run_at"] = _time(run_at)
    if delay_ms is not None:
        body["delay_ms"] = delay_ms
    if payload is not _UNSET:
        body["payload"] = payload
    if priority is not None:
        body["priority"] = priority
    return body


def _filter(filter: Dict[str, Any]) -> Dict[str, Any]:
    return {k: _time(v) if k in ("run_at_from", "run_at_to") else v for k, v in filter.items() if v is not None}
