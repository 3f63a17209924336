-- release.sql on a Citus cluster (docs/design/citus.md, The leader): releases task $1 of
-- biz type $2 held by a pull consumer under receipt $3, pending again at once with the
-- reason $4 as its last error, only while it is still held under that receipt. Routed
-- whole to the worker of the biz type's shard (EXPLAIN: one task): the biz type names
-- every read of `tasks`, the UPDATE's included (release.sql's UPDATE, joined by id alone,
-- goes to every shard), and the UPDATE is a CTE of a SELECT. Answers the released task's
-- attempt, which `tasks::lease::release` then records (lost_attempts_citus.sql) in the
-- same transaction: an INSERT of what a CTE returned would be split through the
-- coordinator.
--
-- Locks: as release.sql: the one row, FOR UPDATE.
WITH held AS (
    SELECT t.id, t.run_at, t.attempt_count, t.updated_at
      FROM tasks t JOIN biz_types b ON b.id = $2
     WHERE t.id = $1 AND t.biz_type_id = $2 AND t.status = 'running' AND t.leased_by = $3 AND b.mode = 'pull'
     FOR UPDATE OF t
), requeued AS (
    UPDATE tasks t
       SET status = 'pending', lease_until = NULL, leased_by = NULL, updated_at = now(), last_error = $4
      FROM held h
     WHERE t.biz_type_id = $2 AND t.id = h.id AND t.run_at = h.run_at
)
SELECT id, attempt_count, updated_at AS started_at, (extract(epoch FROM now() - updated_at) * 1000)::int AS duration_ms FROM held
