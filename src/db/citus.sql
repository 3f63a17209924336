-- The Citus step of `chime migrate` (src/db/citus.rs; docs/design/citus.md): run after the
-- migrations, on a database where the citus extension is installed, and only there. It
-- places chime's tables on the cluster:
--
--  * per task, distributed by `biz_type_id` and colocated (one colocation group: a biz
--    type's tasks, keys, attempts and notices sit in shards of the same number, on the same
--    worker, so that a statement about one biz type is routed whole to that worker):
--    tasks (and every partition, present and future), tasks_cold, task_keys, attempts,
--    failure_notices, chat_notices, and the per-biz-type state the engine writes beside
--    them, receiver_breakers and chat_channels;
--  * biz_types, a reference table: a copy on every worker, which the hot statements join
--    on the worker that holds the biz type's shard;
--  * everything else stays on the coordinator, plain tables outside Citus's metadata:
--    api_tokens, timers, users, sessions, audit_log, nodes, hot_horizon, console_keys,
--    admin_tokens, task_events. api_tokens and timers lose their foreign key to biz_types
--    (see below).
--
-- Citus requires a distributed table's primary key to hold the distribution column:
-- tasks (id, run_at) becomes (id, run_at, biz_type_id), tasks_cold, failure_notices and
-- chat_notices (id) become (id, biz_type_id). An id is still unique: it is a random (v4
-- or v7) uuid, or a sequence's number, and the narrower key was what enforced it; chime
-- never names these keys in ON CONFLICT. task_keys (biz_type_id, key) and the per-biz-type
-- tables' keys hold it already. Attempts written before migration 0004 have no biz type:
-- they take their task's (or are deleted with no task left to show them on).
--
-- Idempotent: each table is done once, found done by pg_dist_partition (and its key by
-- pg_constraint), so that every `chime migrate` runs it and a table a later migration adds
-- is placed by the next run. On an empty database (a new install) it takes well under a
-- second; on an existing install it copies each table into its shards, holding its lock
-- meanwhile (docs/book/src/citus.md, Moving an existing install).
--
-- Locks: ACCESS EXCLUSIVE on each table it changes, until the step's transaction commits:
-- run it with the nodes stopped (a new install has none yet).
DO $$
DECLARE
    rel regclass;
    key text;
    pkey name;
BEGIN
    -- One transaction touches many shards of tables made in it: Citus can only do that
    -- over one connection per worker.
    SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

    -- Before anything is distributed: the join is a plain one then.
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'attempts'::regclass) THEN
        UPDATE attempts a SET biz_type_id = t.biz_type_id FROM all_tasks t WHERE a.biz_type_id IS NULL AND t.id = a.task_id;
        DELETE FROM attempts WHERE biz_type_id IS NULL;
    END IF;

    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'biz_types'::regclass AND repmodel = 't') THEN
        -- Coordinator tables keep no foreign key to biz_types: Citus would take each one
        -- holding one into its metadata (a Citus local table), where Citus 13.2 fails a
        -- prepared INSERT ... SELECT ... RETURNING into it ("missing FROM-clause entry"),
        -- as chime's token create is. chime never deletes a biz type (it archives them), so
        -- their ON DELETE CASCADE never runs; task_keys lost its key for that reason (0024).
        ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_biz_type_id_fkey;
        ALTER TABLE timers DROP CONSTRAINT IF EXISTS timers_biz_type_id_fkey;
        PERFORM create_reference_table('biz_types');
    END IF;

    -- In this order: `tasks` first, the others colocated with it.
    FOR rel, key IN SELECT v.rel::regclass, v.key FROM (VALUES
            (1, 'tasks', 'id, run_at, biz_type_id'),
            (2, 'tasks_cold', 'id, biz_type_id'),
            (3, 'task_keys', NULL),
            (4, 'attempts', NULL),
            (5, 'failure_notices', 'id, biz_type_id'),
            (6, 'chat_notices', 'id, biz_type_id'),
            (7, 'receiver_breakers', NULL),
            (8, 'chat_channels', NULL)) AS v(n, rel, key)
          ORDER BY v.n
    LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = rel AND partmethod = 'h');
        SELECT c.conname INTO pkey FROM pg_constraint c WHERE c.conrelid = rel AND c.contype = 'p'
           AND NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = 'biz_type_id' AND a.attnum = ANY (c.conkey));
        IF key IS NOT NULL AND pkey IS NOT NULL THEN
            -- Two statements: Citus refuses a constraint added beside other subcommands on
            -- a table it already knows (a Citus local table, through its foreign key).
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', rel, pkey);
            EXECUTE format('ALTER TABLE %s ADD PRIMARY KEY (%s)', rel, key);
        END IF;
        IF rel = 'tasks'::regclass THEN
            PERFORM create_distributed_table(rel, 'biz_type_id');
        ELSE
            PERFORM create_distributed_table(rel, 'biz_type_id', colocate_with => 'tasks');
        END IF;
    END LOOP;

    -- An existing install's rows were copied into the shards (docs/book/src/citus.md,
    -- Moving an existing install); Citus keeps the local copy on the coordinator's disk,
    -- unread, until told to drop it. Only tables that hold such a copy: a truncate locks.
    FOR rel IN SELECT c.oid FROM pg_class c JOIN pg_dist_partition p ON p.logicalrelid = c.oid
                WHERE p.partmethod = 'h' AND c.relkind = 'r' AND pg_relation_size(c.oid) > 0
    LOOP
        PERFORM truncate_local_data_after_distributing_table(rel);
    END LOOP;
END
$$;
