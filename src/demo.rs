//! The quick start: on the first start of an embedded chime, a `demo` biz type whose
//! callbacks go to a small receiver built into chime itself, so that the first `curl`
//! shows a delivery in the log without writing a receiver.

use crate::db::Pool;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::biz_types::{self, Settings};
use crate::callback_hosts::CallbackHosts;
use crate::state::AppState;

pub const PATH: &str = "/demo/callback";

/// Creates the `demo` biz type and a token for it when there is no biz type at all.
/// Returns the token when it was created here.
pub async fn ensure(pool: &Pool, callback_url: &str) -> Result<Option<String>, crate::error::Error> {
    let any: bool = crate::db::query_scalar("SELECT EXISTS (SELECT 1 FROM biz_types)").fetch_one(pool).await?;
    if any {
        return Ok(None);
    }
    let settings = Settings {
        callback_url: Some(callback_url.to_string()),
        description: Some("Quick start: callbacks go to chime's built-in demo receiver, which logs them.".into()),
        max_attempts: Some(3),
        ..Default::default()
    };
    // Made by chime itself on its first start: audited as such.
    let audit = crate::audit::CHIME;
    match biz_types::create_audited(pool, "demo", &settings, CallbackHosts::Any, audit).await {
        Ok(_) => {
            let (_, token) = biz_types::mint_token(pool, "demo", None, audit).await?;
            Ok(Some(token))
        }
        // Another node made it first.
        Err(crate::error::Error::Conflict(..)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The built-in receiver: checks the signature against the demo biz type's secret and logs
/// the callback.
pub async fn receive(req: HttpRequest, body: web::Bytes, state: web::Data<AppState>) -> HttpResponse {
    let Ok(Some(demo)) = biz_types::by_name(&state.pool, "demo").await else {
        return HttpResponse::NotFound().finish();
    };
    let secret = match demo.signing_secret.expose() {
        Ok(secret) => secret,
        Err(e) => {
            tracing::error!("demo receiver: {e}");
            return HttpResponse::InternalServerError().finish();
        }
    };
    let signature = req.headers().get("Chime-Signature").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let t = signature.strip_prefix("t=").and_then(|s| s.split(',').next()).and_then(|t| t.parse().ok());
    // Any `v1` may match: after a rotation, the old secret's comes second (docs/design/contract.md, Notices and signatures).
    let matches = |t: i64| {
        let expected = crate::engine::signature(secret, t, &body);
        let expected_v1 = expected.split(',').nth(1).unwrap_or_default();
        signature.split(',').skip(1).any(|v1| v1 == expected_v1)
    };
    if t.is_none_or(|t| !matches(t)) {
        tracing::warn!("demo receiver: a callback with a wrong signature was refused");
        return HttpResponse::Unauthorized().finish();
    }
    tracing::info!(target: "chime::demo", "demo receiver got a callback (signature verified): {}", String::from_utf8_lossy(&body));
    HttpResponse::NoContent().finish()
}
