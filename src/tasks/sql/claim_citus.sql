-- The claim on a Citus cluster (docs/design/citus.md, The claim): claim.sql's, for ONE biz
-- type, $8, so that Citus routes the whole statement to the worker holding that biz type's
-- shard and runs it there as one statement (EXPLAIN: one task, on that worker; checked by
-- tests/citus/statements.rs). Citus runs `FOR UPDATE SKIP LOCKED` only in such
-- single-shard statements; claim.sql, which covers many biz types at once (an array joined
-- to tasks), it refuses outright ("complex joins are only supported when all distributed
-- tables are co-located and joined on their distribution columns").
--
-- Parameters as claim.sql's, each array of one element (the engine's `Want` for $8; $1 is
-- not read), and $8 the biz type itself. `wants` is one row of constants, not claim.sql's
-- unnest of arrays: PostgreSQL folds it into pick.sql's `biz_type_id = w.biz_type_id`, so
-- that every reference to a distributed table names the biz type as a constant, which is
-- what Citus routes on (with the unnest, it refuses the statement).
--
-- Locks: as claim.sql's: the picked rows FOR UPDATE SKIP LOCKED, and the biz type's claim
-- locks, which the engine takes before this statement in its transaction: `room`, $9, is
-- what `SELECT chime_claim_room($8, $2[1])` returned, run on the coordinator (where every
-- claim of every chime node takes them: the gate holds across the cluster). Not here:
-- Citus refuses a function that reads distributed tables inside a statement it sends to a
-- shard ("cannot execute a distributed query from a query on a shard"). So the gate is
-- taken before the pick, with the most the claim may pick (`$2[1]`) rather than what it
-- picked, and also when nothing is due: a lock and a count more per idle biz type and turn.
--
-- What differs from claim.sql beside the one biz type, each because Citus plans an UPDATE
-- of a distributed table differently from a SELECT:
--  * No CASE in the UPDATE: Citus refuses a CASE or COALESCE holding a function that is
--    not IMMUTABLE (`now()`, timestamptz + interval), and a STABLE function of the row's
--    columns anywhere (`format()` of its times); a subquery in a SET would split the
--    statement into steps through the coordinator. So the due tasks are leased by one
--    UPDATE (`leased`) and those past their deadline ended by another (`ended`), which
--    takes its message from `due`, a SELECT, where `format()` may be.
--    The deadline is compared again on the locked row in each UPDATE: a task whose deadline
--    moved between the statement's snapshot and its lock is in neither, and stays pending
--    (locked until the commit, claimed by a later claim).
--  * No notices here: an INSERT of what another CTE returned would split the statement
--    too. The engine inserts them in the same transaction (notices_citus.sql).
--  * `db_now` is read by the last SELECT, not by RETURNING (which may hold no such
--    function either).
WITH wants AS (
    SELECT $8::int AS biz_type_id, $2[1]::int8 AS n, $5[1]::int8 AS ahead_ms, $7[1]::int8 AS oldest, NULL::int AS lane
),
{pick}, gate AS (
    -- Nothing picked: no row (and no `capped` row), as in claim.sql.
    SELECT $8 AS biz_type_id, count(*) AS picked, $9::int AS room,
           (SELECT b.updated_at FROM biz_types b WHERE b.id = $8) AS settings_at
      FROM picked
    HAVING count(*) > 0
), due AS (
    SELECT r.id, r.run_at, t.expires_at IS NOT NULL AND t.expires_at <= now() AS expired,
           format('expired at %s: not delivered before its deadline (due at %s, it was not claimed '
                  'by then: held back by a pause, a backlog or the rate limit)', t.expires_at, t.run_at) AS error
      FROM (SELECT p.*, row_number() OVER (ORDER BY p.ord, p.run_at) AS rank FROM picked p) r
      CROSS JOIN gate g
      JOIN tasks t ON t.biz_type_id = $8 AND t.id = r.id AND t.run_at = r.run_at
     WHERE r.rank <= g.room
), leased AS (
    UPDATE tasks t
       SET status = 'running', lease_until = now() + $3[1] * interval '1 millisecond', leased_by = $4,
           attempt_count = t.attempt_count + 1,
           -- A key's rate counts these (chime_flow_rooms, migration 0040).
           attempted_at = now(), updated_at = now()
     WHERE t.biz_type_id = $8 AND t.id = ANY(ARRAY(SELECT id FROM due WHERE NOT expired))
       AND t.run_at BETWEEN (SELECT min(run_at) FROM due) AND (SELECT max(run_at) FROM due)
       AND (t.expires_at IS NULL OR t.expires_at > now())
    RETURNING t.id, t.biz_type_id, t.key, t.flow_key, t.run_at, t.payload::text AS payload, t.attempt_count, t.timer_id,
              t.expires_at, t.traceparent, false AS expired
), ended AS (
    UPDATE tasks t
       SET status = 'expired', finished_at = now(), last_error = d.error, updated_at = now()
      FROM due d
     WHERE t.biz_type_id = $8 AND d.expired AND t.id = d.id AND t.run_at = d.run_at AND t.expires_at <= now()
    RETURNING t.id, t.biz_type_id, t.key, t.flow_key, t.run_at, t.payload::text AS payload, t.attempt_count, t.timer_id,
              t.expires_at, t.traceparent, true AS expired
)
SELECT l.id, l.biz_type_id, l.key, l.flow_key, l.run_at, l.payload, l.attempt_count, l.timer_id, l.expires_at, l.traceparent,
       l.expired, clock_timestamp() AS db_now, false AS capped, NULL::text AS cursor, g.settings_at
  FROM (SELECT * FROM leased UNION ALL SELECT * FROM ended) l CROSS JOIN gate g
UNION ALL
SELECT '00000000-0000-0000-0000-000000000000', g.biz_type_id, NULL, NULL, now(), '', 0, NULL, NULL, NULL, false, clock_timestamp(), true, NULL,
       g.settings_at
  FROM gate g
 WHERE g.room < g.picked
