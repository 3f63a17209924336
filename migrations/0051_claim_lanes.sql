-- Lanes: several nodes working through one biz type's backlog claim apart rather than at
-- one shared head of the due order (docs/design/claim.md, Lanes; issue 35, measured on 16
-- cores). A task's lane is its id's last byte, random in every UUID chime makes (v4 and
-- v7 alike), modulo 16: nothing is stored, and no row changes.
--
-- Why apart: a claim's pick (`FOR UPDATE SKIP LOCKED`, READ COMMITTED) that started before
-- another node's claim committed still sees that node's rows as pending, follows each to
-- its new version, locks it, and only then finds it running and passes over it, holding the
-- lock until its own statement ends. The owner's record of those tasks waits for it
-- (`Lock:transactionid`, 16% of the samples at 8 nodes), and every claim reads the same
-- index and heap pages at the head (`LWLock:BufferContent`).
--
-- tasks_lane_idx holds pending tasks only, as tasks_claim_idx does: a task takes one entry
-- when created and none when claimed. It is made `ON ONLY`, as 0050's indexes are: the
-- leader's `partitions::complete_indexes` builds each partition's concurrently and
-- attaches it. Until then a lane's claim reads tasks_claim_idx and leaves the other
-- lanes' rows, which it does not lock. Brief lock on the parent.
CREATE OR REPLACE FUNCTION chime_lane(id uuid) RETURNS int
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN get_byte(uuid_send(id), 15) & 15;

CREATE INDEX IF NOT EXISTS tasks_lane_idx ON ONLY tasks (biz_type_id, chime_lane(id), run_at) WHERE status = 'pending';
