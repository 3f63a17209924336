//! The browser harness itself, against a tiny page of its own (no console, no database):
//! Chromium starts, fills and submits a form, reads the answer and takes a screenshot.

use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};

use crate::browser::Browser;

const FORM: &str = r#"<!doctype html>
<html><head><title>smoke</title></head><body>
<form id="f" method="post" action="/echo">
  <input type="text" name="value" id="value" value="to be replaced">
  <select name="colour" id="colour">
    <option value="r">red</option>
    <option value="g">green</option>
  </select>
  <label><input type="checkbox" name="loud" id="loud"> loud</label>
  <button type="submit">Send</button>
</form>
</body></html>"#;

#[derive(serde::Deserialize)]
struct Echo {
    value: String,
    colour: String,
    loud: Option<String>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

async fn echo(form: web::Form<Echo>) -> HttpResponse {
    let body = format!(
        "<!doctype html><html><body><p id=\"echo\">{}</p><ul><li>{}</li><li>{}</li></ul></body></html>",
        escape(&form.value),
        escape(&form.colour),
        if form.loud.is_some() { "loud" } else { "quiet" },
    );
    HttpResponse::Ok().content_type("text/html; charset=utf-8").body(body)
}

/// The page above on 127.0.0.1, a free port; runs until the test's runtime ends.
fn serve() -> String {
    let server = HttpServer::new(|| {
        App::new()
            .route("/", web::get().to(|| async { HttpResponse::Ok().content_type("text/html; charset=utf-8").body(FORM) }))
            .route("/echo", web::post().to(echo))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let address = format!("http://{}", server.addrs()[0]);
    tokio::spawn(server.run());
    address
}

#[tokio::test]
async fn fills_and_submits_a_form_and_takes_a_screenshot() {
    let address = serve();
    let browser = Browser::start().await;

    browser.goto(&format!("{address}/")).await;
    assert!(browser.exists("form#f").await);
    assert!(!browser.exists("#echo").await);
    let typed = r#"<b>tick & "tock"</b> é"#;
    browser.fill("#value", typed).await;
    browser.select("#colour", "green").await;
    browser.check("#loud", true).await;
    browser.submit("form#f").await;

    assert_eq!(browser.current_url().await, format!("{address}/echo"));
    browser.wait_for("#echo", Duration::from_secs(5)).await;
    assert_eq!(browser.text("#echo").await, typed, "the text arrives as typed and is shown escaped");
    assert_eq!(browser.texts("li").await, ["g", "loud"]);
    assert!(browser.source().await.contains("&lt;b&gt;tick &amp; \"tock\"&lt;/b&gt;"));
    assert_eq!(browser.execute("return document.querySelectorAll('b').length").await, 0);

    let dir = std::env::temp_dir().join(format!("chime-smoke-{}", std::process::id()));
    let png = dir.join("shots/echo.png");
    browser.screenshot(&png).await;
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG: {:?}", &bytes[..bytes.len().min(8)]);
    std::fs::remove_dir_all(&dir).unwrap();

    browser.close().await;
}
