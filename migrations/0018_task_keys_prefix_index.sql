-- no-transaction
-- The console's key search finds the keys that start with what was typed (`order-12…`), in
-- one biz type or each in turn: a range of this index per biz type. The primary key
-- (biz_type_id, key) sorts by the database's collation, which keeps a prefix's keys together
-- only under "C" (en_US.UTF-8 sorts `order-1` beside `order1`); this copy in "C" order does
-- so whatever the database's collation (src/tasks/queries.rs, `search_keys`). Built
-- concurrently: inserts of keyed tasks go on meanwhile. Its cost at insert: one more btree
-- entry per keyed task (README, "Console").
CREATE INDEX CONCURRENTLY IF NOT EXISTS task_keys_prefix_idx ON task_keys (biz_type_id, key COLLATE "C");
