//! Bearer tokens: each one acts for exactly one biz type.

use std::future::Future;
use std::pin::Pin;

use actix_web::{FromRequest, HttpRequest, dev::Payload, web};

use super::{ApiError, AppState};
use crate::biz_types::{self, TokenAuth};

/// The authenticated caller of an API request.
pub struct Caller(pub TokenAuth);

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned().expect("AppState is registered");
        let header = req.headers().get("Authorization").map(|v| v.to_str().map(str::to_owned));
        Box::pin(async move {
            let token = match header {
                None => return Err(ApiError::Unauthenticated("missing token: send `Authorization: Bearer <token>`".into())),
                Some(Err(_)) => return Err(ApiError::Unauthenticated("the Authorization header is not valid text".into())),
                Some(Ok(h)) => match h.strip_prefix("Bearer ") {
                    Some(t) if !t.trim().is_empty() => t.trim().to_owned(),
                    _ => return Err(ApiError::Unauthenticated("the Authorization header must be `Bearer <token>`".into())),
                },
            };
            match biz_types::authenticate(&state.pool, &token).await? {
                Some(auth) => Ok(Caller(auth)),
                None => Err(ApiError::Unauthenticated("the token is not valid or has been revoked".into())),
            }
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
        match biz_types::by_name(&state.pool, biz_type).await? {
            None => Err(ApiError::NotFound(format!("no biz type named `{biz_type}`"))),
            Some(_) => Err(ApiError::Forbidden(format!(
                "this token belongs to biz type `{}`, not `{biz_type}`",
                self.0.biz_type
            ))),
        }
    }

    /// The actor recorded in the audit log.
    pub fn actor(&self) -> String {
        format!("api:{}", self.0.biz_type)
    }
}
