//! How often sign-in may be tried: per client address and user name, with growing waits.
//!
//! Each attempt counts as a failure when it starts (so that concurrent guesses cannot all
//! get past the check while their passwords are being hashed); a right password takes its
//! count back. After `PAIR_FREE` failures of one user name from one address, each further
//! failure doubles the wait, from `FIRST_WAIT` up to `MAX_WAIT`; one address gets
//! `ADDRESS_FREE` failures across all names before the same waits apply to all of them.
//! Failures from one address never make another wait: the right password from elsewhere
//! always gets in (a hard lock per user name would let anyone keep `admin` out).
//!
//! The memory is bounded: keys are SHA-256 hashes of the address and name (32 bytes,
//! whatever the name's length), a refused attempt adds nothing, entries are forgotten
//! `FORGET_AFTER` their wait ends, and at most `MAX_ENTRIES` are kept (the ones longest
//! quiet are dropped first). A `HashMap` behind a `Mutex` rather than governor's keyed
//! limiter: governor has no growing waits, no taking a count back, and keeps every key it
//! has ever seen until `retain_recent` is called (1,500 posts of 15 KB names kept 118 MB).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Failures of one user name from one address before the waits start.
const PAIR_FREE: u32 = 5;
/// Failures from one address, across all names, before the waits start.
const ADDRESS_FREE: u32 = 20;
const FIRST_WAIT: Duration = Duration::from_secs(15);
const MAX_WAIT: Duration = Duration::from_secs(15 * 60);
/// How long an entry outlives its wait; then its failures are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// About 60 bytes each: under a megabyte in all.
const MAX_ENTRIES: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    free: u32,
}

impl Failures {
    /// When the next attempt may start.
    fn until(&self) -> Instant {
        let Some(over) = self.count.checked_sub(self.free) else { return self.last };
        self.last + FIRST_WAIT.saturating_mul(1 << over.min(16)).min(MAX_WAIT)
    }
}

#[derive(Default)]
pub struct LoginLimiter {
    entries: Mutex<HashMap<[u8; 32], Failures>>,
}

/// The address as counted: IPv6 clients by their /64, which one machine usually holds whole.
fn counted(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

fn key(address: IpAddr, username: Option<&str>) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(counted(address).to_string());
    if let Some(name) = username {
        hash.update([0]);
        // Names are one name in any case: `HELEN` counts as `helen`.
        hash.update(name.to_ascii_lowercase());
    }
    hash.finalize().into()
}

impl LoginLimiter {
    /// Counts the start of an attempt and returns the name's failures from this address,
    /// this one included; or refuses it (adding nothing) with how long to wait.
    pub fn begin(&self, address: IpAddr, username: &str, now: Instant) -> Result<u32, Duration> {
        let keys = [(key(address, None), ADDRESS_FREE), (key(address, Some(username)), PAIR_FREE)];
        let mut entries = self.entries.lock().expect("login limiter lock");
        let until = keys.iter().filter_map(|(k, _)| entries.get(k)).map(Failures::until).max();
        if let Some(until) = until.filter(|u| *u > now) {
            return Err(until - now);
        }
        if entries.len() + keys.len() > MAX_ENTRIES {
            make_room(&mut entries, now);
        }
        let mut failures = 0;
        for (k, free) in keys {
            let f = entries.entry(k).or_insert(Failures { count: 0, last: now, free });
            f.count += 1;
            f.last = now;
            failures = f.count;
        }
        Ok(failures)
    }

    /// The attempt had the right password: its name starts afresh from this address, and
    /// the address's count takes this attempt back.
    pub fn succeeded(&self, address: IpAddr, username: &str) {
        let mut entries = self.entries.lock().expect("login limiter lock");
        entries.remove(&key(address, Some(username)));
        if let Some(f) = entries.get_mut(&key(address, None)) {
            f.count = f.count.saturating_sub(1);
        }
    }
}

impl LoginLimiter {
    /// The attempt was not tried after all (no password was checked): takes back what
    /// `begin` counted.
    pub fn not_tried(&self, address: IpAddr, username: &str) {
        let mut entries = self.entries.lock().expect("login limiter lock");
        for k in [key(address, None), key(address, Some(username))] {
            if let Some(f) = entries.get_mut(&k) {
                f.count = f.count.saturating_sub(1);
            }
        }
    }
}

/// Drops forgotten entries and, if that is not enough, the ones quiet longest.
fn make_room(entries: &mut HashMap<[u8; 32], Failures>, now: Instant) {
    entries.retain(|_, f| f.until() + FORGET_AFTER > now);
    if entries.len() + 2 > MAX_ENTRIES {
        let mut quiet: Vec<([u8; 32], Instant)> = entries.iter().map(|(k, f)| (*k, f.last)).collect();
        quiet.sort_unstable_by_key(|(_, last)| *last);
        // A tenth at a time, so that a full table is not sorted on every attempt.
        for (k, _) in quiet.into_iter().take(MAX_ENTRIES / 10) {
            entries.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn waits_grow_per_name_and_address_and_a_success_clears_them() {
        let limiter = LoginLimiter::default();
        let (attacker, admin) = (ip("198.51.100.7"), ip("203.0.113.9"));
        let t0 = Instant::now();
        for _ in 0..PAIR_FREE {
            assert!(limiter.begin(attacker, "admin", t0).is_ok());
        }
        assert_eq!(limiter.begin(attacker, "admin", t0), Err(FIRST_WAIT));
        assert!(limiter.begin(admin, "admin", t0).is_ok(), "another address is not held back");
        assert!(limiter.begin(attacker, "helen", t0).is_ok(), "another name from the same address is not either");
        // After the wait, one more failure doubles it.
        let t1 = t0 + FIRST_WAIT;
        assert!(limiter.begin(attacker, "admin", t1).is_ok());
        assert_eq!(limiter.begin(attacker, "admin", t1), Err(2 * FIRST_WAIT));
        // The right password, once let in, clears the name's count.
        let t2 = t1 + 2 * FIRST_WAIT;
        assert!(limiter.begin(attacker, "admin", t2).is_ok());
        limiter.succeeded(attacker, "admin");
        assert_eq!(limiter.begin(attacker, "admin", t2), Ok(1));
    }

    #[test]
    fn one_address_gets_a_bounded_number_of_names_and_waits_are_capped() {
        let limiter = LoginLimiter::default();
        let attacker = ip("2001:db8::1");
        let now = Instant::now();
        for n in 0..ADDRESS_FREE {
            assert!(limiter.begin(attacker, &format!("user{n}"), now).is_ok());
        }
        assert!(limiter.begin(ip("2001:db8::2"), "fresh", now).is_err(), "the same /64 is the same address");
        assert!(limiter.begin(ip("2001:db8:0:1::1"), "fresh", now).is_ok());
        let wait = Failures { count: 1000, last: now, free: PAIR_FREE }.until() - now;
        assert_eq!(wait, MAX_WAIT);
    }

    #[test]
    fn memory_is_bounded_and_refused_attempts_add_nothing() {
        let limiter = LoginLimiter::default();
        let now = Instant::now();
        let long_name = "x".repeat(15_000);
        for i in 0..(MAX_ENTRIES as u32 * 2) {
            let address = IpAddr::V4(i.into());
            let _ = limiter.begin(address, &format!("{long_name}{i}"), now);
        }
        assert!(limiter.entries.lock().unwrap().len() <= MAX_ENTRIES);
        // A refused attempt does not add its name.
        let attacker = ip("192.0.2.1");
        for n in 0..ADDRESS_FREE {
            limiter.begin(attacker, &n.to_string(), now).unwrap();
        }
        let before = limiter.entries.lock().unwrap().len();
        for n in 0..100 {
            assert!(limiter.begin(attacker, &format!("{long_name}{n}"), now).is_err());
        }
        assert_eq!(limiter.entries.lock().unwrap().len(), before);
    }
}
