-- no-transaction
-- The notice sender claims each biz type's due notices on their own, at most a few in flight
-- per biz type, so that one hanging failure receiver holds up only its own biz type's
-- notices (src/failure_notices.rs, `claim`): a probe of this index per biz type rather than
-- a walk of every due notice. Built concurrently: every task that fails writes the table.
-- failure_notices_due_idx stays for the previous release's claim.
CREATE INDEX CONCURRENTLY IF NOT EXISTS failure_notices_biz_type_due_idx ON failure_notices (biz_type_id, due_at)
    WHERE status IN ('pending', 'running');
