-- The cluster-wide max_in_flight gate (0033) without a queue while the cap is far off.
--
-- 0033's `chime_claim_room(biz_type)` serialises every claim of a biz type, on every node,
-- for the whole claim statement (~11 ms for 200 rows): with two nodes bursting one biz type,
-- 15% of PostgreSQL's samples waited on it (`Lock:advisory`, issue 35). Most of those
-- claims are nowhere near the cap. `chime_claim_room(biz_type, picked)` lets up to
-- three claims of a biz type through at once while what is running leaves room for all of
-- them, and serialises them as before only near the cap.
--
-- How: a claim of at most 200 tasks (the engine's batch) first counts the running tasks;
-- if the count leaves room for its own and for two other claims of 200, it takes the biz
-- type's gate lock SHARED (without waiting) and one of three lane locks (waiting only
-- when all three are taken), counts again after them, and may take what is left once those two others are
-- set aside. So at most three claims run on one count, and each sets aside what the other
-- two may take: the cap holds. Near the cap, or when no lane is free, or when a claim
-- waits for the gate exclusively, a claim takes the gate lock EXCLUSIVELY and waits, as
-- 0033's function does, and counts alone. An exclusive holder waits for every shared one to
-- commit, so its count sees their leases.
--
-- Why a function, and why the counts see the other claims' leases: see 0033.
--
-- Locks, transaction-scoped advisory locks, held until the claim commits:
--   the gate (0x63686966 "chif", biz type), the very lock 0033's function takes
--     exclusively, so that a previous release's node and this release's share the rule
--     during a rolling upgrade;
--   lane 1 to 3 (0x63686967 to 0x63686969, biz type), taken only with the gate shared.
-- Deadlock-free: claim.sql gates biz types in id order, and a claim waits only for a lock
-- of the biz type it is at; whoever holds that lock is at that biz type or a later one and
-- never waits for a lock of an earlier one. A claim holding the gate shared never asks
-- for it exclusively (two that did would wait for each other).
-- A shared request fails while an exclusive one waits: claims near the cap are not starved.
--
-- Expand only: a new overload; 0033's function stays for the previous release.
CREATE OR REPLACE FUNCTION chime_claim_room(biz_type integer, picked bigint) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    batch CONSTANT integer := 200;  -- the most a claim takes on the shared path
    others CONSTANT integer := 2;   -- lanes less one: the claims that may run beside this one
    cap integer;
    running integer;
    laned boolean := false;
BEGIN
    SELECT max_in_flight INTO cap FROM biz_types WHERE id = biz_type;
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
                -- Three claims under way: wait for one lane (a few ms), not for them all.
                PERFORM pg_advisory_xact_lock(1667787111 + pg_backend_pid() % (others + 1), biz_type);
            END IF;
            -- Counted again: a claim that committed between the first count and the locks
            -- is not among the two set aside. If the room is gone now, this claim takes
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
