//! Console sign-in through OpenID Connect, chime's side of it as a relying party: the
//! settings, the provider's metadata and keys (read at start), the authorization request
//! (code flow with PKCE), the code's exchange and the ID token's checks. What a sign-in
//! then makes of the identity (a user, a session, a refusal) is the console's
//! (`console::oidc`) and the users' (`users::oidc`); docs/book/src/oidc.md describes it.
//!
//! The ID token comes from the token endpoint, over TLS, in exchange for a code and the
//! PKCE verifier that only this node's database knew; it is still checked in full
//! (signature by the provider's published keys, issuer, audience, expiry, nonce), so that
//! a token the provider made for another client, or an old one, signs nobody in.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Args;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The path of the console's callback, under CHIME_PUBLIC_URL: the redirect URI to register
/// at the provider.
pub const CALLBACK_PATH: &str = "/console/oidc/callback";

/// The settings of sign-in through an OpenID Provider; all unset: none.
#[derive(Clone, Default, Args)]
pub struct OidcArgs {
    /// The OpenID Provider's issuer URL (`https://login.example.com/realms/staff`) [default:
    /// unset: no sign-in through a provider]. chime reads its discovery document
    /// (`/.well-known/openid-configuration`) and keys at start, and does not start when they
    /// cannot be read. Needs CHIME_PUBLIC_URL, CHIME_OIDC_CLIENT_ID and a client secret; the
    /// redirect URI to register at the provider is CHIME_PUBLIC_URL + /console/oidc/callback.
    #[arg(long, env = "CHIME_OIDC_ISSUER")]
    pub oidc_issuer: Option<String>,

    /// The client id chime has at the provider.
    #[arg(long, env = "CHIME_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,

    /// The client secret chime has at the provider. Prefer the environment or
    /// CHIME_OIDC_CLIENT_SECRET_FILE to the flag, which others on the machine can see.
    #[arg(long, env = "CHIME_OIDC_CLIENT_SECRET", hide_env_values = true, conflicts_with = "oidc_client_secret_file")]
    pub oidc_client_secret: Option<String>,

    /// A file holding CHIME_OIDC_CLIENT_SECRET (surrounding white space is ignored), e.g. a
    /// mounted Kubernetes secret.
    #[arg(long, env = "CHIME_OIDC_CLIENT_SECRET_FILE")]
    pub oidc_client_secret_file: Option<PathBuf>,

    /// The scopes chime asks for, space-separated; `openid` is needed. Add the one that
    /// makes your provider put the groups claim in the ID token, if it needs one (`groups`
    /// at some providers).
    #[arg(long, env = "CHIME_OIDC_SCOPES", default_value = "openid profile email")]
    pub oidc_scopes: String,

    /// The ID token claim that lists the user's groups (or roles): a list of texts, or one.
    #[arg(long, env = "CHIME_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,

    /// Groups whose members are chime admins, comma-separated [default: none]. A user in
    /// none of these and none of CHIME_OIDC_SUPPORT_GROUPS is refused.
    #[arg(long, env = "CHIME_OIDC_ADMIN_GROUPS", default_value = "", hide_default_value = true)]
    pub oidc_admin_groups: String,

    /// Groups whose members are chime support staff (browse, replay, cancel),
    /// comma-separated [default: none]; admin wins for a user in both.
    #[arg(long, env = "CHIME_OIDC_SUPPORT_GROUPS", default_value = "", hide_default_value = true)]
    pub oidc_support_groups: String,

    /// The ID token claim whose value names a user made at their first sign-in
    /// (`preferred_username`, `email`); it must be a chime user name (letters, digits, `_`,
    /// `.`, `@`, `-`; at most 64). The user stays tied to the provider's subject (`sub`).
    #[arg(long, env = "CHIME_OIDC_USERNAME_CLAIM", default_value = "preferred_username")]
    pub oidc_username_claim: String,

    /// What the sign-in page's button calls the provider: "Sign in with …".
    #[arg(long, env = "CHIME_OIDC_DISPLAY_NAME", default_value = "single sign-on")]
    pub oidc_display_name: String,

    /// Seconds of clock difference with the provider allowed when checking an ID token's
    /// expiry and not-before times.
    #[arg(long, env = "CHIME_OIDC_LEEWAY_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub oidc_leeway_secs: u64,
}

impl std::fmt::Debug for OidcArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcArgs")
            .field("oidc_issuer", &self.oidc_issuer)
            .field("oidc_client_id", &self.oidc_client_id)
            .field("oidc_client_secret", &self.oidc_client_secret.as_ref().map(|_| ".."))
            .field("oidc_client_secret_file", &self.oidc_client_secret_file)
            .field("oidc_groups_claim", &self.oidc_groups_claim)
            .finish_non_exhaustive()
    }
}

impl OidcArgs {
    /// The defaults clap gives (tests build settings from this).
    pub fn defaults() -> OidcArgs {
        OidcArgs {
            oidc_scopes: "openid profile email".into(),
            oidc_groups_claim: "groups".into(),
            oidc_username_claim: "preferred_username".into(),
            oidc_display_name: "single sign-on".into(),
            oidc_leeway_secs: 60,
            ..OidcArgs::default()
        }
    }
}

/// What the provider says about itself (OpenID Connect Discovery 1.0), the fields chime uses.
#[derive(Deserialize)]
struct Metadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    code_challenge_methods_supported: Option<Vec<String>>,
}

/// The provider as this node knows it: read at start (`discover`), then used by every sign-in.
pub struct Provider {
    pub display_name: String,
    issuer: String,
    client_id: String,
    client_secret: String,
    redirect_uri: String,
    authorization_endpoint: url::Url,
    token_endpoint: String,
    jwks_uri: String,
    /// The client secret goes in the token request's body (`client_secret_post`) rather
    /// than its Authorization header: only when the provider takes no other.
    secret_in_body: bool,
    scopes: String,
    groups_claim: String,
    admin_groups: Vec<String>,
    support_groups: Vec<String>,
    username_claim: String,
    leeway: u64,
    /// The provider's keys; read again when a token names a key not among them (a rotation).
    keys: tokio::sync::RwLock<JwkSet>,
    http: reqwest::Client,
}

/// Why a sign-in through the provider was refused, in words for the person and the audit log.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Who the provider says signed in, from a checked ID token.
#[derive(Debug, Clone)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// The username claim's value, when the token carries one as text.
    pub username: Option<String>,
    pub groups: Vec<String>,
}

/// A random value for state, nonce or PKCE verifier: 32 bytes, base64url (43 characters,
/// as RFC 7636 asks of a verifier).
pub fn random_value() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The PKCE challenge of a verifier (method S256).
fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

fn list(setting: &str) -> Vec<String> {
    setting.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// How long a request to the provider may take.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

impl Provider {
    /// The provider the settings name, its metadata and keys read now; None when
    /// CHIME_OIDC_ISSUER is unset. Every error names the setting to look at.
    pub async fn discover(args: &OidcArgs, public_url: Option<&str>) -> anyhow::Result<Option<Provider>> {
        let Some(issuer) = args.oidc_issuer.as_deref().map(str::trim).filter(|i| !i.is_empty()) else {
            let others = [args.oidc_client_id.is_some(), args.oidc_client_secret.is_some(), args.oidc_client_secret_file.is_some()];
            if others.iter().any(|set| *set) {
                anyhow::bail!("CHIME_OIDC_CLIENT_ID or a client secret is set without CHIME_OIDC_ISSUER: set the provider's issuer URL too");
            }
            return Ok(None);
        };
        let parsed = url::Url::parse(issuer).map_err(|e| {
            anyhow::anyhow!(
                "CHIME_OIDC_ISSUER `{issuer}` is not a URL ({e}): give the provider's issuer, e.g. https://login.example.com/realms/staff"
            )
        })?;
        if !matches!(parsed.scheme(), "https" | "http") || parsed.query().is_some() || parsed.fragment().is_some() {
            anyhow::bail!(
                "CHIME_OIDC_ISSUER `{issuer}` must be an https:// URL without query or fragment (http:// only for a provider on this network)"
            );
        }
        let public_url = public_url.ok_or_else(|| {
            anyhow::anyhow!("CHIME_OIDC_ISSUER is set but CHIME_PUBLIC_URL is not: set it to the console's base URL as browsers reach it, whose {CALLBACK_PATH} is the redirect URI registered at the provider")
        })?;
        let client_id = args.oidc_client_id.clone().filter(|c| !c.trim().is_empty()).ok_or_else(|| {
            anyhow::anyhow!("CHIME_OIDC_ISSUER is set but CHIME_OIDC_CLIENT_ID is not: set the client id chime has at the provider")
        })?;
        let client_secret = match (&args.oidc_client_secret, &args.oidc_client_secret_file) {
            (Some(secret), _) => secret.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read CHIME_OIDC_CLIENT_SECRET_FILE {}: {e}", path.display()))?
                .trim()
                .to_string(),
            (None, None) => {
                anyhow::bail!("CHIME_OIDC_ISSUER is set but no client secret: set CHIME_OIDC_CLIENT_SECRET or CHIME_OIDC_CLIENT_SECRET_FILE")
            }
        };
        if client_secret.is_empty() {
            anyhow::bail!("the OIDC client secret (CHIME_OIDC_CLIENT_SECRET or its file) is empty");
        }
        if !args.oidc_scopes.split_whitespace().any(|s| s == "openid") {
            anyhow::bail!("CHIME_OIDC_SCOPES `{}` lacks `openid`, without which the provider sends no ID token", args.oidc_scopes);
        }
        let (admin_groups, support_groups) = (list(&args.oidc_admin_groups), list(&args.oidc_support_groups));
        if admin_groups.is_empty() && support_groups.is_empty() {
            anyhow::bail!(
                "CHIME_OIDC_ADMIN_GROUPS and CHIME_OIDC_SUPPORT_GROUPS are both empty: nobody could sign in through the provider; name the groups that make admins and support staff"
            );
        }

        // The TLS provider must be installed before any client is built (rustls with ring).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(PROVIDER_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("an HTTP client for the OpenID Provider: {e}"))?;
        let discovery = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
        let metadata: Metadata = get_json(&http, &discovery)
            .await
            .map_err(|e| anyhow::anyhow!("CHIME_OIDC_ISSUER `{issuer}`: cannot read the provider's discovery document {discovery}: {e}"))?;
        // OpenID Connect Discovery 1.0, 4.3: the document must name the issuer it was read from.
        if metadata.issuer != issuer {
            anyhow::bail!(
                "CHIME_OIDC_ISSUER `{issuer}` is not the issuer its discovery document names (`{}`): set CHIME_OIDC_ISSUER to exactly that",
                metadata.issuer
            );
        }
        if let Some(methods) = &metadata.code_challenge_methods_supported
            && !methods.iter().any(|m| m == "S256")
        {
            anyhow::bail!("CHIME_OIDC_ISSUER `{issuer}`: the provider does not offer PKCE with S256, which chime uses");
        }
        let secret_in_body = match &metadata.token_endpoint_auth_methods_supported {
            Some(methods) if !methods.iter().any(|m| m == "client_secret_basic") && methods.iter().any(|m| m == "client_secret_post") => true,
            Some(methods) if !methods.iter().any(|m| m == "client_secret_basic") => {
                anyhow::bail!(
                    "CHIME_OIDC_ISSUER `{issuer}`: the token endpoint takes neither client_secret_basic nor client_secret_post ({})",
                    methods.join(", ")
                )
            }
            _ => false,
        };
        let authorization_endpoint = url::Url::parse(&metadata.authorization_endpoint)
            .map_err(|e| anyhow::anyhow!("CHIME_OIDC_ISSUER `{issuer}`: its authorization_endpoint is not a URL: {e}"))?;
        let keys: JwkSet = get_json(&http, &metadata.jwks_uri)
            .await
            .map_err(|e| anyhow::anyhow!("CHIME_OIDC_ISSUER `{issuer}`: cannot read the provider's keys {}: {e}", metadata.jwks_uri))?;
        Ok(Some(Provider {
            display_name: args.oidc_display_name.clone(),
            issuer: issuer.to_string(),
            client_id,
            client_secret,
            redirect_uri: format!("{public_url}{CALLBACK_PATH}"),
            authorization_endpoint,
            token_endpoint: metadata.token_endpoint,
            jwks_uri: metadata.jwks_uri,
            secret_in_body,
            scopes: args.oidc_scopes.split_whitespace().collect::<Vec<_>>().join(" "),
            groups_claim: args.oidc_groups_claim.clone(),
            admin_groups,
            support_groups,
            username_claim: args.oidc_username_claim.clone(),
            leeway: args.oidc_leeway_secs,
            keys: tokio::sync::RwLock::new(keys),
            http,
        }))
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Where to send the browser: the provider's authorization endpoint with this sign-in's
    /// state, nonce and PKCE challenge.
    pub fn authorization_url(&self, state: &str, nonce: &str, verifier: &str) -> String {
        let mut url = self.authorization_endpoint.clone();
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.client_id)
            .append_pair("redirect_uri", &self.redirect_uri)
            .append_pair("scope", &self.scopes)
            .append_pair("state", state)
            .append_pair("nonce", nonce)
            .append_pair("code_challenge", &challenge(verifier))
            .append_pair("code_challenge_method", "S256");
        url.to_string()
    }

    /// The role the groups give: admin, else support, else none.
    pub fn role(&self, identity: &Identity) -> Option<&'static str> {
        let member = |groups: &[String]| identity.groups.iter().any(|g| groups.contains(g));
        if member(&self.admin_groups) {
            Some("admin")
        } else if member(&self.support_groups) {
            Some("support")
        } else {
            None
        }
    }

    /// The groups that give each role, as a refusal names them.
    pub fn role_groups(&self) -> String {
        let shown = |groups: &[String]| if groups.is_empty() { "none".to_string() } else { groups.join(", ") };
        format!("admin: {}; support: {}", shown(&self.admin_groups), shown(&self.support_groups))
    }

    /// Exchanges the code the browser brought back (with the verifier of its challenge), and
    /// checks the ID token that comes with it: who signed in, or why nobody did.
    pub async fn sign_in(&self, code: &str, verifier: &str, nonce: &str) -> Result<Identity, Refused> {
        let mut form =
            vec![("grant_type", "authorization_code"), ("code", code), ("redirect_uri", self.redirect_uri.as_str()), ("code_verifier", verifier)];
        let mut request = self.http.post(&self.token_endpoint);
        if self.secret_in_body {
            form.extend([("client_id", self.client_id.as_str()), ("client_secret", self.client_secret.as_str())]);
        } else {
            // RFC 6749, 2.3.1: each form-encoded before they are joined.
            let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            request = request.basic_auth(encode(&self.client_id), Some(encode(&self.client_secret)));
        }
        let response = request.form(&form).send().await.map_err(|e| Refused(format!("the provider's token endpoint did not answer: {e}")))?;
        let status = response.status();
        let body: Value = response.json().await.map_err(|e| Refused(format!("the provider's token endpoint answered {status} without JSON: {e}")))?;
        if !status.is_success() {
            let error = body["error"].as_str().unwrap_or("no error code");
            let description = body["error_description"].as_str().map(|d| format!(" ({d})")).unwrap_or_default();
            return Err(Refused(format!("the provider refused the sign-in code: {error}{description}")));
        }
        let id_token = body["id_token"].as_str().ok_or_else(|| Refused("the provider's answer carries no ID token".into()))?;
        let claims = self.check(id_token, nonce).await?;
        let subject = claims["sub"].as_str().filter(|s| !s.is_empty()).ok_or_else(|| Refused("the ID token names no subject".into()))?;
        let groups = match &claims[self.groups_claim.as_str()] {
            Value::Array(items) => items.iter().filter_map(|g| g.as_str().map(str::to_string)).collect(),
            Value::String(one) => vec![one.clone()],
            _ => vec![],
        };
        Ok(Identity {
            issuer: self.issuer.clone(),
            subject: subject.to_string(),
            username: claims[self.username_claim.as_str()].as_str().map(str::to_string),
            groups,
        })
    }

    /// An ID token's claims, once its signature (by one of the provider's keys), issuer,
    /// audience (this client), expiry and nonce are checked.
    async fn check(&self, token: &str, nonce: &str) -> Result<Value, Refused> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| Refused(format!("the ID token cannot be read: {e}")))?;
        // Keys the provider publishes only: never a shared secret (HS*) or none.
        const SIGNED: [Algorithm; 9] = [
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
            Algorithm::ES256,
            Algorithm::ES384,
            Algorithm::EdDSA,
        ];
        if !SIGNED.contains(&header.alg) {
            return Err(Refused(format!("the ID token is signed with {:?}, which chime does not accept", header.alg)));
        }
        let key = match self.key(header.kid.as_deref()).await {
            Some(key) => key,
            None => {
                // The provider may have rotated its keys since they were read.
                self.reload_keys().await?;
                self.key(header.kid.as_deref())
                    .await
                    .ok_or_else(|| Refused("the ID token is signed with a key the provider does not publish".into()))?
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.client_id]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| Refused(refusal(&e, &self.client_id)))?.claims;
        // OpenID Connect Core 1.0, 3.1.3.7: a token for several audiences names us as its party.
        if claims["aud"].as_array().is_some_and(|a| a.len() > 1) && claims["azp"].as_str() != Some(self.client_id.as_str()) {
            return Err(Refused(format!("the ID token was issued to another client (azp {}), not to `{}`", claims["azp"], self.client_id)));
        }
        if claims["nonce"].as_str() != Some(nonce) {
            return Err(Refused("the ID token's nonce is not this sign-in's: it was made for another one".into()));
        }
        Ok(claims)
    }

    /// The published key the token names (by `kid`; the only one when it names none).
    async fn key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read().await;
        let signing = keys.keys.iter().filter(|k| !matches!(k.common.public_key_use, Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)));
        let found: Vec<_> = match kid {
            Some(kid) => signing.filter(|k| k.common.key_id.as_deref() == Some(kid)).collect(),
            None => signing.collect(),
        };
        match found.as_slice() {
            [one] => DecodingKey::from_jwk(one).ok(),
            _ => None,
        }
    }

    async fn reload_keys(&self) -> Result<(), Refused> {
        let keys: JwkSet = get_json(&self.http, &self.jwks_uri).await.map_err(|e| Refused(format!("the provider's keys cannot be read: {e}")))?;
        *self.keys.write().await = keys;
        Ok(())
    }
}

/// Why the ID token was refused, in words.
fn refusal(e: &jsonwebtoken::errors::Error, client_id: &str) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => "the ID token has expired".into(),
        ErrorKind::ImmatureSignature => "the ID token is not valid yet".into(),
        ErrorKind::InvalidAudience => format!("the ID token was issued to another client, not to `{client_id}` (wrong audience)"),
        ErrorKind::InvalidIssuer => "the ID token was issued by another issuer than CHIME_OIDC_ISSUER".into(),
        ErrorKind::InvalidSignature => "the ID token's signature is not the provider's".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the ID token lacks the `{claim}` claim"),
        other => format!("the ID token is not valid: {other:?}"),
    }
}

async fn get_json<T: serde::de::DeserializeOwned>(http: &reqwest::Client, url: &str) -> Result<T, String> {
    let response = http.get(url).send().await.map_err(|e| format!("no answer ({e})"))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    response.json().await.map_err(|e| format!("not the JSON expected ({e})"))
}

/// Whether two texts are equal, in a time that does not depend on where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pkce_challenge_is_rfc_7636s() {
        // RFC 7636, Appendix B.
        assert_eq!(challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        assert_eq!(random_value().len(), 43);
    }

    #[test]
    fn group_lists_ignore_blanks() {
        assert_eq!(list(" chime-admins, ,ops "), ["chime-admins", "ops"]);
        assert!(list("").is_empty());
    }
}
