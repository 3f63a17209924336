//! A biz type's create rate limit (API calls per second), enforced on each node.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

#[derive(Default)]
pub struct CreateLimiter {
    /// One limiter per biz type, rebuilt when its configured rate changes.
    limiters: Mutex<HashMap<i32, (f64, DefaultDirectRateLimiter)>>,
}

impl CreateLimiter {
    /// Counts one call; `Err(wait)` when the biz type is over its rate.
    pub fn check(&self, biz_type_id: i32, rate: Option<f64>) -> Result<(), Duration> {
        let Some(rate) = rate else { return Ok(()) };
        let mut limiters = self.limiters.lock().expect("limiter lock");
        let entry = limiters.entry(biz_type_id).or_insert_with(|| (rate, limiter(rate)));
        if entry.0 != rate {
            *entry = (rate, limiter(rate));
        }
        entry.1.check().map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }
}

/// A limiter allowing `rate` calls per second, with a burst of one second's worth. Rates
/// below one call in 11.6 days (10^-6 per second) count as that one, as in the engine's
/// limiter: a slower one's period overflows governor (beyond 584 years) or `Duration`.
fn limiter(rate: f64) -> DefaultDirectRateLimiter {
    let period = Duration::from_secs_f64(1.0 / rate.max(1e-6));
    let burst = NonZeroU32::new(rate.ceil().clamp(1.0, u32::MAX as f64) as u32).unwrap_or(NonZeroU32::MIN);
    let quota = Quota::with_period(period).unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX)).allow_burst(burst);
    RateLimiter::direct(quota)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_a_burst_of_one_second_then_refuses() {
        let limiter = CreateLimiter::default();
        for _ in 0..5 {
            assert!(limiter.check(1, Some(5.0)).is_ok());
        }
        let wait = limiter.check(1, Some(5.0)).unwrap_err();
        assert!(wait <= Duration::from_millis(200), "{wait:?}");
        assert!(limiter.check(2, Some(5.0)).is_ok(), "another biz type has its own budget");
        assert!(limiter.check(1, None).is_ok(), "no rate means unlimited");
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(crate::proptest_config(256))]

            /// Any rate a biz type can be given (above 0, at most 10^6 per second) allows a
            /// first call, however small the rate: the limiter never panics on it.
            #[test]
            fn every_rate_a_biz_type_accepts_allows_a_first_call(
                rate in prop_oneof![
                    (-330i32..=6).prop_map(|e| 10f64.powi(e)),
                    1e-6f64..=1e6,
                    prop::sample::select(vec![5e-324, f64::MIN_POSITIVE, 1e6]),
                ]
            ) {
                prop_assume!(rate > 0.0 && rate <= 1e6);
                prop_assert!(CreateLimiter::default().check(1, Some(rate)).is_ok());
            }
        }
    }
}
