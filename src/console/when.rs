//! Times as the console shows them: absolute, in UTC and saying so, with how long ago or
//! how far ahead beside it ("2026-05-04 10:30:00 UTC (in 6 h)"), so that nobody has to do
//! the arithmetic against a clock in another zone.

use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};

/// A time and the moment the page was made, shown by `Display`.
pub struct When {
    pub at: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// Milliseconds too (a task's times, where they tell attempts apart).
    pub millis: bool,
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let format = if self.millis { "%Y-%m-%d %H:%M:%S%.3f" } else { "%Y-%m-%d %H:%M:%S" };
        write!(f, "{} UTC ({})", self.at.format(format), relative(self.at - self.now))
    }
}

/// A time however deep a template's references wrap it.
pub trait Time {
    fn time(&self) -> DateTime<Utc>;
}

impl Time for DateTime<Utc> {
    fn time(&self) -> DateTime<Utc> {
        *self
    }
}

impl<T: Time + ?Sized> Time for &T {
    fn time(&self) -> DateTime<Utc> {
        (**self).time()
    }
}

/// `delta` (the time minus now) in words: "just now" within 10 s, else "in 6 h" or
/// "3 min ago", in the largest unit that is at least one, rounded down.
pub fn relative(delta: TimeDelta) -> String {
    let secs = delta.num_seconds();
    let magnitude = secs.unsigned_abs();
    if magnitude < 10 {
        return "just now".into();
    }
    let amount = match magnitude {
        s if s < 60 => format!("{s} s"),
        s if s < 3_600 => format!("{} min", s / 60),
        s if s < 48 * 3_600 => format!("{} h", s / 3_600),
        s => format!("{} d", s / 86_400),
    };
    if secs > 0 { format!("in {amount}") } else { format!("{amount} ago") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_as_words() {
        let cases = [
            (0, "just now"),
            (-9, "just now"),
            (9, "just now"),
            (42, "in 42 s"),
            (-42, "42 s ago"),
            (-3 * 60 - 59, "3 min ago"),
            (6 * 3_600 + 1_800, "in 6 h"),
            (-47 * 3_600, "47 h ago"),
            (3 * 86_400 + 5, "in 3 d"),
            (-400 * 86_400, "400 d ago"),
        ];
        for (secs, words) in cases {
            assert_eq!(relative(TimeDelta::seconds(secs)), words, "{secs} s");
        }
    }

    #[test]
    fn a_time_shows_its_zone_and_how_far_it_is() {
        let now: DateTime<Utc> = "2026-05-04T10:30:00Z".parse().unwrap();
        let at = now + TimeDelta::hours(6);
        assert_eq!(When { at, now, millis: false }.to_string(), "2026-05-04 16:30:00 UTC (in 6 h)");
        assert_eq!(When { at: now - TimeDelta::minutes(3), now, millis: false }.to_string(), "2026-05-04 10:27:00 UTC (3 min ago)");
        let at = now + TimeDelta::milliseconds(1_250);
        assert_eq!(When { at, now, millis: true }.to_string(), "2026-05-04 10:30:01.250 UTC (just now)");
    }
}
