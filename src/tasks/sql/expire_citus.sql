-- expire.sql on a Citus cluster (docs/design/citus.md, The leader), for ONE biz type, $2,
-- so that Citus routes it whole to the worker of its shard (EXPLAIN: one task; checked by
-- tests/citus/statements.rs): ends `expired` up to $1 of its pending tasks whose deadline
-- has passed, with expire.sql's message. The leader runs it per biz type that has such
-- tasks (`tasks::lease::expire_overdue`); the failure and chat notices follow in the same
-- transaction (notices_citus.sql). Answers one row per task, its biz type's name.
--
-- What differs from expire.sql beside the one biz type: the message is formatted in the
-- SELECT that locks (Citus refuses a STABLE function of the row's columns in an UPDATE),
-- the UPDATE is a CTE of a SELECT (a top-level UPDATE ... FROM a CTE is split into steps
-- through the coordinator), and the notices are a statement of their own.
--
-- Locks: as expire.sql: the overdue rows, FOR UPDATE SKIP LOCKED, oldest deadline first.
WITH overdue AS (
    SELECT t.id, t.run_at, b.name,
           format('expired at %s: not delivered before its deadline (%s)', t.expires_at,
               CASE WHEN b.archived_at IS NOT NULL THEN 'its biz type is archived'
                    WHEN b.paused THEN 'held back: its biz type was paused'
                    WHEN b.mode = 'pull' THEN format('due at %s, no consumer reserved it by then', t.run_at)
                    WHEN t.run_at >= t.expires_at THEN format('it was due at %s, after its deadline', t.run_at)
                    WHEN t.last_error IS NOT NULL THEN format('due at %s for attempt %s, it was not claimed by then: held back by a backlog or the rate limit; last error: %s',
                                                              t.run_at, t.attempt_count + 1, t.last_error)
                    ELSE format('due at %s, it was not claimed by then: held back by a backlog or the rate limit', t.run_at) END) AS error
      FROM tasks t JOIN biz_types b ON b.id = $2
     WHERE t.biz_type_id = $2 AND t.status = 'pending' AND t.expires_at IS NOT NULL AND t.expires_at <= now()
     ORDER BY t.expires_at
     LIMIT $1
     FOR UPDATE OF t SKIP LOCKED
), ended AS (
    UPDATE tasks t
       SET status = 'expired', finished_at = now(), updated_at = now(), last_error = o.error
      FROM overdue o
     WHERE t.biz_type_id = $2 AND t.id = o.id AND t.run_at = o.run_at
    RETURNING t.id
)
SELECT e.id, o.name FROM ended e JOIN overdue o ON o.id = e.id
