-- recover_leases.sql on a Citus cluster (docs/design/citus.md, The leader), for ONE biz
-- type, $1, so that Citus routes it whole to the worker of its shard (EXPLAIN: one task;
-- checked by tests/citus/statements.rs): puts back up to 1,000 of its tasks whose lease ran
-- out, with recover_leases.sql's rules (a callback lease: pending again; a pull reservation:
-- a failed attempt, maybe the last; past its deadline: expired). The leader runs it per
-- biz type that has such tasks (`tasks::lease::recover_expired_leases`), then, in the same
-- transaction, the lost attempts (lost_attempts_citus.sql) and the failure and chat notices
-- of the tasks it ended (notices_citus.sql), from what this answers: one row per task.
--
-- What differs from recover_leases.sql beside the one biz type: the new values are worked
-- out by SELECTs (`why`; Citus refuses a CASE holding now() and a STABLE function of the
-- row's columns in an UPDATE) and the UPDATE copies them; the statement is a SELECT with
-- the UPDATE a CTE (a top-level UPDATE ... FROM a CTE is split into steps through the
-- coordinator); the attempts and notices are statements of their own (an INSERT of what a
-- CTE returned is split too).
--
-- Locks: as recover_leases.sql: the expired rows, FOR UPDATE SKIP LOCKED, so that this is
-- safe on every node at once.
WITH expired AS (
    SELECT t.id, t.run_at, t.attempt_count, t.leased_by, t.updated_at, t.expires_at, b.name AS biz_type,
           b.mode = 'pull' AS pull, b.mode = 'pull' AND t.attempt_count >= b.max_attempts AS exhausted,
           NOT (b.mode = 'pull' AND t.attempt_count >= b.max_attempts) AND coalesce(t.expires_at <= now(), false) AS expired
      FROM tasks t JOIN biz_types b ON b.id = $1
     WHERE t.biz_type_id = $1 AND t.status = 'running' AND t.lease_until < now()
     LIMIT 1000
     FOR UPDATE OF t SKIP LOCKED
), lost AS (
    SELECT e.*, CASE WHEN e.pull THEN 'time to run passed without an ack or nack'
                     ELSE 'lease expired: the node delivering it stopped before recording a result' END AS error
      FROM expired e
), why AS (
    SELECT l.*,
           CASE WHEN l.exhausted THEN 'failed' WHEN l.expired THEN 'expired' ELSE 'pending' END AS status,
           CASE WHEN l.exhausted OR l.expired THEN now() END AS finished_at,
           CASE WHEN l.expired THEN format('expired at %s: not delivered before its deadline (last attempt: %s)', l.expires_at, l.error)
                ELSE l.error END AS last_error,
           CASE WHEN l.pull THEN l.updated_at ELSE now() END AS started_at,
           CASE WHEN l.pull THEN (extract(epoch FROM now() - l.updated_at) * 1000)::int ELSE 0 END AS duration_ms,
           CASE WHEN l.pull THEN NULL ELSE l.leased_by END AS node_id
      FROM lost l
), requeued AS (
    UPDATE tasks t
       SET status = w.status, finished_at = w.finished_at, lease_until = NULL, leased_by = NULL, updated_at = now(),
           last_error = w.last_error
      FROM why w
     WHERE t.biz_type_id = $1 AND t.id = w.id AND t.run_at = w.run_at
)
SELECT id, biz_type, status, attempt_count, started_at, duration_ms, error, node_id FROM why
