-- The cap's gate (0039) with eight lanes for a biz type whose max_in_flight is at least
-- 4,000, three below that. Measured on 16 cores with 8 nodes bursting one biz type
-- (`chime bench --scenarios burst --nodes 8 --burst-tasks 200000 --max-in-flight 8000`,
-- two runs each, interleaved, after claim lanes, 0051): three gate lanes, 40,812 and 37,557
-- deliveries/s with 26% and 33% of the samples waiting on them (`Lock:advisory`); eight,
-- 43,944 and 47,085/s with no such wait. Before 0051 eight lanes moved the wait to the head
-- of the due index instead; the claim lanes took that away.
--
-- Each claim on the shared path sets aside what the others may take (others x 200), so
-- eight lanes need room for 1,600: below a cap of 4,000 that would send most claims to the
-- exclusive path, so those keep three. All claims of a biz type read the same cap, so they
-- agree on the number of lanes; only claims under way while the cap is changed across
-- 4,000 (a few ms) may mix the two, and may then lease up to 1,000 beyond the new cap
-- until those leases settle, as a lowered cap never takes back leases already out.
-- Locks, deadlock freedom and the exclusive path near the cap: as 0039.
CREATE OR REPLACE FUNCTION chime_claim_room(biz_type integer, picked bigint) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    batch CONSTANT integer := 200;  -- the most a claim takes on the shared path
    others integer;                 -- lanes less one: the claims that may run beside this one
    cap integer;
    running integer;
    laned boolean := false;
BEGIN
    SELECT max_in_flight INTO cap FROM biz_types WHERE id = biz_type;
    others := CASE WHEN cap >= 4000 THEN 7 ELSE 2 END;
    IF picked <= batch THEN
        SELECT count(*) INTO running FROM (
            SELECT 1 FROM tasks WHERE biz_type_id = biz_type AND status = 'running' LIMIT cap
        ) r;
        IF running + picked + others * batch <= cap AND pg_try_advisory_xact_lock_shared(1667787110, biz_type) THEN
            FOR l IN 1 .. others + 1 LOOP
                laned := pg_try_advisory_xact_lock(1667787110 + l, biz_type);
                EXIT WHEN laned;
            END LOOP;
            IF NOT laned THEN
                -- Every lane's claim under way: wait for one lane (a few ms), not for them all.
                PERFORM pg_advisory_xact_lock(1667787111 + pg_backend_pid() % (others + 1), biz_type);
            END IF;
            -- Counted again: a claim that committed between the first count and the locks
            -- is not among those set aside. If the room is gone now, this claim takes
            -- less (or nothing) and the engine looks again shortly: holding the gate
            -- shared, it may not wait for it exclusively.
            SELECT count(*) INTO running FROM (
                SELECT 1 FROM tasks WHERE biz_type_id = biz_type AND status = 'running' LIMIT cap
            ) r;
            RETURN cap - running - others * batch;
        END IF;
    END IF;
    -- Near the cap: 0033's gate, the lock taken exclusively and the count alone.
    RETURN chime_claim_room(biz_type);
END
$$;
