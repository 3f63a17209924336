-- A biz type's max_in_flight holds for the whole cluster (src/tasks/sql/claim.sql): each
-- claim counts the biz type's leased (running) tasks, on every node, and takes no more
-- than the cap leaves. Expand only: an index and a function, which the previous release
-- neither reads nor breaks (it goes on claiming up to the cap per node).
--
-- `tasks_running_idx`: the running tasks of a biz type, so that the count costs what is
-- in flight, not the finished history nor other biz types' leases (tasks_lease_idx holds
-- every biz type's, in lease order). Made `ON ONLY` the partitioned parent, at once, as
-- 0015 does (migrations/README.md): the leader's `partitions::complete_indexes` builds each
-- partition's concurrently and attaches it; partitions made from now on get theirs with
-- their table. Until then the count walks tasks_lease_idx: correct, only slower. A brief
-- lock on the parent.
CREATE INDEX IF NOT EXISTS tasks_running_idx ON ONLY tasks (biz_type_id) WHERE status = 'running';

-- `chime_claim_room(biz_type)`: how many more tasks of the biz type may be leased now
-- (max_in_flight less its running tasks; zero or less: none), with the biz type's claims
-- serialised until the caller's transaction ends, so that two nodes claiming at once
-- cannot both take what is left.
--
-- Why a function: the claim is one statement, and a statement sees the database as it was
-- when it started. Had the claim taken the lock itself, a claim that waited for another's
-- lock would count without the tasks that other one had just leased, and take them over
-- again. A VOLATILE function's statements each see what was committed before they began:
-- its count, after the lock, sees every lease committed by the claims before it.
--
-- Locks: a transaction-scoped advisory lock, the pair (0x63686966 "chif", biz type id),
-- held until the claim commits (a few ms). The two-key form never collides with chime's
-- one-key locks (leader, partitions). The count reads at most max_in_flight index entries.
CREATE OR REPLACE FUNCTION chime_claim_room(biz_type integer) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    cap integer;
    running integer;
BEGIN
    PERFORM pg_advisory_xact_lock(1667787110, biz_type);
    SELECT max_in_flight INTO cap FROM biz_types WHERE id = biz_type;
    SELECT count(*) INTO running FROM (
        SELECT 1 FROM tasks WHERE biz_type_id = biz_type AND status = 'running' LIMIT cap
    ) r;
    RETURN cap - running;
END
$$;
