-- The claim must walk tasks_claim_idx (pending tasks only). With statistics gathered before
-- a biz type existed, the planner estimated one row for every path and sometimes walked
-- tasks_list_idx instead, filtering out each of the biz type's delivered tasks on every
-- claim (measured by `chime bench`'s backlog scenario: the burst at half speed). The
-- listing index now leaves pending tasks out, so it cannot serve a claim at all; lists
-- read pending tasks through the claim index, which gains `id` for their keyset order,
-- and merge the two (src/tasks/queries.rs).
DROP INDEX tasks_list_idx;
CREATE INDEX tasks_list_idx ON tasks (biz_type_id, run_at, id) WHERE status <> 'pending';
DROP INDEX tasks_claim_idx;
CREATE INDEX tasks_claim_idx ON tasks (biz_type_id, run_at, id) WHERE status = 'pending';
