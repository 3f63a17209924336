-- Moves up to $1 cold tasks due before the hot horizon into the hot partitions. The DELETE
-- from cold storage and the INSERT into the partitions commit together or not at all, so
-- a leader dying mid-move loses and doubles nothing.
--
-- Locks: the moved rows, FOR UPDATE SKIP LOCKED, so that a second mover (a deposed leader
-- finishing its step) and a reschedule or cancel holding a cold row pass each other by.
-- The ids go to the DELETE as an array so that it always probes the primary key; joined
-- as a table, large batches tipped the planner into a hash join over a scan of all of
-- cold storage.
WITH moved AS (
    DELETE FROM tasks_cold
     WHERE id = ANY(ARRAY(
         SELECT id FROM tasks_cold
          WHERE run_at < (SELECT until FROM hot_horizon)
          ORDER BY run_at
          LIMIT $1
          FOR UPDATE SKIP LOCKED))
    RETURNING *
)
INSERT INTO tasks SELECT * FROM moved
