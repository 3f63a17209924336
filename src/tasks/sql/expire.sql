-- Ends `expired` up to $1 pending tasks whose deadline has passed (docs/design/contract.md, Tasks by key): tasks no
-- claim or reserve reached in time, held back by a paused biz type, a backlog, the rate
-- limit, or a pull biz type nobody reserves from. The claim and the reserve end the ones
-- they pick themselves (claim.sql); this is for the rest. Answers one row per task, its
-- biz type's name.
--
-- Cold tasks are not looked at: a cold task is due beyond the hot horizon, and its
-- deadline lies after its due time (a create checks it; a snooze or retry reaching the
-- deadline ends the task at once), so it cannot have passed.
--
-- Locks: the overdue rows, FOR UPDATE SKIP LOCKED, oldest deadline first: a task being
-- claimed, settled or changed right now is passed over (its holder decides; the claim
-- ends it expired if it is due) and the next sweep sees it again. Safe on every node at
-- once. Walks tasks_expiry_idx (pending tasks with a deadline only, migration 0015), so
-- its cost is the number of tasks it ends, not the size of the queue. The ids go to the
-- UPDATE as an array, as in the claim (claim.sql says why).
--
-- A biz type with a failure_url gets its `task.expired` notice queued in the same statement.
-- So does one with a chat_url, its chat notice (`chat_notices`).
WITH overdue AS (
    SELECT id FROM tasks
     WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= now()
     ORDER BY expires_at
     LIMIT $1
     FOR UPDATE SKIP LOCKED
), ended AS (
    UPDATE tasks t
       SET status = 'expired', finished_at = now(), updated_at = now(),
           last_error = format('expired at %s: not delivered before its deadline (%s)', t.expires_at,
               CASE WHEN b.archived_at IS NOT NULL THEN 'its biz type is archived'
                    WHEN b.paused THEN 'held back: its biz type was paused'
                    WHEN b.mode = 'pull' THEN format('due at %s, no consumer reserved it by then', t.run_at)
                    WHEN t.run_at >= t.expires_at THEN format('it was due at %s, after its deadline', t.run_at)
                    WHEN t.last_error IS NOT NULL THEN format('due at %s for attempt %s, it was not claimed by then: held back by a backlog or the rate limit; last error: %s',
                                                              t.run_at, t.attempt_count + 1, t.last_error)
                    ELSE format('due at %s, it was not claimed by then: held back by a backlog or the rate limit', t.run_at) END)
      FROM biz_types b
     WHERE t.id = ANY(ARRAY(SELECT id FROM overdue)) AND b.id = t.biz_type_id
    RETURNING t.id, t.biz_type_id, b.name, b.failure_url,
              b.chat_url
), notices AS (
    INSERT INTO failure_notices (biz_type_id, task_id, event)
    SELECT biz_type_id, id, 'task.expired' FROM ended WHERE failure_url IS NOT NULL
), chat AS (
    INSERT INTO chat_notices (biz_type_id, task_id, event)
    SELECT biz_type_id, id, 'task.expired' FROM ended WHERE chat_url IS NOT NULL
)
SELECT name FROM ended
