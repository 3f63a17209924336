-- Leases to node $4, for each biz type of $1 (the arrays $1 to $3, $5, $7 and $8 hold one
-- entry per biz type): up to $2 of its tasks due now and within the next $5 ms (the engine
-- holds those until they are due), for $3 ms from now, $7 of them its longest-due
-- (pick.sql), from lane $8 alone when not NULL (pick.sql, Lanes).
--
-- Locks: the picked rows, FOR UPDATE SKIP LOCKED, so that claimers on other nodes pass
-- over rows being taken rather than wait for them, and no two nodes hold one task. When
-- something is due, also the biz type's claim locks (`chime_claim_room`, migrations 0033,
-- 0039 and 0053) until the statement commits: up to three claims of a biz type run at once
-- while the cap is far off (eight under a cap of 4,000 or more); near it, claims of one biz
-- type wait for each other, a few ms.
-- Rows picked beyond what the cap leaves stay locked, unchanged, until then.
--
-- The cap (max_in_flight) is the biz type's, across the cluster: a receiver sized for 50
-- requests at once gets 50 however many nodes there are. The gate counts the biz type's
-- running tasks on every node (those claimed ahead and not started, and those whose
-- outcome is not yet recorded, included: they are leased) and the claim leases no more
-- than the cap leaves of what it picked. Leases given back, settled or expired free their
-- slots. With nothing picked there is no lock and no count, so an idle biz type's claim
-- costs what it did. Otherwise the lock and count add (pgbench, 4 partitions, 2026-11-26)
-- 0.06 ms with no task of the biz type running and 0.29 ms with 1,000 running: the count
-- walks tasks_running_idx, one entry per task in flight.
--
-- When the cap held the claim back, one more row says so (id all zeros, `capped`), so that
-- the engine waits for a slot to free rather than take the tasks left due for work it
-- missed. No node is told when another frees a slot; the engine looks again shortly.
-- With per-key limits (pick_flow.sql) such a row also says when a key's limit held some
-- back, and carries where the next claim's walk of the keys starts (`cursor`).
--
-- The engine claims most biz types without the pick's priority branches
-- (pick_priority.sql; `lease::claim`). A biz type that has a due task of another priority
-- than 5 is then passed over, and the pick gives it one row with no task instead
-- (`id` NULL), which the gate and the update skip; it comes back as a row with id all
-- zeros and `prioritized` set, and the engine claims it again with them.
--
-- $6, when known, is chime_unfinished_floor() (migration 0036): no unfinished task is due
-- before it, and with it the partitions of finished tasks are pruned as the statement
-- starts rather than opened and locked at each claim.
--
-- The pick, `picked`, is pick.sql's: a biz type's due tasks by priority (see there).
--
-- Each row carries its biz type's `updated_at` as this statement sees it: a task created
-- after a change of its biz type's settings (a secret rotated) is claimed by a statement
-- that sees the change, so the engine re-reads its settings before the callback rather
-- than sign it with what it read before (up to `SETTINGS_REFRESH` earlier).
--
-- The pick is a CTE to fence the planner: it must apply the LIMIT before the UPDATE joins
-- back (a nested loop over the subquery could otherwise update more rows than asked for).
-- It walks tasks_claim_idx, which holds pending tasks only, in run_at order, and
-- partitions wholly in the future are pruned at run time, so its cost does not grow with
-- future or finished tasks.
--
-- The UPDATE finds the picked rows through each partition's primary key, given the ids
-- as an array; not by a join, whose plan rests on statistics: with those of a partition
-- analysed while empty, the planner chose a nested loop that read the whole partition
-- once per picked row (3.6 s per claim during a burst of 50,000). The picked rows' run_at
-- range, min and max of `due` (locked rows: their run_at cannot change), bounds the
-- update so that PostgreSQL prunes, as it runs, every partition outside it: without it the
-- ids were probed in every retained partition (30 days of daily partitions: 20,000 buffers
-- and 9 ms per claim of 200 where the pruned update reads 1,200 in 3 ms; issue 21). The
-- range narrows the primary key's scan, (id, run_at), and no other index: every other
-- index on run_at is partial on a status this update does not name, so the planner cannot
-- walk one through the range (it did when the list index held every status: 50,000 rows
-- read when all were due at one instant). That range is known only as the update runs;
-- the floor ($6) is known as it starts, so the partitions of finished tasks below it are
-- not even opened (the engine's generic plan prunes by parameters at its start).
--
-- Deadlines (docs/design/contract.md, Tasks by key: no callback starts at or after `expires_at`). A picked task whose
-- deadline has passed is ended `expired` here, in the same UPDATE, rather than skipped:
-- skipped, it would stay at the head of tasks_claim_idx and every claim would read past it
-- until the leader's expiry sweep came by (after a paused biz type with a large backlog
-- resumes, past every one of them); ended, each claim clears up to $2 of them. It is
-- returned with `expired` set, never leased, and the engine counts it and sends nothing.
-- Its failure notice, if the biz type wants them, is queued in the same statement.
-- So is its chat notice (`chat_notices`).
-- The deadline is read on the locked row, so it cannot change between pick and update.
WITH wants AS (
    SELECT * FROM unnest($1::int[], $2::int8[], $3::int8[], $5::int8[], $7::int8[], $8::int[]) AS w(biz_type_id, n, lease_ms, ahead_ms, oldest, lane)
),
{pick}, gate AS (
    -- In biz type id order, which every claim follows: two claims never wait for each
    -- other's locks in opposite orders. `settings_at`: when the biz type's settings last
    -- changed, as this statement sees them (the engine re-reads its own copy if older).
    SELECT biz_type_id, picked, chime_claim_room(biz_type_id, picked) AS room,
           (SELECT b.updated_at FROM biz_types b WHERE b.id = g.biz_type_id) AS settings_at
      FROM (SELECT biz_type_id, count(*) AS picked FROM picked WHERE id IS NOT NULL GROUP BY biz_type_id ORDER BY biz_type_id) g
), due AS (
    SELECT r.id, r.run_at, r.biz_type_id
      FROM (SELECT p.*, row_number() OVER (PARTITION BY p.biz_type_id ORDER BY p.ord, p.run_at) AS rank FROM picked p WHERE p.id IS NOT NULL) r
      JOIN gate g ON g.biz_type_id = r.biz_type_id
     WHERE r.rank <= g.room
), leased AS (
    UPDATE tasks t
       SET status = CASE WHEN t.expires_at <= now() THEN 'expired' ELSE 'running' END,
           lease_until = CASE WHEN t.expires_at <= now() THEN NULL
                              ELSE now() + (SELECT w.lease_ms FROM wants w WHERE w.biz_type_id = t.biz_type_id) * interval '1 millisecond' END,
           leased_by = CASE WHEN t.expires_at <= now() THEN NULL ELSE $4 END,
           attempt_count = CASE WHEN t.expires_at <= now() THEN t.attempt_count ELSE t.attempt_count + 1 END,
           finished_at = CASE WHEN t.expires_at <= now() THEN now() END,
           last_error = CASE WHEN t.expires_at <= now()
                             THEN format('expired at %s: not delivered before its deadline (due at %s, it was not claimed '
                                         'by then: held back by a pause, a backlog or the rate limit)', t.expires_at, t.run_at)
                             ELSE t.last_error END,
           -- A key's rate counts these (chime_flow_rooms, migration 0040).
           attempted_at = CASE WHEN t.expires_at <= now() THEN t.attempted_at ELSE now() END,
           updated_at = now()
     WHERE t.id = ANY(ARRAY(SELECT id FROM due))
       AND t.run_at BETWEEN (SELECT min(run_at) FROM due) AND (SELECT max(run_at) FROM due)
       AND t.run_at >= coalesce($6, '-infinity')
    RETURNING t.id, t.biz_type_id, t.key, t.flow_key, t.run_at, t.payload::text AS payload, t.attempt_count, t.timer_id,
              t.expires_at, t.traceparent, t.status = 'expired' AS expired, clock_timestamp() AS db_now
), notices AS (
    INSERT INTO failure_notices (biz_type_id, task_id, event)
    SELECT l.biz_type_id, l.id, 'task.expired' FROM leased l JOIN biz_types b ON b.id = l.biz_type_id
     WHERE l.expired AND b.failure_url IS NOT NULL
), chat AS (
    INSERT INTO chat_notices (biz_type_id, task_id, event)
    SELECT l.biz_type_id, l.id, 'task.expired' FROM leased l JOIN biz_types b ON b.id = l.biz_type_id
     WHERE l.expired AND b.chat_url IS NOT NULL
)
SELECT l.id, l.biz_type_id, l.key, l.flow_key, l.run_at, l.payload, l.attempt_count, l.timer_id, l.expires_at, l.traceparent,
       l.expired, l.db_now, false AS capped, NULL::text AS cursor, g.settings_at, false AS prioritized
  FROM leased l JOIN gate g ON g.biz_type_id = l.biz_type_id
UNION ALL
SELECT '00000000-0000-0000-0000-000000000000', g.biz_type_id, NULL, NULL, now(), '', 0, NULL, NULL, NULL, false, clock_timestamp(), true, NULL,
       g.settings_at, false
  FROM gate g
 WHERE g.room < g.picked
UNION ALL
SELECT '00000000-0000-0000-0000-000000000000', p.biz_type_id, NULL, NULL, now(), '', 0, NULL, NULL, NULL, false, clock_timestamp(), false, NULL,
       NULL, true
  FROM picked p
 WHERE p.id IS NULL{markers}
