-- no-transaction
-- A bulk operation's page (the console's /console/audit/{id}) reads the tasks it changed,
-- and their states as they are delivered: the events of one audit entry. The primary key
-- leads with the task, so without this index that read is a scan of every task's events.
-- Built concurrently: every audited change of a task writes task_events, so a busy service
-- writes it all the time (no lock that stops writes; migrations/README.md).
CREATE INDEX CONCURRENTLY IF NOT EXISTS task_events_audit_idx ON task_events (audit_id);
