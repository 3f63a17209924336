//! Bearer tokens: an API token acts for exactly one biz type; an admin token acts only on
//! `/api/v1/admin/`. Neither is accepted where the other belongs.

use std::future::Future;
use std::pin::Pin;

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};

use super::ApiError;
use crate::admin_tokens::{self, AdminToken};
use crate::biz_types::{self, TokenAuth};
use crate::state::AppState;

/// The bearer token of a request, or why there is none.
fn bearer(req: &HttpRequest) -> Result<String, ApiError> {
    match req.headers().get("Authorization").map(|v| v.to_str()) {
        None => Err(ApiError::Unauthenticated("missing token: send `Authorization: Bearer <token>`".into())),
        Some(Err(_)) => Err(ApiError::Unauthenticated("the Authorization header is not valid text".into())),
        Some(Ok(h)) => match h.strip_prefix("Bearer ") {
            Some(t) if !t.trim().is_empty() => Ok(t.trim().to_owned()),
            _ => Err(ApiError::Unauthenticated("the Authorization header must be `Bearer <token>`".into())),
        },
    }
}

/// The authenticated caller of an API request.
pub struct Caller(pub TokenAuth);

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned().expect("AppState is registered");
        let token = bearer(req);
        Box::pin(async move {
            let token = token?;
            let auth = match state.tokens.get(&token) {
                Some(auth) => auth,
                None => match biz_types::authenticate(&state.pool, &token).await? {
                    Some(auth) => {
                        state.tokens.put(token, auth.clone());
                        auth
                    }
                    None => {
                        if admin_tokens::authenticate(&state.pool, &token).await?.is_some() {
                            return Err(ApiError::Forbidden(
                                "this is an admin token: it acts only on /api/v1/admin/; use an API token of the biz type".into(),
                            ));
                        }
                        return Err(ApiError::Unauthenticated("the token is not valid or has been revoked".into()));
                    }
                },
            };
            if auth.archived {
                return Err(ApiError::Forbidden(format!("biz type `{}` is archived: its tokens no longer work", auth.biz_type)));
            }
            // "Last used", for whoever wonders which token is safe to revoke: recorded off
            // the request's path, at most once a minute per token (not a write per call).
            if state.tokens.use_due(auth.token_id) {
                let (pool, token_id) = (state.pool.clone(), auth.token_id);
                tokio::spawn(async move {
                    if let Err(e) = biz_types::record_use(&pool, token_id).await {
                        tracing::debug!(error = %e, %token_id, "api: a token's last use was not recorded; the next use a minute on tries again");
                    }
                });
            }
            Ok(Caller(auth))
        })
    }
}

impl Caller {
    /// Checks that the named biz type is the caller's: 404 if there is no such biz type,
    /// 403 if it is another one.
    pub async fn require(&self, state: &AppState, biz_type: &str) -> Result<(), ApiError> {
        if biz_type == self.0.biz_type {
            return Ok(());
        }
        if biz_types::exists(&state.pool, biz_type).await? {
            Err(self.forbidden(biz_type))
        } else {
            Err(ApiError::NotFound(format!("no biz type named `{}`", biz_type.escape_debug())))
        }
    }

    pub fn forbidden(&self, biz_type: &str) -> ApiError {
        ApiError::Forbidden(format!("this token belongs to biz type `{}`, not `{}`", self.0.biz_type, biz_type.escape_debug()))
    }

    /// The actor recorded in the audit log.
    pub fn actor(&self) -> String {
        format!("api:{}", self.0.biz_type)
    }
}

/// The admin token of a request to `/api/v1/admin/`.
pub struct Admin(pub AdminToken);

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned().expect("AppState is registered");
        let token = bearer(req);
        Box::pin(async move {
            let token = token?;
            if let Some(admin) = admin_tokens::authenticate(&state.pool, &token).await? {
                return Ok(Admin(admin));
            }
            if biz_types::authenticate(&state.pool, &token).await?.is_some() {
                return Err(ApiError::Forbidden(
                    "this is a biz type's API token: the admin API needs an admin token (`chime admin-token create`)".into(),
                ));
            }
            Err(ApiError::Unauthenticated("the admin token is not valid or has been revoked".into()))
        })
    }
}
