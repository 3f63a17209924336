//! A cron expression in words, for people reading a timer ("at 09:30, Monday to Friday",
//! "every 5 minutes"), and the 6-field form of a 5-field one (the crontab's, minute first),
//! offered where a 5-field one is refused.
//!
//! The reading follows the cron crate's fields: second, minute, hour, day of month, month,
//! day of week (1 is Sunday, as in Quartz), year. What it cannot put in words plainly it
//! reads field by field, so that it is never wrong, only longer.

const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const DOW_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

fn any(field: &str) -> bool {
    field == "*" || field == "?"
}

fn number(field: &str) -> Option<u32> {
    field.parse().ok().filter(|_| field.bytes().all(|b| b.is_ascii_digit()))
}

/// `*/n` or `0/n`: every n-th from the start.
fn every(field: &str) -> Option<u32> {
    let (from, n) = field.split_once('/')?;
    (from == "*" || from == "0").then_some(())?;
    number(n)
}

/// "every hour" for `*`, "every 3 hours" for `*/3` (`unit` singular); None otherwise.
fn cadence(field: &str, unit: &str) -> Option<String> {
    if any(field) {
        return Some(format!("every {unit}"));
    }
    every(field).map(|n| format!("every {n} {unit}s"))
}

/// "a, b and c".
fn joined(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// A field of numbers and ranges in words, each number named by `name` (None: not plain).
fn listed(field: &str, name: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let mut items = vec![];
    for item in field.split(',') {
        if item.contains('/') {
            return None;
        }
        items.push(match item.split_once('-') {
            Some((a, b)) => format!("{} to {}", name(a)?, name(b)?),
            None => name(item)?,
        });
    }
    Some(joined(&items))
}

fn weekday(token: &str) -> Option<String> {
    if let Some(n) = number(token) {
        return WEEKDAYS.get((n as usize).checked_sub(1)?).map(|d| d.to_string());
    }
    let lower = token.to_ascii_lowercase();
    WEEKDAYS.iter().find(|d| d.to_ascii_lowercase().starts_with(&lower) && lower.len() >= 3).map(|d| d.to_string())
}

fn month(token: &str) -> Option<String> {
    if let Some(n) = number(token) {
        return MONTHS.get((n as usize).checked_sub(1)?).map(|m| m.to_string());
    }
    let lower = token.to_ascii_lowercase();
    MONTHS.iter().find(|m| m.to_ascii_lowercase().starts_with(&lower) && lower.len() >= 3).map(|m| m.to_string())
}

fn plain(token: &str) -> Option<String> {
    number(token).map(|n| n.to_string())
}

/// The times of day: None where the three fields are not one of the plain shapes.
fn time_of_day(second: &str, minute: &str, hour: &str) -> Option<(String, bool)> {
    let seconds = |s: u32| if s == 0 { String::new() } else { format!(":{s:02}") };
    // (the reading, whether it fires at most once an hour: then "every day" is worth saying)
    Some(match (number(second), number(minute)) {
        (Some(s), Some(m)) => {
            if let Some(h) = number(hour) {
                (format!("at {h:02}:{m:02}{}", seconds(s)), true)
            } else if hour.split(',').all(|h| number(h).is_some()) {
                let times: Vec<String> = hour.split(',').filter_map(number).map(|h| format!("{h:02}:{m:02}{}", seconds(s))).collect();
                (format!("at {}", joined(&times)), true)
            } else {
                let past = if s == 0 { format!("{m} minutes past") } else { format!("{m} minutes and {s} seconds past") };
                let past = if m == 0 && s == 0 { "on the hour,".to_string() } else { past };
                let hours = match cadence(hour, "hour") {
                    Some(each) => each,
                    None => format!("the hours {}", listed(hour, &plain)?),
                };
                (format!("{past} {hours}"), false)
            }
        }
        (Some(0), None) => {
            let each = match cadence(minute, "minute") {
                Some(each) => each,
                None => format!("at minutes {} of the hour", listed(minute, &plain)?),
            };
            if any(hour) { (each, false) } else { (format!("{each}, in the hours {}", listed(hour, &plain)?), false) }
        }
        (None, None) if any(minute) && any(hour) => {
            let each = match cadence(second, "second") {
                Some(each) => each,
                None => format!("at seconds {} of every minute", listed(second, &plain)?),
            };
            (each, false)
        }
        _ => return None,
    })
}

/// `expression` in words ("at 09:30, Monday to Friday"); a 6- or 7-field expression as the
/// cron crate takes it. Anything else is read field by field.
pub fn reading(expression: &str) -> String {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    if !(6..=7).contains(&fields.len()) {
        return format!("not a 6- or 7-field expression: `{expression}`");
    }
    let (second, minute, hour, dom, mon, dow) = (fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]);
    let year = fields.get(6).copied().filter(|y| !any(y));
    let Some((time, daily)) = time_of_day(second, minute, hour) else {
        return field_by_field(&fields);
    };
    let mut words = vec![time];
    let days = match (any(dom), any(dow)) {
        (true, true) => daily.then(|| "every day".to_string()),
        (true, false) => Some(format!("on {}", listed(dow, &weekday).unwrap_or_else(|| format!("the days of week `{dow}`")))),
        (false, true) => Some(format!("on {} {} of the month", day_s(dom), listed(dom, &plain).unwrap_or_else(|| format!("`{dom}`")))),
        (false, false) => Some(format!(
            "on {} {} of the month when it is a {}",
            day_s(dom),
            listed(dom, &plain).unwrap_or_else(|| format!("`{dom}`")),
            listed(dow, &weekday).unwrap_or_else(|| format!("`{dow}`"))
        )),
    };
    words.extend(days);
    if !any(mon) {
        words.push(format!("in {}", listed(mon, &month).unwrap_or_else(|| format!("the months `{mon}`"))));
    }
    if let Some(year) = year {
        words.push(format!("in {}", listed(year, &plain).unwrap_or_else(|| format!("the years `{year}`"))));
    }
    words.join(", ")
}

/// "day" or "days", as the field names one day or more.
fn day_s(field: &str) -> &'static str {
    if number(field).is_some() { "day" } else { "days" }
}

fn field_by_field(fields: &[&str]) -> String {
    let names = ["second", "minute", "hour", "day of month", "month", "day of week", "year"];
    let parts: Vec<String> = fields.iter().zip(names).map(|(f, name)| format!("{name} {}", if any(f) { "any" } else { f })).collect();
    format!("when {}", parts.join(", "))
}

/// The 6-field expression a crontab's 5-field one means (minute hour day-of-month month
/// day-of-week), firing at second 0; its days of week renamed, since a crontab's 1 is
/// Monday and the cron crate's is Sunday. None where it is not 5 fields, or a day of week
/// cannot be renamed safely.
pub fn six_fields(expression: &str) -> Option<String> {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let [minute, hour, dom, mon, dow] = fields[..] else { return None };
    fn named(token: &str) -> Option<&str> {
        match number(token) {
            Some(n) => DOW_NAMES.get(n as usize % 7).copied(),
            None => Some(token).filter(|t| t.chars().all(|c| c.is_ascii_alphabetic() || c == '*' || c == '?')),
        }
    }
    let mut items = vec![];
    for item in dow.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        let renamed = match range.split_once('-') {
            // A range ending on 7 (Sunday at the end, as crontabs allow) would wrap.
            Some((_, "7")) if step.is_none() => match range.split_once('-') {
                Some(("0" | "7", _)) => "*".to_string(),
                Some((a, _)) => format!("{}-SAT,SUN", named(a)?),
                None => unreachable!(),
            },
            Some((_, "7")) => return None,
            Some((a, b)) => format!("{}-{}", named(a)?, named(b)?),
            None => named(range)?.to_string(),
        };
        items.push(match step {
            Some(step) => format!("{renamed}/{step}"),
            None => renamed,
        });
    }
    Some(format!("0 {minute} {hour} {dom} {mon} {}", items.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_schedules_read_plainly() {
        for (cron, words) in [
            ("0 30 9 * * *", "at 09:30, every day"),
            ("0 30 9 * * Mon-Fri", "at 09:30, on Monday to Friday"),
            ("0 30 9 * * 2-6", "at 09:30, on Monday to Friday"),
            ("15 0 2 * * *", "at 02:00:15, every day"),
            ("0 0 9,17 * * *", "at 09:00 and 17:00, every day"),
            ("0 */5 * * * *", "every 5 minutes"),
            ("0 * * * * *", "every minute"),
            ("0 */15 9-17 * * *", "every 15 minutes, in the hours 9 to 17"),
            ("0 0 * * * *", "on the hour, every hour"),
            ("0 30 */2 * * *", "30 minutes past every 2 hours"),
            ("*/10 * * * * *", "every 10 seconds"),
            ("* * * * * *", "every second"),
            ("0 0 3 1 * *", "at 03:00, on day 1 of the month"),
            ("0 0 3 1,15 * *", "at 03:00, on days 1 and 15 of the month"),
            ("0 0 0 1 1 * 2099", "at 00:00, on day 1 of the month, in January, in 2099"),
            ("0 0 12 * Mar-May Sun", "at 12:00, on Sunday, in March to May"),
            ("0 0 12 13 * Fri", "at 12:00, on day 13 of the month when it is a Friday"),
        ] {
            assert_eq!(reading(cron), words, "{cron}");
        }
    }

    #[test]
    fn what_has_no_plain_words_is_read_field_by_field() {
        assert_eq!(reading("5/7 1-3 * * * *"), "when second 5/7, minute 1-3, hour any, day of month any, month any, day of week any");
    }

    #[test]
    fn a_crontab_line_becomes_six_fields() {
        for (five, six) in [
            ("*/5 * * * *", "0 */5 * * * *"),
            ("30 9 * * 1-5", "0 30 9 * * MON-FRI"),
            ("30 9 * * 0", "0 30 9 * * SUN"),
            ("30 9 * * 7", "0 30 9 * * SUN"),
            ("30 9 * * 5-7", "0 30 9 * * FRI-SAT,SUN"),
            ("30 9 * * 0-7", "0 30 9 * * *"),
            ("0 0 1 * mon,wed", "0 0 0 1 * mon,wed"),
            ("0 3 * * *", "0 0 3 * * *"),
            ("0 3 * * 1-5/2", "0 0 3 * * MON-FRI/2"),
        ] {
            assert_eq!(six_fields(five).as_deref(), Some(six), "{five}");
        }
        assert_eq!(six_fields("0 0 3 * * *"), None, "six fields already");
        assert_eq!(six_fields("0 3 * * 5-7/2"), None, "a stepped range through Sunday would wrap");
        // Each offer is what the crontab meant: the same fire times.
        let after = chrono::DateTime::parse_from_rfc3339("2026-11-27T00:00:00Z").unwrap().with_timezone(&chrono::Utc);
        let weekdays = super::super::schedule::Schedule::parse(&six_fields("30 9 * * 1-5").unwrap(), "UTC").unwrap().next(after, 5);
        let days: Vec<String> = weekdays.iter().map(|t| t.format("%a %H:%M").to_string()).collect();
        assert_eq!(days, ["Fri 09:30", "Mon 09:30", "Tue 09:30", "Wed 09:30", "Thu 09:30"]);
    }
}
