-- The reserve on a Citus cluster (docs/design/citus.md, Pull): reserve.sql's, with every
-- read and write of `tasks` naming pull biz type $1 as a constant, so that Citus routes the
-- whole statement to the worker holding its shard (EXPLAIN: one task, on that worker;
-- tests/citus/statements.rs). Run in a transaction with `plan_cache_mode =
-- force_custom_plan` (`lease::reserve`): a generic plan would keep $1 a parameter, which
-- Citus cannot route.
--
-- Parameters as reserve.sql's, and $7: a receipt per task it may reserve ($2 of them,
-- random UUIDs made by the caller). reserve.sql gives each task `gen_random_uuid()`, a
-- VOLATILE function, which Citus refuses in an UPDATE of a distributed table.
--
-- Locks: the picked rows, FOR UPDATE SKIP LOCKED, as reserve.sql.
--
-- What differs from reserve.sql beside the constant biz type, each for claim_citus.sql's
-- reasons (see there): no CASE in the UPDATE (the due tasks are reserved by one UPDATE,
-- `leased`, and those past their deadline ended by another, `ended`, which takes its
-- message from `due`, where `format()` may be), and no notices here (the caller inserts
-- them in the same transaction, notices_citus.sql).
WITH wants AS (
    SELECT $1::int AS biz_type_id, $2::int8 AS n, 0::int8 AS ahead_ms, $5::int8 AS oldest, NULL::int AS lane
),
{pick}, due AS (
    SELECT r.id, r.run_at, t.expires_at IS NOT NULL AND t.expires_at <= now() AS expired,
           format('expired at %s: not delivered before its deadline (due at %s, no consumer '
                  'reserved it by then)', t.expires_at, t.run_at) AS error,
           ($7::uuid[])[r.rank] AS receipt
      FROM (SELECT p.*, row_number() OVER (ORDER BY p.ord, p.run_at) AS rank FROM picked p) r
      JOIN tasks t ON t.biz_type_id = $1 AND t.id = r.id AND t.run_at = r.run_at
), leased AS (
    UPDATE tasks t
       SET status = 'running', lease_until = now() + $3 * interval '1 millisecond', leased_by = d.receipt,
           attempt_count = t.attempt_count + 1, updated_at = now()
      FROM due d
     WHERE t.biz_type_id = $1 AND NOT d.expired AND t.id = d.id AND t.run_at = d.run_at
       AND (t.expires_at IS NULL OR t.expires_at > now())
    RETURNING t.*
), ended AS (
    UPDATE tasks t
       SET status = 'expired', finished_at = now(), last_error = d.error, updated_at = now()
      FROM due d
     WHERE t.biz_type_id = $1 AND d.expired AND t.id = d.id AND t.run_at = d.run_at AND t.expires_at <= now()
    RETURNING t.*
)
SELECT l.*, $4::text AS biz_type, coalesce(l.lease_until, now()) AS reserved_until,
       coalesce(l.leased_by, '00000000-0000-0000-0000-000000000000') AS receipt, l.status = 'expired' AS expired
  FROM (SELECT * FROM leased UNION ALL SELECT * FROM ended) l ORDER BY l.priority DESC, l.run_at
