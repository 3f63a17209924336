-- Whether a node runs the delivery engine: a biz type's cluster-wide rate limit is shared
-- among the live nodes that deliver, not the API-only ones.
ALTER TABLE nodes ADD COLUMN delivers boolean NOT NULL DEFAULT true;
