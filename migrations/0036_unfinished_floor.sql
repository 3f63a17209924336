-- `chime_unfinished_floor()`: an instant before which `tasks` holds no unfinished (pending
-- or running) task, now or later, for the engine's claims to pass as a lower bound on
-- `run_at` (src/engine/mod.rs, `floor`). With it PostgreSQL prunes, as each statement
-- starts, the retained partitions of finished tasks (30 days by default), which it would
-- otherwise open and lock at every claim: about a quarter of its CPU during a burst on a
-- loaded table (issue 35).
--
-- Why it holds later too. A task becomes unfinished in a partition only by being created
-- or rescheduled there (at most 24 hours in the past: `tasks::MAX_PAST`), replayed or
-- retried (now or later), moved in from cold storage (later), or by going back from
-- running to pending in its own partition (a lease recovered, a task given back): that
-- partition already held it, unfinished. So the floor is the lower bound of the oldest
-- partition holding an unfinished task, and never later than 25 hours ago. It only rises
-- with time, so a floor read a while ago is lower, and still true. Were a task ever made
-- unfinished below it all the same, the next read (a second later) would find it there:
-- a delay, never a task left behind.
--
-- Cost: two index probes per partition (the partial indexes on pending and running tasks),
-- oldest first, up to the first partition holding one; a few dozen probes in all.
--
-- Expand only: a function the previous release does not call.
CREATE OR REPLACE FUNCTION chime_unfinished_floor() RETURNS timestamptz
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    part record;
    unfinished boolean;
    latest timestamptz := now() - interval '25 hours';
BEGIN
    FOR part IN
        SELECT c.oid::regclass AS name,
               -- A default partition (chime makes none) counts as the oldest.
               coalesce(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
                        '-infinity') AS low
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'tasks'::regclass
         ORDER BY 2
    LOOP
        IF part.low >= latest THEN
            RETURN latest;
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE status = ''pending'')
                            OR EXISTS (SELECT 1 FROM %s WHERE status = ''running'')', part.name, part.name)
           INTO unfinished;
        IF unfinished THEN
            RETURN part.low;
        END IF;
    END LOOP;
    RETURN latest;
END
$$;
