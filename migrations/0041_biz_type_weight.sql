-- A biz type's weight: its share of a node's delivery capacity against the other biz types
-- with due work, when that capacity is short (`--node-capacity`). A biz type of weight 3
-- gets three times the share of one of weight 1; the weight caps nothing by itself.
--
-- Expand only: a column with a constant default (no rewrite; a brief ACCESS EXCLUSIVE lock
-- on biz_types for the catalog change, and a scan of its few rows for the CHECK). The
-- previous release neither reads nor writes it: its updates of a biz type leave the
-- weight as it is.
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS weight integer NOT NULL DEFAULT 1
    CHECK (weight BETWEEN 1 AND 100);
