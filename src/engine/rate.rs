//! Per-biz-type callback rate limits of one node (governor).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

#[derive(Default)]
pub struct Limiters {
    /// One limiter per biz type, rebuilt when its per-node share changes.
    by_biz_type: HashMap<i32, (f64, DefaultDirectRateLimiter)>,
}

impl Limiters {
    /// Takes up to `want` permits for the biz type at `rate` per second (None: unlimited).
    /// Returns how many were granted and, when fewer than wanted, how long until the next.
    pub fn take(&mut self, biz_type_id: i32, rate: Option<f64>, want: i64) -> (i64, Option<Duration>) {
        let Some(rate) = rate else { return (want, None) };
        let entry = self.by_biz_type.entry(biz_type_id).or_insert_with(|| (rate, limiter(rate)));
        if entry.0 != rate {
            *entry = (rate, limiter(rate));
        }
        for granted in 0..want {
            if let Err(not_until) = entry.1.check() {
                return (granted, Some(not_until.wait_time_from(DefaultClock::default().now())));
            }
        }
        (want, None)
    }
}

/// `rate` per second, in bursts of at most a tenth of a second's worth, so that claims
/// come in batches at high rates without bunching a second's callbacks together.
fn limiter(rate: f64) -> DefaultDirectRateLimiter {
    let burst = NonZeroU32::new((rate / 10.0).ceil().clamp(1.0, 100_000.0) as u32).unwrap_or(NonZeroU32::MIN);
    let quota =
        Quota::with_period(Duration::from_secs_f64(1.0 / rate.max(1e-6))).unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX)).allow_burst(burst);
    RateLimiter::direct(quota)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_a_burst_then_says_how_long_to_wait() {
        let mut limiters = Limiters::default();
        let (granted, wait) = limiters.take(1, Some(100.0), 50);
        assert_eq!(granted, 10, "a tenth of a second's worth");
        let wait = wait.unwrap();
        assert!(wait <= Duration::from_millis(10), "{wait:?}");
        assert_eq!(limiters.take(2, None, 50), (50, None), "unlimited");
    }
}
