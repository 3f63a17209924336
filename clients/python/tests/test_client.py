"""The client against a real chime (clients/test.sh starts it) and a real receiver."""

import datetime
import json
import threading
import time
import unittest
import uuid

from chime_client import (
    Client, InvalidArgument, InvalidState, KeyConflict, NotFound, PermissionDenied, StaleReceipt,
    TransportError, Unauthenticated, Unavailable, verify_signature,
)

from support import URL, Biz, DroppingProxy, Receiver, require_chime


def setUpModule():
    require_chime()
    global receiver, hooks, pull, other
    receiver = Receiver()
    hooks = Biz("hooks", callback_url=receiver.url, timeout_ms=5000, backoff_initial_ms=100, backoff_max_ms=1000)
    pull = Biz("pull", mode="pull", timeout_ms=30000, backoff_initial_ms=100, backoff_max_ms=1000)
    other = Biz("other", callback_url=receiver.url)


def tearDownModule():
    receiver.close()


def wait_for(what, check, seconds=15):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {seconds} s")


class Callbacks(unittest.TestCase):
    def test_a_task_is_called_back_and_its_signature_verifies(self):
        client = Client(URL, hooks.token)
        key = f"order-{uuid.uuid4()}"
        task = client.create(hooks.name, key=key, payload={"order": 123, "name": "Zoë"})
        self.assertEqual((task.status, task.key, task.payload, task.created), ("pending", key, {"order": 123, "name": "Zoë"}, True))
        headers, body = receiver.calls.get(timeout=15)
        while json.loads(body)["task_id"] != task.id:  # another test's callback
            headers, body = receiver.calls.get(timeout=15)
        signature = headers["chime-signature"]
        self.assertTrue(verify_signature(body, signature, hooks.secret))
        self.assertTrue(verify_signature(body, signature, ["whsec_old_one_000000000", hooks.secret]))
        self.assertFalse(verify_signature(body, signature, other.secret))
        self.assertFalse(verify_signature(body + b" ", signature, hooks.secret))
        self.assertEqual(json.loads(body)["payload"], {"order": 123, "name": "Zoë"})
        self.assertEqual(headers["chime-task-id"], task.id)
        done = wait_for("succeeded", lambda: (lambda t: t if t.status == "succeeded" else None)(client.get(task.id)))
        self.assertEqual(done.attempts[0].status_code, 200)


class Tasks(unittest.TestCase):
    def setUp(self):
        self.client = Client(URL, hooks.token)

    def test_by_key_read_reschedule_and_cancel(self):
        key = f"order/{uuid.uuid4()}"  # a key with a slash travels percent-encoded
        created = self.client.create(hooks.name, key=key, delay_ms=3_600_000, payload={"n": 1})
        found = self.client.get_by_key(hooks.name, key)
        self.assertEqual((found.id, found.payload), (created.id, {"n": 1}))
        moved = self.client.reschedule_by_key(hooks.name, key, run_at="2030-01-01T09:00:00Z", payload={"n": 2})
        self.assertEqual((moved.id, moved.run_at, moved.payload), (created.id, "2030-01-01T09:00:00Z", {"n": 2}))
        cancelled = self.client.cancel_by_key(hooks.name, key)
        self.assertEqual((cancelled.id, cancelled.status), (created.id, "cancelled"))
        self.assertEqual(self.client.get_by_key(hooks.name, key).status, "cancelled")
        with self.assertRaises(InvalidState) as caught:
            self.client.cancel_by_key(hooks.name, key)
        self.assertEqual((caught.exception.status, caught.exception.code), (409, "invalid_state"))
        replayed = self.client.replay(created.id)
        self.assertEqual(replayed.status, "pending")
        # Due now, so delivered.
        wait_for("succeeded", lambda: self.client.get_by_key(hooks.name, key).status == "succeeded")

    def test_deadlines(self):
        at = self.client.create(hooks.name, delay_ms=3_600_000,
                                expires_at=datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc))
        self.assertEqual(at.expires_at, "2031-01-01T00:00:00Z")
        ttl = self.client.create(hooks.name, run_at="2030-01-01T00:00:00Z", ttl_ms=60_000)
        self.assertEqual(ttl.expires_at, "2030-01-01T00:01:00Z")
        with self.assertRaises(InvalidArgument) as caught:
            self.client.create(hooks.name, delay_ms=3_600_000, ttl_ms=0)
        self.assertIn("ttl_ms", caught.exception.message)
        self.client.cancel(at.id)
        self.client.cancel(ttl.id)

    def test_priority(self):
        urgent = self.client.create(hooks.name, delay_ms=3_600_000, priority=8)
        self.assertEqual(urgent.priority, 8)
        plain = self.client.create(hooks.name, delay_ms=3_600_000)
        self.assertEqual(plain.priority, 5, "5 when left out")
        self.assertEqual(self.client.reschedule(urgent.id, priority=2).priority, 2)
        with self.assertRaises(InvalidArgument) as caught:
            self.client.create(hooks.name, delay_ms=3_600_000, priority=10)
        self.assertEqual(caught.exception.status, 422)
        self.assertIn("priority", caught.exception.message)
        self.client.cancel(urgent.id)
        self.client.cancel(plain.id)

    def test_flow_key(self):
        task = self.client.create(hooks.name, delay_ms=3_600_000, flow_key="merchant-7")
        self.assertEqual(task.flow_key, "merchant-7")
        self.assertIsNone(self.client.create(hooks.name, delay_ms=3_600_000).flow_key)
        with self.assertRaises(InvalidArgument) as caught:
            self.client.create(hooks.name, delay_ms=3_600_000, flow_key="")
        self.assertEqual(caught.exception.status, 422)
        self.assertIn("flow_key", caught.exception.message)
        self.client.cancel(task.id)

    def test_bulk_cancel_and_replay(self):
        prefix = f"bulk-{uuid.uuid4()}-"
        ids = {self.client.create(hooks.name, key=f"{prefix}{i}", delay_ms=3_600_000).id for i in range(3)}
        self.assertEqual(self.client.cancel_matching(hooks.name, key_prefix=prefix, dry_run=True), {"matched": 3, "cancelled": 0, "more": False})
        self.assertEqual(self.client.cancel_matching(hooks.name, key_prefix=prefix), {"matched": 3, "cancelled": 3})
        self.assertEqual({self.client.get(i).status for i in ids}, {"cancelled"})
        self.assertEqual(self.client.replay_matching(hooks.name, "failed", key_prefix=prefix), {"matched": 0, "replayed": 0})
        with self.assertRaises(InvalidArgument):
            self.client.cancel_matching(hooks.name)

    def test_stats(self):
        # A paused biz type of its own: its tasks stay as created.
        quiet = Biz("stats", callback_url=receiver.url, paused=True, max_in_flight=4)
        client = Client(URL, quiet.token)
        for delay_ms in (0, 3_600_000, 3_600_000):
            client.create(quiet.name, delay_ms=delay_ms)
        stats = client.stats(quiet.name)
        self.assertEqual(stats["counts"], {"due": 1, "pending": 3, "running": 0, "retrying": 0, "failed": 0, "expired": 0})
        self.assertEqual((stats["biz_type"], stats["count_cap"], stats["capped"]), (quiet.name, 10_000, []))
        self.assertEqual(stats["in_flight"], {"count": 0, "max": 4})
        self.assertEqual(stats["lateness"], {"window_s": 60, "attempts": 0, "p50_ms": None, "p99_ms": None})
        self.assertGreaterEqual(stats["oldest_due_age_ms"], 0)
        with self.assertRaises(PermissionDenied):
            self.client.stats(quiet.name)

    def test_reschedule_and_cancel_by_id(self):
        task = self.client.create(hooks.name, delay_ms=3_600_000)
        self.assertEqual(self.client.reschedule(task.id, payload=None).payload, None)
        self.assertEqual(self.client.reschedule(task.id, delay_ms=7_200_000).id, task.id)
        self.assertEqual(self.client.cancel(task.id).status, "cancelled")
        self.assertEqual(self.client.get(task.id).attempts, [])

    def test_on_conflict(self):
        key = f"meeting-{uuid.uuid4()}"
        first = self.client.create(hooks.name, key=key, delay_ms=3_600_000, payload={"v": 1})
        again = self.client.create(hooks.name, key=key, delay_ms=3_600_000, payload={"v": 1})
        self.assertEqual((again.id, again.created), (first.id, False))
        with self.assertRaises(KeyConflict) as caught:
            self.client.create(hooks.name, key=key, delay_ms=3_600_000, payload={"v": 2})
        self.assertEqual((caught.exception.status, caught.exception.code), (409, "key_conflict"))
        self.assertIn(key, caught.exception.message)
        replaced = self.client.create(hooks.name, key=key, run_at="2031-01-01T00:00:00Z", payload={"v": 3}, on_conflict="replace")
        self.assertEqual((replaced.id, replaced.run_at, replaced.payload), (first.id, "2031-01-01T00:00:00Z", {"v": 3}))
        kept = self.client.create(hooks.name, key=key, payload={"v": 4}, on_conflict="keep")
        self.assertEqual((kept.id, kept.payload, kept.created), (first.id, {"v": 3}, False))
        self.client.cancel_by_key(hooks.name, key)

    def test_batch(self):
        key = f"batch-{uuid.uuid4()}"
        results = self.client.create_batch([
            {"biz_type": hooks.name, "key": key, "delay_ms": 3_600_000},
            {"biz_type": hooks.name, "key": key, "delay_ms": 3_600_000},
            {"biz_type": hooks.name, "run_at": "not a time"},
        ])
        self.assertEqual([r.status for r in results], [201, 200, 422])
        self.assertEqual(results[0].task.id, results[1].task.id)
        self.assertTrue(results[0].ok and not results[2].ok)
        self.assertIsInstance(results[2].error, InvalidArgument)
        self.assertIn("run_at", results[2].error.message)
        self.client.cancel(results[0].task.id)

    def test_list_iterates_every_page(self):
        biz = Biz("list", callback_url=receiver.url)
        client = Client(URL, biz.token)
        ids = [client.create(biz.name, delay_ms=3_600_000 + i, payload={"i": i}).id for i in range(7)]
        listed = list(client.list(status="pending", page_size=3))
        self.assertEqual([t.id for t in listed], ids)
        self.assertEqual(len(client.list_page(limit=3).items), 3)
        self.assertEqual(list(client.list(status="succeeded")), [])


class Errors(unittest.TestCase):
    def test_each_status_has_its_type(self):
        client = Client(URL, hooks.token)
        with self.assertRaises(Unauthenticated) as caught:
            Client(URL, "chime_not_a_token").get(str(uuid.uuid4()))
        self.assertEqual((caught.exception.status, caught.exception.code), (401, "unauthenticated"))
        theirs = Client(URL, other.token).create(other.name, delay_ms=3_600_000)
        with self.assertRaises(PermissionDenied) as caught:
            client.get(theirs.id)
        self.assertEqual(caught.exception.status, 403)
        with self.assertRaises(PermissionDenied):
            client.get_by_key(other.name, "anything")
        with self.assertRaises(NotFound) as caught:
            client.get(str(uuid.uuid4()))
        self.assertEqual((caught.exception.status, caught.exception.code), (404, "not_found"))
        with self.assertRaises(NotFound):
            client.get_by_key(hooks.name, f"never-{uuid.uuid4()}")
        with self.assertRaises(InvalidArgument) as caught:
            client.create(hooks.name, run_at="tomorrow")
        self.assertEqual(caught.exception.status, 422)
        self.assertTrue(caught.exception.message.startswith("run_at"), caught.exception.message)
        done = client.create(hooks.name, delay_ms=3_600_000)
        client.cancel(done.id)
        with self.assertRaises(InvalidState) as caught:
            client.reschedule(done.id, delay_ms=1000)
        self.assertEqual(caught.exception.status, 409)


class RetriesWithTheSameKey(unittest.TestCase):
    def test_a_keyed_create_whose_answer_was_lost_is_sent_again_and_answers_the_stored_task(self):
        proxy = DroppingProxy()
        try:
            client = Client(proxy.url, hooks.token, backoff=0.05)
            key = f"retry-{uuid.uuid4()}"
            task = client.create(hooks.name, key=key, delay_ms=3_600_000, payload={"order": 7})
            self.assertEqual((proxy.dropped, proxy.forwarded_creates), (1, 2))
            self.assertFalse(task.created, "the retry found the task the first try stored (200)")
            direct = Client(URL, hooks.token)
            self.assertEqual(direct.get_by_key(hooks.name, key).id, task.id)
            mine = [t for t in direct.list(status="pending") if t.key == key]
            self.assertEqual(len(mine), 1)
            direct.cancel(task.id)
        finally:
            proxy.close()

    def test_a_keyed_create_answered_503_is_sent_again(self):
        proxy, unkeyed = DroppingProxy(unavailable=True), DroppingProxy(unavailable=True)
        try:
            client = Client(proxy.url, hooks.token, backoff=0.05)
            task = client.create(hooks.name, key=f"retry-{uuid.uuid4()}", delay_ms=3_600_000)
            self.assertEqual((proxy.dropped, proxy.forwarded_creates, task.created), (1, 1, True))
            Client(URL, hooks.token).cancel(task.id)
            with self.assertRaises(Unavailable) as caught:
                Client(unkeyed.url, hooks.token, backoff=0.05).create(hooks.name, delay_ms=3_600_000)
            self.assertEqual((caught.exception.status, unkeyed.forwarded_creates), (503, 0))
        finally:
            proxy.close()
            unkeyed.close()

    def test_an_unkeyed_create_is_not_sent_twice(self):
        proxy = DroppingProxy()
        try:
            client = Client(proxy.url, hooks.token, backoff=0.05)
            marker = str(uuid.uuid4())
            with self.assertRaises(TransportError):
                client.create(hooks.name, delay_ms=3_600_000, payload={"marker": marker})
            self.assertEqual(proxy.forwarded_creates, 1)
            direct = Client(URL, hooks.token)
            stored = [t for t in direct.list(status="pending") if t.payload == {"marker": marker}]
            self.assertEqual(len(stored), 1, "the server stored the one try; the client did not send another")
            direct.cancel(stored[0].id)
        finally:
            proxy.close()


class Timers(unittest.TestCase):
    def test_create_get_update_activate_deactivate_delete(self):
        client = Client(URL, hooks.token)
        key = f"nightly-{uuid.uuid4()}"
        timer = client.create_timer(hooks.name, key, "0 30 2 * * *", timezone="Europe/Berlin", payload={"report": "daily"})
        self.assertEqual((timer.key, timer.active, timer.timezone, len(timer.next_fire_times)), (key, True, "Europe/Berlin", 5))
        self.assertEqual(client.get_timer(timer.id).cron, "0 30 2 * * *")
        changed = client.update_timer(timer.id, cron="0 0 3 * * *", payload={"report": "weekly"})
        self.assertEqual((changed.cron, changed.payload), ("0 0 3 * * *", {"report": "weekly"}))
        off = client.deactivate_timer(timer.id)
        self.assertEqual((off.active, off.next_fire_times), (False, []))
        self.assertTrue(client.activate_timer(timer.id).active)
        self.assertIn(timer.id, [t.id for t in client.list_timers(page_size=1)])
        with self.assertRaises(InvalidArgument):
            client.update_timer(timer.id, cron="every day")
        client.delete_timer(timer.id)
        with self.assertRaises(NotFound):
            client.get_timer(timer.id)


class Pull(unittest.TestCase):
    def setUp(self):
        self.client = Client(URL, pull.token)

    def test_a_consumer_handles_n_tasks_then_returns(self):
        ids = {self.client.create(pull.name, payload={"i": i}).id for i in range(5)}
        seen = []
        consumer = self.client.consumer(pull.name, lambda task: seen.append(task.id), max=2, wait_ms=5000, limit=5)
        self.assertEqual(consumer.run(), 5)
        self.assertEqual(set(seen), ids)
        for task_id in ids:
            self.assertEqual(self.client.get(task_id).status, "succeeded")

    def test_a_failing_handler_nacks(self):
        task = self.client.create(pull.name, payload={"fail": True})

        def handler(t):
            raise ValueError("no stock")
        self.assertEqual(self.client.consumer(pull.name, handler, wait_ms=5000, limit=1).run(), 1)
        after = self.client.get(task.id)
        self.assertEqual(after.status, "pending")
        self.assertIn("no stock", after.last_error)
        # Handled again (after the backoff), this time with success.
        self.assertEqual(self.client.consumer(pull.name, lambda t: None, wait_ms=5000, limit=1).run(), 1)
        self.assertEqual(self.client.get(task.id).status, "succeeded")

    def test_stop_ends_a_waiting_consumer(self):
        consumer = self.client.consumer(pull.name, lambda t: None, wait_ms=500)
        thread = threading.Thread(target=consumer.run)
        thread.start()
        time.sleep(0.3)
        consumer.stop()
        thread.join(timeout=5)
        self.assertFalse(thread.is_alive(), "the consumer stopped")

    def test_reserve_touch_ack_and_a_stale_receipt(self):
        task = self.client.create(pull.name, payload={"touch": True})
        reserved = wait_for("reserved", lambda: self.client.reserve(pull.name, wait_ms=2000, ttr_ms=5000))
        self.assertEqual(reserved[0].id, task.id)
        touched = self.client.touch(task.id, reserved[0].receipt, ttr_ms=60000)
        self.assertGreater(touched.reserved_until, reserved[0].reserved_until)
        self.assertEqual(self.client.ack(task.id, reserved[0].receipt).status, "succeeded")
        with self.assertRaises(StaleReceipt):
            self.client.ack(task.id, reserved[0].receipt)


if __name__ == "__main__":
    unittest.main()
