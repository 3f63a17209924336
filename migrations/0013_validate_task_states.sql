-- Validates the CHECKs 0012 added NOT VALID. VALIDATE scans the rows under SHARE UPDATE
-- EXCLUSIVE, which lets reads and writes through (only DDL waits), in a transaction of its
-- own so that 0012's ACCESS EXCLUSIVE lock is not held meanwhile.
ALTER TABLE tasks VALIDATE CONSTRAINT tasks_status_check;
ALTER TABLE tasks VALIDATE CONSTRAINT tasks_finished_check;
ALTER TABLE tasks_cold VALIDATE CONSTRAINT tasks_status_check;
ALTER TABLE tasks_cold VALIDATE CONSTRAINT tasks_finished_check;
