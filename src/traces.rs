//! OpenTelemetry traces over OTLP/HTTP (docs/book/src/traces.md): off unless an
//! `OTEL_EXPORTER_OTLP_*` endpoint is set, with the variables the OpenTelemetry
//! specification names, checked at start.
//!
//! What is traced: a create request (a server span), and for each claimed task its claim,
//! each callback attempt (a client span, whose id the callback's `traceparent` carries) and
//! its record, all children of the span the creator's `traceparent` named, so that a
//! task's life joins the trace of the request that made it. A task created without one
//! gets a trace per claim: its claim span is the root, its attempt and record its children.
//!
//! Why the OpenTelemetry API directly rather than `tracing` spans bridged by
//! tracing-opentelemetry: a task's spans are not the scope of one piece of code (a claim
//! and a record are batches of many tasks; each span's parent is read from a column, its
//! times are the batch's), and a `tracing` span per task would be built for the log's
//! subscriber too, on and off alike. Here, with tracing off, `tracer()` is None and the
//! engine builds nothing per task.
//!
//! A collector that is down never slows a delivery: finished spans go into the SDK's
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048), exported in batches by the SDK's own
//! thread through a blocking HTTP client; a full queue drops spans.

use std::sync::OnceLock;
use std::time::Duration;

use clap::Args;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// The span type the engine and the API build.
pub type Span = opentelemetry_sdk::trace::Span;

/// The OpenTelemetry settings chime reads itself, named as the specification names them
/// (each a flag too, for the config file). The exporter and the SDK read the rest of the
/// specification's variables from the environment: `OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
/// `OTEL_BSP_*` (docs/book/src/traces.md).
#[derive(Debug, Clone, Default, Args)]
pub struct TraceArgs {
    /// OpenTelemetry: the collector's OTLP/HTTP base URL (`http://localhost:4318`); traces
    /// go to its `/v1/traces`. Setting it (or the traces endpoint) turns traces on
    /// [default: unset: no traces].
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otel_exporter_otlp_endpoint: Option<String>,

    /// OpenTelemetry: the URL traces are posted to, as it is (`http://localhost:4318/v1/traces`);
    /// wins over OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", value_name = "URL")]
    pub otel_exporter_otlp_traces_endpoint: Option<String>,

    /// OpenTelemetry: the OTLP protocol; chime speaks `http/protobuf` only (a collector's
    /// port 4318), and refuses to start with another [default: http/protobuf].
    #[arg(long, env = "OTEL_EXPORTER_OTLP_PROTOCOL", value_name = "PROTOCOL")]
    pub otel_exporter_otlp_protocol: Option<String>,

    /// OpenTelemetry: the protocol for traces, winning over OTEL_EXPORTER_OTLP_PROTOCOL;
    /// `http/protobuf` only.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", value_name = "PROTOCOL")]
    pub otel_exporter_otlp_traces_protocol: Option<String>,

    /// OpenTelemetry: `otlp` exports traces (to http://localhost:4318 when no endpoint is
    /// set), `none` turns them off whatever the endpoint says [default: otlp when an
    /// endpoint is set, else none].
    #[arg(long, env = "OTEL_TRACES_EXPORTER", value_name = "EXPORTER")]
    pub otel_traces_exporter: Option<String>,

    /// OpenTelemetry: `true` turns traces off whatever else is set [default: false].
    #[arg(long, env = "OTEL_SDK_DISABLED", value_name = "BOOL")]
    pub otel_sdk_disabled: Option<String>,

    /// OpenTelemetry: the `service.name` of chime's spans [default: chime, or the
    /// service.name in OTEL_RESOURCE_ATTRIBUTES].
    #[arg(long, env = "OTEL_SERVICE_NAME", value_name = "NAME")]
    pub otel_service_name: Option<String>,
}

/// Where traces go, once the settings are checked.
#[derive(Debug, PartialEq)]
struct Export {
    /// The URL spans are posted to.
    endpoint: String,
    service_name: Option<String>,
}

/// The traces endpoint when only `OTEL_TRACES_EXPORTER=otlp` is set (the specification's).
const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// How long the last spans have to reach the collector when the node stops.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(3);

/// An unset or empty variable is unset (the specification's rule).
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// Checks the settings: None when traces are off, or what is wrong, naming the variable.
fn resolve(args: &TraceArgs) -> Result<Option<Export>, String> {
    let disabled = match given(&args.otel_sdk_disabled).map(str::to_ascii_lowercase).as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(format!("OTEL_SDK_DISABLED: `{other}` is neither true nor false")),
    };
    let mut otlp = None;
    if let Some(exporters) = given(&args.otel_traces_exporter) {
        for exporter in exporters.split(',').map(str::trim) {
            match exporter {
                "otlp" => otlp = Some(otlp.unwrap_or(true)),
                "none" => otlp = Some(false),
                other => {
                    return Err(format!("OTEL_TRACES_EXPORTER: `{other}` is not an exporter chime has; give `otlp` (OTLP over HTTP) or `none`"));
                }
            }
        }
    }
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", &args.otel_exporter_otlp_traces_protocol),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", &args.otel_exporter_otlp_protocol),
    ] {
        if let Some(protocol) = given(value).filter(|p| *p != "http/protobuf") {
            return Err(format!(
                "{var}: `{protocol}` is not supported: chime exports traces as OTLP over HTTP with protobuf; \
                 give `http/protobuf` (a collector's port 4318) or leave it unset"
            ));
        }
    }
    let traces = given(&args.otel_exporter_otlp_traces_endpoint);
    let base = given(&args.otel_exporter_otlp_endpoint);
    let endpoint = match (traces, base) {
        (Some(url), _) => check_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)?,
        (None, Some(url)) => format!("{}/v1/traces", check_url("OTEL_EXPORTER_OTLP_ENDPOINT", url)?.trim_end_matches('/')),
        (None, None) => format!("{DEFAULT_ENDPOINT}/v1/traces"),
    };
    let on = !disabled && otlp.unwrap_or(traces.is_some() || base.is_some());
    let service_name = given(&args.otel_service_name).map(str::to_owned);
    Ok(on.then_some(Export { endpoint, service_name }))
}

/// An OTLP/HTTP endpoint: an http:// or https:// URL with a host.
fn check_url(var: &str, raw: &str) -> Result<String, String> {
    let example = "e.g. http://localhost:4318";
    let url = url::Url::parse(raw).map_err(|e| format!("{var}: `{raw}` is not a URL ({e}): give the collector's OTLP/HTTP address, {example}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{var}: `{raw}` must be an http:// or https:// URL with a host, {example}"));
    }
    Ok(url.as_str().to_string())
}

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The tracer when traces are on; None (the default, and in tests that run a node in
/// process) when off: then no span is built.
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// The exporting SDK of a node whose traces are on, to flush when it stops.
pub struct Tracing {
    provider: SdkTracerProvider,
}

/// Checks the settings and, if traces are on, installs the process's tracer. An error names
/// the variable that is wrong; a node refuses to start with it.
pub fn start(args: &TraceArgs) -> anyhow::Result<Option<Tracing>> {
    let Some(export) = resolve(args).map_err(anyhow::Error::msg)? else {
        return Ok(None);
    };
    // The blocking client is built with rustls, whose provider (ring) must be installed first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(&export.endpoint)
        .build()
        .map_err(|e| anyhow::anyhow!("OpenTelemetry: cannot export traces to {} (OTEL_EXPORTER_OTLP_*): {e}", export.endpoint))?;
    let mut resource = Resource::builder();
    // OTEL_SERVICE_NAME, else OTEL_RESOURCE_ATTRIBUTES' service.name, else chime.
    let detected = Resource::builder().build();
    let unnamed = detected.get(&opentelemetry::Key::new("service.name")).is_none_or(|name| name.as_str().starts_with("unknown_service"));
    match export.service_name {
        Some(name) => resource = resource.with_service_name(name),
        None if unnamed => resource = resource.with_service_name("chime"),
        None => {}
    }
    let resource = resource.with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("chime");
    if TRACER.set(tracer).is_err() {
        anyhow::bail!("traces were started twice in one process");
    }
    tracing::info!(endpoint = %export.endpoint, "exporting traces over OTLP/HTTP (docs/book/src/traces.md)");
    Ok(Some(Tracing { provider }))
}

impl Tracing {
    /// Exports the spans still queued (for at most `SHUTDOWN_FLUSH`) and stops the exporter.
    pub async fn stop(self) {
        let provider = self.provider;
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_FLUSH)).await;
        if let Ok(Err(e)) = flushed {
            tracing::warn!(error = %e, "the last spans may not have reached the collector");
        }
    }
}

/// The context a stored W3C `traceparent` names (`tasks::traceparent` kept only well-formed
/// ones): a remote parent. None for none, or one this cannot read.
pub fn remote_parent(traceparent: Option<&str>) -> Option<Context> {
    let mut fields = traceparent?.split('-');
    let (_version, trace_id, span_id, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let parent = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    parent.is_valid().then(|| Context::new().with_remote_span_context(parent))
}

/// The W3C `traceparent` that names `span` as the parent: what a callback carries so that
/// the receiver's spans are children of its attempt.
pub fn traceparent_of(span: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", span.trace_id(), span.span_id(), span.trace_flags().to_u8())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(vars: &[(&str, &str)]) -> TraceArgs {
        let get = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
        TraceArgs {
            otel_exporter_otlp_endpoint: get("OTEL_EXPORTER_OTLP_ENDPOINT"),
            otel_exporter_otlp_traces_endpoint: get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            otel_exporter_otlp_protocol: get("OTEL_EXPORTER_OTLP_PROTOCOL"),
            otel_exporter_otlp_traces_protocol: get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
            otel_traces_exporter: get("OTEL_TRACES_EXPORTER"),
            otel_sdk_disabled: get("OTEL_SDK_DISABLED"),
            otel_service_name: get("OTEL_SERVICE_NAME"),
        }
    }

    fn endpoint(vars: &[(&str, &str)]) -> Option<String> {
        resolve(&args(vars)).unwrap().map(|e| e.endpoint)
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_or_the_exporter_says_otlp() {
        assert_eq!(endpoint(&[]), None);
        assert_eq!(endpoint(&[("OTEL_SERVICE_NAME", "orders-timers")]), None);
        assert_eq!(endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]), None, "empty is unset");
        // The base URL gets the signal's path; the traces URL is taken as it is, and wins.
        assert_eq!(endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).as_deref(), Some("http://collector:4318/v1/traces"));
        assert_eq!(
            endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel.example.com/otlp")]).as_deref(),
            Some("https://otel.example.com/otlp/v1/traces")
        );
        assert_eq!(
            endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/traces")])
                .as_deref(),
            Some("http://collector:4318/traces")
        );
        assert_eq!(endpoint(&[("OTEL_TRACES_EXPORTER", "otlp")]).as_deref(), Some("http://localhost:4318/v1/traces"));
        // Off whatever the endpoint says.
        assert_eq!(endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), ("OTEL_TRACES_EXPORTER", "none")]), None);
        assert_eq!(endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), ("OTEL_SDK_DISABLED", "TRUE")]), None);
        assert!(endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), ("OTEL_SDK_DISABLED", "false")]).is_some());
        assert!(endpoint(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_some());
    }

    #[test]
    fn a_bad_setting_is_refused_naming_its_variable() {
        let refused = |vars: &[(&str, &str)]| resolve(&args(vars)).unwrap_err();
        for (var, bad) in [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector/"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http//collector:4318/v1/traces"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_SDK_DISABLED", "yes"),
        ] {
            // Beside a good endpoint, so that the bad setting is what is refused.
            let message = match var {
                "OTEL_EXPORTER_OTLP_ENDPOINT" => refused(&[(var, bad)]),
                _ => refused(&[(var, bad), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]),
            };
            assert!(message.starts_with(&format!("{var}: ")), "{var}={bad}: {message}");
            assert!(message.contains(bad), "{var}={bad}: {message}");
        }
    }

    #[test]
    fn a_stored_traceparent_is_the_remote_parent_and_a_span_is_written_back_as_one() {
        let parent = remote_parent(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")).unwrap();
        let span = parent.span().span_context().clone();
        assert!(span.is_remote() && span.is_sampled());
        assert_eq!(traceparent_of(&span), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let unsampled = remote_parent(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")).unwrap();
        assert!(!unsampled.span().span_context().is_sampled());
        assert!(remote_parent(None).is_none());
        assert!(remote_parent(Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01")).is_none());
    }
}
