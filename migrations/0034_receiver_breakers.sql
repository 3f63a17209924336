-- A breaker per receiver (src/engine/breaker.rs): after `breaker_threshold` failures in a
-- row (no answer, a timeout, 408, 429 or 5xx) within `breaker_window_ms`, a biz type's
-- deliveries stop (open) until a probe, one task every `breaker_probe_ms` across the
-- cluster, is answered; and a 429 or 503 with Retry-After holds the whole biz type's claims
-- until then. The state is the cluster's, in `receiver_breakers`: a row per biz type that
-- has ever opened or been slowed, written on each transition, each probe and each
-- slowdown, never on an ordinary callback.
--
-- Expand only. The previous release neither reads nor writes the new columns and table: it
-- goes on delivering an open biz type (its own failed attempts counted, as before).
--
-- Locks: brief ACCESS EXCLUSIVE locks on biz_types and failure_notices for the catalog
-- changes (columns with a constant default: no rewrite); the new CHECK on failure_notices
-- is added NOT VALID (no scan: the rows there satisfy the narrower check it replaces).

-- 0 turns the breaker off (every failure is retried by the backoff, as before).
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS breaker_threshold integer NOT NULL DEFAULT 10
    CHECK (breaker_threshold BETWEEN 0 AND 10000);
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS breaker_window_ms integer NOT NULL DEFAULT 60000
    CHECK (breaker_window_ms BETWEEN 100 AND 86400000);
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS breaker_probe_ms integer NOT NULL DEFAULT 5000
    CHECK (breaker_probe_ms BETWEEN 100 AND 3600000);

CREATE TABLE IF NOT EXISTS receiver_breakers (
    biz_type_id      integer PRIMARY KEY REFERENCES biz_types (id) ON DELETE CASCADE,
    -- Open: the biz type's tasks are not claimed, only probed.
    open             boolean NOT NULL DEFAULT false,
    -- The last opening and closing.
    opened_at        timestamptz,
    closed_at        timestamptz,
    -- The failure that opened it (the attempt's error), and how many in a row on the node
    -- that opened it.
    reason           text,
    failures         integer NOT NULL DEFAULT 0,
    -- Open: no probe starts before then. The node whose UPDATE moves it on (`WHERE
    -- next_probe_at <= now()`) is the one that probes: one at a time across the cluster.
    next_probe_at    timestamptz,
    -- Probes since it opened, and what the last one that failed met.
    probes           integer NOT NULL DEFAULT 0,
    last_probe_at    timestamptz,
    last_probe_error text,
    -- A 429 or 503 with Retry-After: no claim of the biz type before then.
    slowed_until     timestamptz
);

-- Failure notices of a biz type rather than of a task: `biz_type.receiver_down` and
-- `biz_type.receiver_up`, made in the transaction that opens or closes the breaker. They
-- have no task; `detail` holds what their body says about the breaker.
--
-- A node of the previous release cannot read a notice without a task: its sender's claim
-- fails while one is due (and the notices that claim took are held until their hold runs
-- out, then claimed again), until a node of this release sends it. Before rolling back
-- past this release, delete them: DELETE FROM failure_notices WHERE task_id IS NULL.
ALTER TABLE failure_notices ALTER COLUMN task_id DROP NOT NULL;
ALTER TABLE failure_notices ADD COLUMN IF NOT EXISTS detail jsonb;
ALTER TABLE failure_notices DROP CONSTRAINT IF EXISTS failure_notices_event_check;
ALTER TABLE failure_notices ADD CONSTRAINT failure_notices_event_check
    CHECK (event IN ('task.failed', 'task.expired', 'biz_type.receiver_down', 'biz_type.receiver_up')
           AND (task_id IS NOT NULL) = (event LIKE 'task.%')) NOT VALID;
