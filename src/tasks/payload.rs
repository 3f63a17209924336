//! What a payload costs once stored. PostgreSQL keeps a payload as jsonb and prints it
//! (to callbacks, to the API, in dumps) in its own form: numbers as `numeric`, written out in
//! full without an exponent (`1e308` is 309 digits), `": "` and `", "` between items, strings
//! re-escaped. The size limit bounds that form, not the bytes sent: 60 KB of `1e308` sent
//! would be 2.9 MB stored, and copied into every occurrence of a timer.
//!
//! The payload is measured in one pass over its text, without building a value tree.

use serde_json::value::RawValue;

use crate::error::Error;

/// Refuses a payload larger than `max_payload_bytes` as PostgreSQL stores it (413), or one it
/// cannot store as sent (422): a string with U+0000, or a number beyond numeric's range or
/// printed far longer than sent. `payload` must be valid JSON (as parsed from a request).
pub fn check_payload(payload: &RawValue, max_payload_bytes: usize) -> Result<(), Error> {
    let stored = measure(payload.get());
    if stored.bytes > max_payload_bytes {
        let mut message = format!("payload is {} bytes as stored; the limit is {max_payload_bytes}", stored.bytes);
        if let Some((text, len)) = stored.widest_number.filter(|(text, len)| *len > text.len()) {
            let shown: String = text.chars().take(40).collect();
            message.push_str(&format!(" (numbers are stored written out in full: {shown} takes {len} bytes)"));
        }
        return Err(Error::TooLarge(message));
    }
    if stored.nul {
        return Err(Error::invalid("payload", "must not contain the character U+0000, which PostgreSQL cannot store"));
    }
    if let Some(n) = stored.out_of_range {
        let shown: String = n.chars().take(40).collect();
        return Err(Error::invalid(
            "payload",
            format!(
                "the number {shown} is out of range: a number may have an exponent of at most ±308 \
                 and at most 16383 digits after the point; send it as a string"
            ),
        ));
    }
    Ok(())
}

struct Stored<'a> {
    /// The length of `payload::jsonb::text`, counting a key given twice in an object twice
    /// (jsonb keeps the last).
    bytes: usize,
    /// The number that grows most when written out, with its stored length.
    widest_number: Option<(&'a str, usize)>,
    nul: bool,
    out_of_range: Option<&'a str>,
}

fn measure(text: &str) -> Stored<'_> {
    let b = text.as_bytes();
    let mut stored = Stored { bytes: 0, widest_number: None, nul: false, out_of_range: None };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'{' | b'}' | b'[' | b']' => {
                stored.bytes += 1;
                i += 1;
            }
            b',' | b':' => {
                stored.bytes += 2;
                i += 1;
            }
            b'"' => {
                let (len, end, nul) = string(b, i + 1);
                stored.bytes += len;
                stored.nul |= nul;
                i = end;
            }
            b't' | b'n' => {
                stored.bytes += 4;
                i += 4;
            }
            b'f' => {
                stored.bytes += 5;
                i += 5;
            }
            _ => {
                let end = b[i..].iter().position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')).map_or(b.len(), |n| i + n);
                let number = &text[i..end];
                match number_len(number) {
                    Some(len) => {
                        stored.bytes += len;
                        let growth = |(text, len): (&str, usize)| len as i64 - text.len() as i64;
                        if stored.widest_number.is_none_or(|widest| growth((number, len)) > growth(widest)) {
                            stored.widest_number = Some((number, len));
                        }
                    }
                    // Refused anyway (422); counted as sent, as it was never written out.
                    None => {
                        stored.bytes += number.len();
                        stored.out_of_range.get_or_insert(number);
                    }
                }
                i = end;
            }
        }
    }
    stored
}

/// A JSON string starting after its opening quote: its length as jsonb prints it, the index
/// after its closing quote, and whether it holds U+0000.
fn string(b: &[u8], mut i: usize) -> (usize, usize, bool) {
    let (mut len, mut nul) = (2, false);
    loop {
        match b[i] {
            b'"' => return (len, i + 1, nul),
            b'\\' => {
                let escape = b[i + 1];
                i += 2;
                len += match escape {
                    b'u' => {
                        let mut code = hex(&b[i..i + 4]);
                        i += 4;
                        // A surrogate pair is one character (4 bytes of UTF-8); JSON parsing
                        // has refused a lone surrogate.
                        if (0xD800..0xDC00).contains(&code) && b.get(i) == Some(&b'\\') && b.get(i + 1) == Some(&b'u') {
                            i += 6;
                            code = 0x10000;
                        }
                        nul |= code == 0;
                        escaped_len(code)
                    }
                    b'/' => 1,
                    _ => 2, // \" \\ \b \f \n \r \t
                };
            }
            _ => {
                len += 1;
                i += 1;
            }
        }
    }
}

fn hex(digits: &[u8]) -> u32 {
    digits.iter().fold(0, |n, d| n * 16 + (*d as char).to_digit(16).unwrap_or(0))
}

/// The bytes of a character as PostgreSQL's `escape_json` writes it.
fn escaped_len(code: u32) -> usize {
    match code {
        0x08 | 0x09 | 0x0A | 0x0C | 0x0D | 0x22 | 0x5C => 2,
        0..0x20 => 6,
        0x20..0x80 => 1,
        0x80..0x800 => 2,
        0x800..0x10000 => 3,
        _ => 4,
    }
}

/// The length of a JSON number as `numeric` prints it: no exponent, no leading zeros, as many
/// digits after the point as sent less the exponent, no sign on zero. None beyond what is
/// accepted: an exponent beyond a double's (±308), or more than 16383 digits after the point
/// (numeric's limit; beyond it the statement fails). serde_json's `arbitrary_precision` keeps
/// each number's text as sent.
fn number_len(text: &str) -> Option<usize> {
    let (negative, unsigned) = text.strip_prefix('-').map_or((false, text), |rest| (true, rest));
    let (mantissa, exponent) = unsigned.split_once(['e', 'E']).unwrap_or((unsigned, "0"));
    let exponent = exponent.parse::<i64>().ok().filter(|e| e.abs() <= 308)?;
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let scale = fraction.len() as i64 - exponent;
    if scale > 16_383 {
        return None;
    }
    // Of the digits sent, the point falls after `point` of them.
    let point = whole.len() as i64 + exponent;
    let first_nonzero = whole.bytes().chain(fraction.bytes()).position(|d| d != b'0').map(|k| k as i64);
    let whole_len = match first_nonzero {
        Some(k) if k < point => point - k,
        _ => 1,
    };
    let sign = (negative && first_nonzero.is_some()) as i64;
    let fraction_len = if scale > 0 { 1 + scale } else { 0 };
    Some((sign + whole_len + fraction_len) as usize)
}

/// Longest "payload contains" filter, in bytes: a filter names a field or a few, not a document.
pub const MAX_FILTER_BYTES: usize = 2048;

/// A "payload contains" filter as a person types it, as the JSON a task's payload must
/// contain (PostgreSQL's `@>`): a JSON object (`{"order_id": 123}`), or `order_id = 123`
/// (`payload.` before the path is optional; `a.b = "x"` is `{"a": {"b": "x"}}`; a value
/// that is not JSON is taken as a string). Refused by name (`payload`) when empty of
/// meaning, over-long, or holding what PostgreSQL cannot store (U+0000, numbers out of range).
pub fn containment(text: &str) -> Result<String, Error> {
    let invalid = |m: &str| Error::invalid("payload", m.to_string());
    let text = text.trim();
    if text.len() > MAX_FILTER_BYTES {
        return Err(invalid(&format!("must be at most {MAX_FILTER_BYTES} bytes")));
    }
    let value: serde_json::Value = if text.starts_with('{') {
        serde_json::from_str(text).map_err(|e| invalid(&format!("is not a JSON object ({e}); write {{\"order_id\": 123}} or order_id = 123")))?
    } else {
        let (path, raw) = text
            .split_once('=')
            .ok_or_else(|| invalid("write a JSON object such as {\"order_id\": 123}, or field = value such as order_id = 123"))?;
        let path = path.trim();
        let path = path.strip_prefix("payload.").unwrap_or(path);
        let fields: Vec<&str> = path.split('.').map(str::trim).collect();
        if fields.iter().any(|f| f.is_empty() || f.chars().any(char::is_control)) {
            return Err(invalid("name the field before `=`, such as order_id or customer.id"));
        }
        let raw = raw.trim();
        let mut value = serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()));
        for field in fields.into_iter().rev() {
            value = serde_json::json!({ field: value });
        }
        value
    };
    if !value.is_object() || value.as_object().is_some_and(|o| o.is_empty()) {
        return Err(invalid("must name at least one field, such as {\"order_id\": 123}"));
    }
    let json = serde_json::value::to_raw_value(&value).map_err(|e| invalid(&e.to_string()))?;
    check_payload(&json, MAX_FILTER_BYTES * 4).map_err(|e| match e {
        Error::TooLarge(m) => Error::invalid("payload", m),
        e => e,
    })?;
    Ok(json.get().to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_containment_filter_is_json_or_a_path_and_a_value() {
        for (typed, json) in [
            ("order_id = 123", r#"{"order_id":123}"#),
            ("payload.order_id=123", r#"{"order_id":123}"#),
            (r#" {"order_id": 123} "#, r#"{"order_id":123}"#),
            ("customer.id = c1", r#"{"customer":{"id":"c1"}}"#),
            (r#"tag = "7""#, r#"{"tag":"7"}"#),
            ("ok = true", r#"{"ok":true}"#),
        ] {
            assert_eq!(containment(typed).unwrap(), json, "{typed}");
        }
        for bad in ["", "order_id", "= 1", "a..b = 1", "{}", "{1}", r#"{"a": "\u0000"}"#, r#"{"n": 1e999999}"#, &"x".repeat(3000)] {
            assert!(matches!(containment(bad), Err(Error::Invalid { field, .. }) if field == "payload"), "{bad}");
        }
    }

    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn numbers_are_measured_written_out() {
        for (number, printed) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("-0.00", "0.00"),
            ("1e308", &format!("1{}", "0".repeat(308))),
            ("1e-3", "0.001"),
            ("-1.5E-3", "-0.0015"),
            ("0.05e1", "0.5"),
            ("12.500", "12.500"),
            ("1.23e1", "12.3"),
            ("1.23e+5", "123000"),
            ("123.456e-5", "0.00123456"),
        ] {
            assert_eq!(number_len(number), Some(printed.len()), "{number}");
        }
        for bad in ["1e309", "1e-309", "1e99999999999999999999", "0.5e-16383"] {
            assert_eq!(number_len(bad), None, "{bad}");
        }
    }

    #[test]
    fn payload_numbers_are_refused_beyond_a_doubles_exponent() {
        let check = |n: &str| check_payload(&raw(&format!("[{{\"n\": {n}}}]")), 65536);
        for ok in ["0", "-0", "1e308", "-1.7976931348623157E+308", "1e-308", "0.5e-308", "123456789012345678901234567890"] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in ["1e309", "1e-309", "1e131072", "0e-999999", "1e99999999999999999999"] {
            assert!(matches!(check(bad), Err(Error::Invalid { field, .. }) if field == "payload"), "{bad}");
        }
    }

    #[test]
    fn the_limit_bounds_the_stored_size_and_says_why() {
        let numbers = format!("[{}]", vec!["1e308"; 300].join(","));
        match check_payload(&raw(&numbers), 65536) {
            Err(Error::TooLarge(message)) => {
                assert!(message.contains(&format!("{} bytes", 300 * 309 + 299 * 2 + 2)), "{message}");
                assert!(message.contains("1e308 takes 309 bytes"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Spacing sent is not stored; jsonb's own spacing is.
        assert!(check_payload(&raw("[1,   2]"), 6).is_ok());
        assert!(check_payload(&raw("[1,2]"), 5).is_err());
    }
}
