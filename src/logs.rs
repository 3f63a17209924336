//! The log: its filter, its format (text or JSON), and the text format's escaping.
//!
//! Log lines carry text that clients chose: user names, biz type names, keys, URLs, and
//! error messages that quote them. tracing-subscriber 0.3.23 escapes ESC (not newline or
//! CR) in the message, and writes a field given with `%` as it is, so a sign-in user name
//! with "\n…signed in user=admin" would add a forged line. Rather than rely on every call
//! site choosing `?`, the fields are escaped here, where they are written.

use std::fmt;
use std::io::IsTerminal;

use clap::Args;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

/// What the log holds and how it is written (on stderr). Shared by every subcommand
/// (`config::Cli` flattens it in).
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log filter directives added to the default `info,chime::http=warn,sqlx=warn`: a
    /// directive for a target replaces the default's for it, so `chime::http=info` adds
    /// access logs and keeps everything else at info; a bare level (`debug`) replaces `info`
    /// for the targets the default does not name.
    #[arg(long, env = "CHIME_LOG", global = true)]
    pub log: Option<String>,

    /// Log format: `text` (one line per event, coloured only on a terminal) or `json` (one
    /// object per line, the event's fields at its top level).
    #[arg(long, env = "CHIME_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// What is logged when `CHIME_LOG` says nothing about a target.
pub const DEFAULT_FILTER: &str = "info,chime::http=warn,sqlx=warn";

/// The default filter with `extra`'s directives added: a directive for a target the
/// default names replaces it, so `chime::http=info` adds access logs and keeps the rest.
pub fn filter(extra: Option<&str>) -> anyhow::Result<EnvFilter> {
    let directives = match extra.map(str::trim).filter(|e| !e.is_empty()) {
        Some(extra) => format!("{DEFAULT_FILTER},{extra}"),
        None => DEFAULT_FILTER.to_string(),
    };
    EnvFilter::builder().parse(&directives).map_err(|e| anyhow::anyhow!("CHIME_LOG: {e}"))
}

/// Installs the process's subscriber, writing to stderr.
pub fn init(extra: Option<&str>, format: LogFormat) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let builder = tracing_subscriber::fmt().with_env_filter(filter(extra)?).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.fmt_fields(OneLineFields).with_ansi(std::io::stderr().is_terminal()).finish().with(ClientParseErrors).init(),
        // serde_json escapes control characters in strings: a line per event already.
        LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).finish().with(ClientParseErrors).init(),
    }
    Ok(())
}

/// Drops actix-http's ERROR for a request it could not parse ("stream error: request parse
/// error: …"): 431 for huge headers, 400 for a duplicate Host, Transfer-Encoding with
/// Content-Length or a 70 KB path. That is the client's error, answered already (with the
/// empty body actix-http's dispatcher makes itself: no application code runs for a request
/// it cannot parse, so chime cannot give it the API's JSON error), not the node's.
struct ClientParseErrors;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ClientParseErrors {
    fn event_enabled(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::ERROR || !meta.target().starts_with("actix_http::h1") {
            return true;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        !message.0.starts_with("stream error: request parse error")
    }
}

/// An event's message, as its text.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

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

    /// The lines `filter` lets through of an INFO event at each of three targets.
    fn passed(filter: EnvFilter) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_env_filter(filter).with_writer(move || writer.clone()).finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "chime::http", "access");
            tracing::info!(target: "chime::engine", "engine");
            tracing::info!(target: "sqlx::query", "statement");
        });
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn chime_log_adds_to_the_default_filter() {
        let default = passed(filter(None).unwrap());
        assert!(default.contains("engine") && !default.contains("access") && !default.contains("statement"), "{default}");
        // The README's example: access logs, and the engine's lines still there.
        let access = passed(filter(Some("chime::http=info")).unwrap());
        assert!(access.contains("access") && access.contains("engine") && !access.contains("statement"), "{access}");
        let quiet = passed(filter(Some("warn")).unwrap());
        assert!(quiet.is_empty(), "a bare level replaces the default's: {quiet}");
        let error = filter(Some("chime=loud")).unwrap_err().to_string();
        assert!(error.starts_with("CHIME_LOG: "), "{error}");
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
