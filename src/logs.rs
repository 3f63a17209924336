//! The log's text format: one event, one line, whatever its fields hold.
//!
//! Log lines carry text that clients chose: user names, biz type names, keys, URLs, and
//! error messages that quote them. tracing-subscriber 0.3.23 escapes ESC (not newline or
//! CR) in the message, and writes a field given with `%` as it is, so a sign-in user name
//! with "\n…signed in user=admin" would add a forged line. Rather than rely on every call
//! site choosing `?`, the fields are escaped here, where they are written.

use std::fmt;

use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

/// The default field format with every control character (newline, CR, ESC, NUL…)
/// written as its Rust escape, `\n`, `\u{1b}`.
#[derive(Debug, Default)]
pub struct OneLineFields;

impl<'writer> FormatFields<'writer> for OneLineFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut escaping = Escaping(&mut writer);
        DefaultFields::new().format_fields(Writer::new(&mut escaping), fields)
    }
}

struct Escaping<'a, W>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if c.is_control() {
                write!(self.0, "{}", c.escape_default())?;
            } else {
                self.0.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn user_text_in_any_field_or_the_message_stays_on_one_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).fmt_fields(OneLineFields).with_writer(move || writer.clone()).finish();
        let name = "x\n2026-11-23T16:00:00Z  INFO chime: console: signed in user=admin\r\x1b[2K\0";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(user = %name, plain = name, debug = ?name, "refused {name}");
        });
        let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(!log.trim_end().contains(|c: char| c.is_control()), "{log:?}");
        assert!(log.contains(r"user=x\n2026-11-23T16:00:00Z  INFO chime: console: signed in user=admin\r\u{1b}[2K\u{0}"), "{log}");
    }
}
