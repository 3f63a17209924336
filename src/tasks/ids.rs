//! Task ids, and the biz type that an id made on a Citus cluster carries
//! (docs/book/src/design/citus.md, By id).
//!
//! On Citus a task's row is found by its biz type (the distribution column): a read by id
//! alone asks every shard. So on a Citus cluster chime makes ids that say their biz type:
//! a UUID of version 8 (RFC 9562's layout for an application's own fields), laid out as
//! version 7 is where it matters and with the biz type in the middle:
//!
//! ```text
//! bytes 0-5   milliseconds since the Unix epoch, big-endian (as v7: ids of one moment sort together)
//! byte  6     version 8 in the high four bits, then 4 random bits
//! byte  7     random
//! byte  8     the variant (0b10) in the high two bits, then 6 random bits
//! bytes 9-12  the biz type's id, big-endian
//! bytes 13-15 random; the lanes of the claim read the last byte's low four bits (chime_lane)
//! ```
//!
//! Those four bits are random in a lone task's id. In a batch (`batch`), runs of
//! `LANE_RUN` tasks share one lane, so that each heap page holds one or two lanes' tasks:
//! a node claiming its own lanes then reads and locks pages no other node's claim touches,
//! and a lone node, claiming in run_at order (which is the batch's order when its tasks
//! share a run_at), reads the pages one after another as before. A run's ids keep four
//! random bits fewer, but ids of different runs differ in their lane: the odds of two
//! equal ids in one batch are what they were.
//!
//! 42 random bits per millisecond and biz type: ids are unique with the primary key's
//! biz type beside them. Why bits rather than a look-up table (id -> biz type): the
//! table would be one more row written per task and one more round trip per read (or a
//! distributed table of its own, read by id: the same fan-out). The bits cost nothing.
//! A plain install makes version 7 ids, as before; an id of any other version (made
//! before, or on a plain install later moved to Citus) is found as before, by asking every
//! shard.

use std::time::{SystemTime, UNIX_EPOCH};

use uuid::Uuid;

/// The version an id carrying its biz type has.
const VERSION: usize = 8;

/// A new task id of biz type `biz_type_id`: on a Citus cluster one that carries it
/// (`carrying`), otherwise a version 7 id as ever.
pub fn new(biz_type_id: i32) -> Uuid {
    if crate::db::citus::active() { carrying(biz_type_id) } else { Uuid::now_v7() }
}

/// How many tasks in a row of one batch share a lane (`batch`): about a heap page of them.
const LANE_RUN: usize = 32;

/// `n` new task ids of biz type `biz_type_id` for one batch, in order: as `new`'s, but the
/// lane bits go in runs of `LANE_RUN` ids, starting at a random lane, then the next lane.
/// Over many batches every lane gets its share.
pub fn batch(biz_type_id: i32, n: usize) -> Vec<Uuid> {
    let first: u8 = rand::random();
    (0..n)
        .map(|i| {
            let mut bytes = *new(biz_type_id).as_bytes();
            bytes[15] = (bytes[15] & 0xf0) | (first.wrapping_add((i / LANE_RUN) as u8) & 0x0f);
            Uuid::from_bytes(bytes)
        })
        .collect()
}

/// A version 8 id of this moment carrying `biz_type_id` (the module's layout).
pub fn carrying(biz_type_id: i32) -> Uuid {
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let mut bytes: [u8; 16] = rand::random();
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    bytes[6] = 0x80 | (bytes[6] & 0x0f);
    bytes[8] = 0x80 | (bytes[8] & 0x3f);
    bytes[9..13].copy_from_slice(&biz_type_id.to_be_bytes());
    Uuid::from_bytes(bytes)
}

/// The biz type an id made by `carrying` says, or None for any other id.
pub fn biz_type_of(id: Uuid) -> Option<i32> {
    let bytes = id.as_bytes();
    (id.get_version_num() == VERSION && bytes[8] & 0xc0 == 0x80).then(|| i32::from_be_bytes([bytes[9], bytes[10], bytes[11], bytes[12]]))
}

/// The biz type a by-id statement names on a Citus cluster, which sends it to that biz
/// type's shard alone; None on a plain install (its statements stay as they were) and for
/// an id that carries none (asked of every shard).
pub(super) fn routed(id: Uuid) -> Option<i32> {
    if crate::db::citus::active() { biz_type_of(id) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_carries_its_biz_type_and_stays_a_time_ordered_uuid() {
        for biz_type_id in [1, 7, 65_536, i32::MAX] {
            let id = carrying(biz_type_id);
            assert_eq!(biz_type_of(id), Some(biz_type_id), "{id}");
            assert_eq!(id.get_version_num(), 8);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(id.to_string().parse::<Uuid>().unwrap(), id);
        }
        // The first six bytes are the time, as a v7 id's: ids of later moments sort after.
        let millis = |id: Uuid| {
            u64::from_be_bytes([0, 0, id.as_bytes()[0], id.as_bytes()[1], id.as_bytes()[2], id.as_bytes()[3], id.as_bytes()[4], id.as_bytes()[5]])
        };
        let v7 = Uuid::now_v7();
        let ours = carrying(3);
        assert!(millis(ours).abs_diff(millis(v7)) < 1_000, "{ours} beside {v7}");
        // Other ids carry none.
        assert_eq!(biz_type_of(v7), None);
        assert_eq!(biz_type_of(Uuid::new_v4()), None);
        assert_eq!(biz_type_of(Uuid::nil()), None);
    }

    #[test]
    fn the_lane_bits_stay_random() {
        // chime_lane reads the last byte's low four bits: every lane is reached.
        let lanes: std::collections::HashSet<u8> = (0..2_000).map(|_| carrying(5).as_bytes()[15] & 15).collect();
        assert_eq!(lanes.len(), 16);
    }

    #[test]
    fn a_batch_goes_lane_by_lane_in_runs() {
        let ids = batch(5, 100);
        let lanes: Vec<u8> = ids.iter().map(|id| id.as_bytes()[15] & 15).collect();
        for (run, chunk) in lanes.chunks(LANE_RUN).enumerate() {
            assert!(chunk.iter().all(|&lane| lane == chunk[0]), "run {run}: {chunk:?}");
            assert_eq!(chunk[0], (lanes[0] + run as u8) % 16, "run {run} takes the next lane");
        }
        assert_eq!(ids.iter().collect::<std::collections::HashSet<_>>().len(), 100, "ids are unique");
        assert!(ids.iter().all(|id| id.get_version_num() == 7), "a v7 id still");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "still ordered as made");
        // The first lane is random: batches start in every lane.
        let firsts: std::collections::HashSet<u8> = (0..2_000).map(|_| batch(5, 1)[0].as_bytes()[15] & 15).collect();
        assert_eq!(firsts.len(), 16);
    }
}
