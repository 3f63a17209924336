//! The console's stylesheet and script, embedded in the binary. URLs carry a hash of the
//! content, so browsers may cache them for good and still see a new version at once.

use std::collections::HashMap;
use std::sync::OnceLock;

use actix_web::http::header;
use actix_web::{HttpResponse, web};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "static/"]
struct Static;

fn versions() -> &'static HashMap<String, String> {
    static VERSIONS: OnceLock<HashMap<String, String>> = OnceLock::new();
    VERSIONS.get_or_init(|| {
        Static::iter().filter_map(|name| Some((name.to_string(), hex::encode(&Static::get(&name)?.metadata.sha256_hash()[..6])))).collect()
    })
}

/// The URL of an embedded file, with its content hash.
pub fn url(name: &str) -> String {
    format!("/static/{name}?v={}", versions().get(name).map(String::as_str).unwrap_or("0"))
}

pub async fn serve(path: web::Path<String>) -> HttpResponse {
    let Some(file) = Static::get(&path) else {
        return HttpResponse::NotFound().content_type("text/plain").body("no such file");
    };
    let content_type = match path.rsplit('.').next() {
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    };
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "public, max-age=31536000, immutable"))
        .insert_header((header::ETAG, format!("\"{}\"", hex::encode(file.metadata.sha256_hash()))))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(file.data.into_owned())
}
