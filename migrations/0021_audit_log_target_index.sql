-- no-transaction
-- The task page reads the audit entries of one task (who replayed, cancelled or released
-- it, when): a probe of this index rather than a scan of the whole log. Built
-- concurrently: every API cancel is audited, so a busy service writes the log all the time.
CREATE INDEX CONCURRENTLY IF NOT EXISTS audit_log_target_idx ON audit_log (target_type, target, at);
