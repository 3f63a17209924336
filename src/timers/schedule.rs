//! When a timer fires: a cron expression with a seconds field, read as wall-clock time in
//! an IANA time zone.
//!
//! The cron crate walks wall-clock times (we hand it local times dressed as UTC); each is
//! then placed in the zone. Daylight saving:
//! * A wall-clock time skipped by a spring-forward change fires at the same time shifted
//!   by the gap (02:30 on a day that jumps from 02:00 to 03:00 fires at 03:30), once.
//! * A wall-clock time that occurs twice in a fall-back change fires at its first
//!   occurrence only, unless the schedule matches every hour: then at both, so an hourly
//!   or every-15-minutes timer keeps firing through the repeated hour.
//!
//! This is what cron daemons do for the repeated hour (Vixie cron's rule for jobs that are
//! not hourly) and what Quartz does for the skipped one.

use std::str::FromStr;

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use cron::TimeUnitSpec;

use crate::error::Error;

/// No DST change moves a wall clock by more than this; candidates are looked for this far
/// on either side of a range.
const SLACK: Duration = Duration::hours(3);

#[derive(Debug, Clone)]
pub struct Schedule {
    cron: cron::Schedule,
    tz: Tz,
    every_hour: bool,
}

impl Schedule {
    pub fn parse(expression: &str, timezone: &str) -> Result<Schedule, Error> {
        let fields = expression.split_whitespace().count();
        if !(6..=7).contains(&fields) {
            // A crontab's 5 fields (minute first): say what they mean here.
            let offer = match super::six_fields(expression) {
                Some(six) => format!(". As a crontab line (minute first), `{expression}` is `{six}` here, at second 0"),
                None => String::new(),
            };
            return Err(Error::invalid(
                "cron",
                format!(
                    "needs 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), \
                     such as `0 30 9 * * Mon-Fri`; this one has {fields}{offer}"
                ),
            ));
        }
        let cron = cron::Schedule::from_str(expression).map_err(|e| Error::invalid("cron", format!("is not a valid cron expression: {e}")))?;
        let tz: Tz = timezone
            .parse()
            .map_err(|_| Error::invalid("timezone", format!("`{timezone}` is not an IANA time zone name such as Europe/Berlin or UTC")))?;
        let every_hour = cron.hours().count() == 24;
        Ok(Schedule { cron, tz, every_hour })
    }

    /// Fire times after `after` and at or before `until`, in order, at most `limit`.
    pub fn between(&self, after: DateTime<Utc>, until: DateTime<Utc>, limit: usize) -> Vec<DateTime<Utc>> {
        self.walk(after, until, limit, |t| self.slack_at(t))
    }

    /// How far outside a range's end at `t` the wall-clock candidates must be looked for:
    /// SLACK where the zone's offset changes within SLACK of `t`, else nothing. Most ends
    /// (and every end in UTC) need none, which spares an every-second schedule walking
    /// 21,600 candidates for each range.
    fn slack_at(&self, t: DateTime<Utc>) -> Duration {
        let offset = |t: DateTime<Utc>| self.tz.offset_from_utc_datetime(&t.naive_utc()).fix();
        if offset(t - SLACK) == offset(t + SLACK) { Duration::zero() } else { SLACK }
    }

    /// `between`, looking for candidates `slack(end)` beyond each end of the range.
    fn walk(&self, after: DateTime<Utc>, until: DateTime<Utc>, limit: usize, slack: impl Fn(DateTime<Utc>) -> Duration) -> Vec<DateTime<Utc>> {
        let mut out: Vec<DateTime<Utc>> = Vec::new();
        let start = self.tz.from_utc_datetime(&after.naive_utc()).naive_local() - slack(after);
        let mut bound = self.tz.from_utc_datetime(&until.naive_utc()).naive_local() + slack(until);
        for candidate in self.cron.after(&Utc.from_utc_datetime(&start)) {
            let wall = candidate.naive_utc();
            if wall > bound {
                break;
            }
            for t in self.instants(wall) {
                if t > after && t <= until {
                    out.push(t);
                }
            }
            if out.len() >= limit {
                // Enough found; only wall-clock times within the slack of the latest can
                // still land before it.
                let latest = *out.iter().max().expect("not empty");
                bound = bound.min(self.tz.from_utc_datetime(&latest.naive_utc()).naive_local() + slack(latest));
            }
        }
        out.sort();
        out.dedup();
        out.truncate(limit);
        out
    }

    /// The next `n` fire times after `after`.
    pub fn next(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        // 400 years covers every calendar pattern, leap days included.
        self.between(after, after + Duration::days(366 * 400), n)
    }

    /// The last fire time after `after` and at or before `until`, looking back from
    /// `until` in widening steps so that a long gap costs little.
    pub fn last_between(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut span = Duration::minutes(1);
        loop {
            let from = (until - span).max(after);
            if let Some(last) = self.between(from, until, usize::MAX).pop() {
                return Some(last);
            }
            if from == after {
                return None;
            }
            span = span * 8;
        }
    }

    /// Where a wall-clock time falls in the zone: none, one or two instants.
    fn instants(&self, wall: NaiveDateTime) -> Vec<DateTime<Utc>> {
        match self.tz.from_local_datetime(&wall) {
            LocalResult::Single(t) => vec![t.with_timezone(&Utc)],
            LocalResult::Ambiguous(first, second) if self.every_hour => {
                vec![first.with_timezone(&Utc), second.with_timezone(&Utc)]
            }
            LocalResult::Ambiguous(first, _) => vec![first.with_timezone(&Utc)],
            LocalResult::None => {
                // Skipped by a spring-forward change: read it with the offset in force
                // before the change, which lands as far past the change as the time was
                // past its start.
                let before = self.tz.offset_from_utc_datetime(&(wall - Duration::days(1))).fix();
                vec![Utc.from_utc_datetime(&(wall - Duration::seconds(i64::from(before.local_minus_utc()))))]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn fires(cron: &str, tz: &str, after: &str, until: &str) -> Vec<String> {
        Schedule::parse(cron, tz)
            .unwrap()
            .between(at(after), at(until), 1000)
            .into_iter()
            .map(|t| t.with_timezone(&tz.parse::<Tz>().unwrap()).to_rfc3339())
            .collect()
    }

    #[test]
    fn a_daily_time_in_the_spring_forward_gap_fires_once_shifted_by_the_gap() {
        // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT.
        let got = fires("0 30 2 * * *", "America/New_York", "2026-03-07T00:00:00-05:00", "2026-03-10T00:00:00-04:00");
        assert_eq!(got, ["2026-03-07T02:30:00-05:00", "2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00"]);
    }

    #[test]
    fn a_daily_time_in_the_repeated_hour_fires_once_at_its_first_occurrence() {
        // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST.
        let got = fires("0 30 1 * * *", "America/New_York", "2026-10-31T00:00:00-04:00", "2026-11-03T00:00:00-05:00");
        assert_eq!(got, ["2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]);
    }

    #[test]
    fn an_hourly_timer_fires_every_real_hour_across_both_changes() {
        // Spring forward: 23 hours that day; fall back: 25.
        let spring = fires("0 0 * * * *", "America/New_York", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00");
        assert_eq!(spring.len(), 23, "{spring:?}");
        assert!(spring.contains(&"2026-03-08T01:00:00-05:00".to_string()));
        assert!(spring.contains(&"2026-03-08T03:00:00-04:00".to_string()));
        let fall = fires("0 0 * * * *", "America/New_York", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00");
        assert_eq!(fall.len(), 25, "{fall:?}");
        assert!(fall.contains(&"2026-11-01T01:00:00-04:00".to_string()));
        assert!(fall.contains(&"2026-11-01T01:00:00-05:00".to_string()));
    }

    #[test]
    fn every_fifteen_minutes_through_the_gap_has_no_duplicates() {
        let got = fires("0 */15 * * * *", "America/New_York", "2026-03-08T01:30:00-05:00", "2026-03-08T03:30:00-04:00");
        assert_eq!(got, ["2026-03-08T01:45:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:15:00-04:00", "2026-03-08T03:30:00-04:00",]);
    }

    #[test]
    fn southern_hemisphere_and_london_changes() {
        // Sydney, 2026-10-04: 02:00 AEST jumps to 03:00 AEDT.
        let sydney = fires("0 30 2 * * *", "Australia/Sydney", "2026-10-03T12:00:00+10:00", "2026-10-04T12:00:00+11:00");
        assert_eq!(sydney, ["2026-10-04T03:30:00+11:00"]);
        // London, 2026-10-25: 02:00 BST falls back to 01:00 GMT.
        let london = fires("0 30 1 * * *", "Europe/London", "2026-10-25T00:00:00+01:00", "2026-10-25T12:00:00+00:00");
        assert_eq!(london, ["2026-10-25T01:30:00+01:00"]);
    }

    #[test]
    fn zones_without_daylight_saving_and_fractional_offsets() {
        let got = fires("0 0 9 * * *", "Asia/Kolkata", "2026-11-21T00:00:00Z", "2026-11-23T00:00:00Z");
        assert_eq!(got, ["2026-11-21T09:00:00+05:30", "2026-11-22T09:00:00+05:30"]);
    }

    #[test]
    fn leap_day_and_end_of_month() {
        let s = Schedule::parse("0 0 12 29 2 *", "UTC").unwrap();
        assert_eq!(s.next(at("2026-11-21T00:00:00Z"), 2), [at("2028-02-29T12:00:00Z"), at("2032-02-29T12:00:00Z")]);
        let s = Schedule::parse("0 0 0 31 * *", "Europe/Berlin").unwrap();
        let got: Vec<String> =
            s.next(at("2026-01-01T00:00:00Z"), 4).iter().map(|t| t.with_timezone(&chrono_tz::Europe::Berlin).to_rfc3339()).collect();
        assert_eq!(got, ["2026-01-31T00:00:00+01:00", "2026-03-31T00:00:00+02:00", "2026-05-31T00:00:00+02:00", "2026-07-31T00:00:00+02:00"]);
    }

    #[test]
    fn last_between_finds_the_latest_missed_fire_time() {
        let s = Schedule::parse("0 0 3 * * *", "UTC").unwrap();
        assert_eq!(s.last_between(at("2026-11-01T00:00:00Z"), at("2026-11-21T12:00:00Z")), Some(at("2026-11-21T03:00:00Z")));
        assert_eq!(s.last_between(at("2026-11-21T04:00:00Z"), at("2026-11-21T12:00:00Z")), None);
        let every_second = Schedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(every_second.last_between(at("2026-01-01T00:00:00Z"), at("2026-11-21T12:00:00Z")), Some(at("2026-11-21T12:00:00Z")));
    }

    #[test]
    fn refuses_bad_expressions_and_zones_by_field() {
        let field = |r: Result<Schedule, Error>| match r.unwrap_err() {
            Error::Invalid { field, message } => format!("{field}: {message}"),
            other => panic!("{other:?}"),
        };
        assert!(field(Schedule::parse("0 9 * * *", "UTC")).starts_with("cron: needs 6 or 7 fields"));
        assert!(field(Schedule::parse("0 0 25 * * *", "UTC")).starts_with("cron: is not a valid"));
        assert!(field(Schedule::parse("0 0 9 * * *", "Mars/Olympus")).starts_with("timezone:"));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// One valid cron field over `lo..=hi`: `*`, a value, a range, a step, or a list.
        fn field(lo: u32, hi: u32) -> impl Strategy<Value = String> {
            let one = prop_oneof![
                Just("*".to_string()),
                (lo..=hi).prop_map(|v| v.to_string()),
                (lo..=hi, lo..=hi).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
                (1..=hi - lo).prop_map(|step| format!("*/{step}")),
                (lo..=hi, 1..=hi - lo).prop_map(|(start, step)| format!("{start}/{step}")),
            ];
            prop::collection::vec(one, 1..=3).prop_map(|parts| parts.join(","))
        }

        /// A valid expression; seconds are never `*` so that a day holds few fire times.
        fn valid_cron() -> impl Strategy<Value = String> {
            let seconds = prop_oneof![(0u32..60).prop_map(|s| s.to_string()), Just("0,30".to_string()), Just("*/20".to_string())];
            let month = prop_oneof![field(1, 12), Just("Mar-Nov".to_string()), Just("JAN,JUL".to_string())];
            let weekday = prop_oneof![Just("*".to_string()), Just("?".to_string()), field(1, 7), Just("Mon-Fri".to_string())];
            (seconds, field(0, 59), field(0, 23), field(1, 31), month, weekday)
                .prop_map(|(s, m, h, dom, mon, dow)| format!("{s} {m} {h} {dom} {mon} {dow}"))
        }

        /// Text made of cron's own tokens and near misses: zero steps, reversed and
        /// overflowing ranges, Quartz extras (L, W, #), names, empty fields.
        fn cron_like() -> impl Strategy<Value = String> {
            let token = prop_oneof![
                prop::sample::select(vec![
                    "*",
                    "?",
                    "0",
                    "7",
                    "59",
                    "60",
                    "-1",
                    "4294967295",
                    "4294967296",
                    "99999999999999999999",
                    "*/0",
                    "0/0",
                    "1-0",
                    "5-3",
                    "0-59/0",
                    "*/4294967295",
                    "L",
                    "W",
                    "LW",
                    "1#2",
                    "Mon",
                    "MON-FRI",
                    "Sun-Sat",
                    "Jan",
                    "JAN-DEC",
                    "1,,2",
                    "1-",
                    "-",
                    "/",
                    ",",
                    "",
                    "1970",
                    "2100",
                    "2101",
                    "1969-2200",
                ])
                .prop_map(str::to_string),
                "[0-9*/,?LW#A-Za-z-]{1,8}",
            ];
            prop::collection::vec(token, 0..=8).prop_map(|fields| fields.join(" "))
        }

        fn zone() -> impl Strategy<Value = Tz> {
            prop::sample::select(chrono_tz::TZ_VARIANTS.to_vec())
        }

        /// Instants from 1971 to 2090, half of them in the weeks when most zones change
        /// their clocks (March to April, September to November).
        fn instant() -> impl Strategy<Value = DateTime<Utc>> {
            let any_time = (31_536_000i64..3_786_912_000).prop_map(|s| DateTime::from_timestamp(s, 0).unwrap());
            let near_change = (1971i32..2090, prop::sample::select(vec![3u32, 4, 9, 10, 11]), 1u32..=28, 0i64..86_400)
                .prop_map(|(y, m, d, s)| Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap() + Duration::seconds(s));
            prop_oneof![any_time, near_change]
        }

        proptest! {
            #![proptest_config(crate::proptest_config(256))]

            /// Whatever the text, a schedule parses or is refused naming `cron` or
            /// `timezone`; it never panics, and one that parses answers `next` promptly.
            #[test]
            fn any_cron_and_zone_parse_or_are_refused_by_field(
                cron in prop_oneof![any::<String>(), cron_like()],
                tz in prop_oneof![any::<String>(), zone().prop_map(|z| z.name().to_string()), Just(String::new())],
            ) {
                match Schedule::parse(&cron, &tz) {
                    Ok(s) => {
                        prop_assert!(tz.parse::<Tz>().is_ok());
                        let fires = s.next(at("2026-11-21T12:00:00Z"), 3);
                        prop_assert!(fires.windows(2).all(|w| w[0] < w[1]), "{fires:?}");
                    }
                    Err(Error::Invalid { field, message }) => {
                        prop_assert!(field == "cron" || field == "timezone", "{field}: {message}");
                        prop_assert!(!message.is_empty());
                    }
                    Err(e) => prop_assert!(false, "{e:?}"),
                }
            }

            /// A valid schedule's next fire times are strictly increasing, all after the
            /// given instant, and each is a time the expression names on the zone's wall
            /// clock (or one shifted past a spring-forward gap just before it).
            #[test]
            fn next_fire_times_increase_and_match_the_expression(cron in valid_cron(), tz in zone(), after in instant()) {
                let s = Schedule::parse(&cron, tz.name()).unwrap();
                let fires = s.next(after, 8);
                prop_assert!(fires.iter().all(|t| *t > after), "{fires:?} after {after}");
                prop_assert!(fires.windows(2).all(|w| w[0] < w[1]), "{fires:?}");
                for t in &fires {
                    let wall = Utc.from_utc_datetime(&t.with_timezone(&tz).naive_local());
                    let offset_changed = tz.offset_from_utc_datetime(&(*t - SLACK).naive_utc()).fix() != tz.offset_from_utc_datetime(&t.naive_utc()).fix();
                    prop_assert!(s.cron.includes(wall) || offset_changed, "{t} ({wall} on the wall clock) is not named by `{cron}` in {tz}");
                }
            }

            /// Looking beyond a range's ends only where the zone's offset changes near them
            /// finds what looking the full SLACK beyond both ends finds. The ranges start
            /// within 6 hours of one of the zone's clock changes where it has them.
            #[test]
            fn slack_only_near_offset_changes_finds_every_fire_time(
                cron in valid_cron(),
                tz in zone(),
                from in instant(),
                into_change_minutes in 0i64..720,
                length_minutes in 1i64..2880,
                limit in 1usize..20,
            ) {
                let s = Schedule::parse(&cron, tz.name()).unwrap();
                let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
                // The first 6-hour step within a year of `from` over which the offset changes.
                let change = (1..=4 * 366).map(|i| from + Duration::hours(6 * i)).find(|t| offset(*t - Duration::hours(6)) != offset(*t));
                let after = change.map_or(from, |t| t - Duration::hours(6) + Duration::minutes(into_change_minutes));
                let until = after + Duration::minutes(length_minutes);
                for limit in [limit, usize::MAX] {
                    prop_assert_eq!(s.between(after, until, limit), s.walk(after, until, limit, |_| SLACK));
                }
            }

            /// Asking for the first few fire times in a range gives the first few of all of
            /// them: stopping early never skips or reorders one, across clock changes too.
            #[test]
            fn a_limit_takes_a_prefix_of_all_fire_times(cron in valid_cron(), tz in zone(), after in instant(), limit in 1usize..20) {
                let s = Schedule::parse(&cron, tz.name()).unwrap();
                let until = after + Duration::days(2);
                let all = s.between(after, until, usize::MAX);
                prop_assert!(all.iter().all(|t| *t > after && *t <= until));
                let first = s.between(after, until, limit);
                prop_assert_eq!(&first[..], &all[..limit.min(all.len())]);
            }
        }
    }
}
