//! A one-time secret (a new signing secret or API token) carried from the action that made
//! it to the page that shows it, once.
//!
//! Actions answer with a redirect (post/redirect/get), so that reloading the page they lead
//! to repeats nothing: before, "New token" and "Rotate signing secret" answered the POST
//! with the page itself, and a reload minted a second token or rotated again (killing the
//! secret just copied). The secret travels in a short-lived cookie scoped to the biz type's
//! page, sealed (XChaCha20-Poly1305) with a key derived from the session's token and bound
//! to that page: another session, or another page, cannot open it. The page that shows it
//! removes the cookie, so a reload does not show it again. A cookie rather than a server-side
//! store because the redirect may land on another node; the database holds no copy.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::{HttpRequest, HttpResponse};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::Session;

const COOKIE: &str = "chime_reveal";
const NONCE_LEN: usize = 24;
/// Long enough to follow a redirect, short enough that a secret not shown is soon gone.
const LIFETIME_SECS: i64 = 60;

/// What is shown once, and its value: ("signing secret", "…").
pub type Revealed = (String, String);

/// A session's sealing key; its `Debug` does not show it.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Key {
    /// Derived from the session cookie's token (the database keeps a different hash of it).
    pub fn of_session(token: &str) -> Key {
        Key(Sha256::new().chain_update(b"chime console reveal\0").chain_update(token.as_bytes()).finalize().into())
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

fn cipher(session: &Session) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(&session.reveal_key.0.into())
}

/// Adds to `response` (a redirect to `page`) the secret to show there once.
pub fn set(req: &HttpRequest, response: &mut HttpResponse, session: &Session, page: &str, what: &str, secret: &str) {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    let plain = format!("{what}\0{secret}");
    let sealed = cipher(session)
        .encrypt(&XNonce::from(nonce), Payload { msg: plain.as_bytes(), aad: page.as_bytes() })
        .expect("XChaCha20-Poly1305 seals a message of any size a secret has");
    let cookie = Cookie::build(COOKIE, URL_SAFE_NO_PAD.encode([&nonce[..], &sealed].concat()))
        .path(page.to_string())
        .http_only(true)
        .secure(super::session::secure(req))
        .same_site(SameSite::Strict)
        .max_age(actix_web::cookie::time::Duration::seconds(LIFETIME_SECS))
        .finish();
    let _ = response.add_cookie(&cookie);
}

/// The secret left for `page` by this session's last action, if any; `forget` must be
/// called on the page's response, whether or not there was one to show.
pub fn take(req: &HttpRequest, session: &Session, page: &str) -> Option<Revealed> {
    let raw = URL_SAFE_NO_PAD.decode(req.cookie(COOKIE)?.value()).ok()?;
    let (nonce, sealed) = raw.split_at_checked(NONCE_LEN)?;
    let nonce = XNonce::try_from(nonce).ok()?;
    let plain = cipher(session).decrypt(&nonce, Payload { msg: sealed, aad: page.as_bytes() }).ok()?;
    let plain = String::from_utf8(plain).ok()?;
    let (what, secret) = plain.split_once('\0')?;
    Some((what.to_string(), secret.to_string()))
}

/// Removes the cookie that `take` read, so that a reload shows nothing.
pub fn forget(req: &HttpRequest, response: &mut HttpResponse, page: &str) {
    if req.cookie(COOKIE).is_some() {
        let mut gone = Cookie::build(COOKIE, "").path(page.to_string()).finish();
        gone.make_removal();
        let _ = response.add_cookie(&gone);
    }
}
