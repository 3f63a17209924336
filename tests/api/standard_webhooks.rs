//! The `standard-webhooks` signing scheme (docs/book/src/standard-webhooks.md): the setting
//! through every writer, and real callbacks and a real failure notice from a real node,
//! verified by the specification's own libraries (PyPI's and npm's `standardwebhooks`,
//! which tests/setup.sh installs under target/), not by code of ours.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::admin::{admin_token, console_error};
use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, spawn_app, spawn_node, wait_until};
use crate::receiver::{Answer, Received, Receiver};

/// A secret in the form chime made before its secrets were `whsec_` and standard base64
/// (URL-safe, unpadded): chime's own scheme signs with it, Standard Webhooks cannot.
const OLD_FORM_SECRET: &str = "whsec_q-Zp3_0L7nV2x9YkQe1-Rb_Tj5sW8uHcDfGa4mNo6iE";

/// Gives the biz type a secret of the old form, as a database from before this release has.
async fn give_old_form_secret(app: &TestApp, name: &str) {
    sqlx::query("UPDATE biz_types SET signing_secret = $2, signing_secret_sealed = NULL WHERE name = $1")
        .bind(name)
        .bind(OLD_FORM_SECRET)
        .execute(&app.pool)
        .await
        .unwrap();
}

/// The scheme is `chime` unless given; the admin API, the console's form, `chime biz-type`
/// and `chime apply` take `standard-webhooks`, and refuse anything else naming
/// `signing_scheme`. A biz type whose secret is older than the `whsec_<base64>` form is
/// refused the switch (API 422 and the console's field, both naming what to do) until its
/// secret is rotated; `chime apply` switches it when the file gives a `whsec_` secret, and
/// refuses one not in that form naming `signing_secret`.
#[tokio::test]
async fn the_signing_scheme_is_taken_answered_and_checked() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    let url = "http://127.0.0.1:9/";
    let plain = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "plain", "callback_url": url})).await;
    assert_eq!((plain.status, &plain.body["signing_scheme"]), (201, &json!("chime")), "{}", plain.body);
    let created =
        app.post("/api/v1/admin/biz-types", &admin, json!({"name": "std", "callback_url": url, "signing_scheme": "standard-webhooks"})).await;
    assert_eq!((created.status, &created.body["signing_scheme"]), (201, &json!("standard-webhooks")), "{}", created.body);
    let secret = created.body["signing_secret"].as_str().unwrap();
    assert!(chime::biz_types::whsec_key(secret).is_some_and(|key| key.len() == 32), "a whsec_ secret of 32 bytes: {secret}");
    assert_eq!(app.get("/api/v1/admin/biz-types/std", &admin).await.body["signing_scheme"], json!("standard-webhooks"));
    for bad in [json!("Standard-Webhooks"), json!("hmac"), json!(""), json!(1)] {
        let refused = app.patch("/api/v1/admin/biz-types/plain", &admin, json!({"signing_scheme": bad})).await;
        assert_eq!(refused.status, 422, "{bad}: {}", refused.body);
        assert!(refused.message().starts_with("signing_scheme: "), "{bad}: {}", refused.body);
    }
    assert_eq!(
        app.patch("/api/v1/admin/biz-types/plain", &admin, json!({"signing_scheme": "hmac"})).await.message(),
        "signing_scheme: must be `chime` or `standard-webhooks`"
    );
    // A secret chime makes now is in the form: the switch is accepted, and back.
    let switched = app.patch("/api/v1/admin/biz-types/plain", &admin, json!({"signing_scheme": "standard-webhooks"})).await;
    assert_eq!((switched.status, &switched.body["signing_scheme"]), (200, &json!("standard-webhooks")), "{}", switched.body);
    let back = app.patch("/api/v1/admin/biz-types/plain", &admin, json!({"signing_scheme": "chime"})).await;
    assert_eq!((back.status, &back.body["signing_scheme"]), (200, &json!("chime")), "{}", back.body);

    // An old secret: refused until rotated, the secret kept.
    give_old_form_secret(&app, "plain").await;
    let refused = app.patch("/api/v1/admin/biz-types/plain", &admin, json!({"signing_scheme": "standard-webhooks"})).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused.message().starts_with("signing_scheme: standard-webhooks signs with a secret in the form `whsec_<base64>`")
            && refused.message().contains("rotate the signing secret first"),
        "{}",
        refused.body
    );
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let form = [("mode", "callback"), ("callback_url", url), ("signing_scheme", "standard-webhooks")];
    let page = console.post("/console/biz-types/plain", &form).await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(console_error(&page.body, "signing_scheme").contains("rotate the signing secret first"), "{}", page.body);
    let page = console.post("/console/biz-types/plain", &[("mode", "callback"), ("callback_url", url), ("signing_scheme", "hmac")]).await;
    assert_eq!(console_error(&page.body, "signing_scheme"), "must be `chime` or `standard-webhooks`");
    assert_eq!(app.get("/api/v1/admin/biz-types/plain", &admin).await.body["signing_scheme"], json!("chime"), "nothing refused was stored");
    let rotated = app.post("/api/v1/admin/biz-types/plain/rotate-secret", &admin, json!({"overlap_secs": 0})).await;
    assert!(chime::biz_types::whsec_key(rotated.body["signing_secret"].as_str().unwrap()).is_some(), "{}", rotated.body);
    assert_eq!(console.post("/console/biz-types/plain", &form).await.status, 303, "switched once rotated");
    let page = console.get("/console/biz-types/plain").await.body;
    assert!(page.contains(r#"<option value="standard-webhooks" selected>"#) && page.contains(r#"id="signing-scheme""#), "{page}");
    let page = console.get("/console/biz-types/new").await.body;
    assert!(page.contains(r#"<option value="chime" selected>"#), "a new biz type's form starts at chime: {page}");

    let db = ("DATABASE_URL", app.db_url.as_str());
    let out = chime(&[db], &["biz-type", "create", "cli-std", "--callback-url", url, "--signing-scheme", "standard-webhooks"], None).await;
    assert!(out.ok && out.stdout.contains("verify the webhook-signature header with it"), "{}{}", out.stdout, out.stderr);
    assert!(chime::biz_types::whsec_key(out.last_line()).is_some(), "{}", out.stdout);
    let out = chime(&[db], &["biz-type", "update", "plain", "--signing-scheme", "chime"], None).await;
    assert!(out.ok && !out.stdout.contains("signed"), "{}{}", out.stdout, out.stderr);
    let out = chime(&[db], &["biz-type", "update", "plain", "--signing-scheme", "standard-webhooks"], None).await;
    assert!(out.ok && out.stdout.contains(", signed standard-webhooks"), "{}{}", out.stdout, out.stderr);

    // `chime apply`: the file's secret must be in the form, and switches an old one.
    let back = app.patch("/api/v1/admin/biz-types/std", &admin, json!({"signing_scheme": "chime"})).await;
    assert_eq!(back.status, 200, "switching back to chime is always accepted: {}", back.body);
    give_old_form_secret(&app, "std").await;
    let dir = std::env::temp_dir().join(format!("chime-swh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chime.toml");
    let write = |scheme: &str| {
        let text = format!("[biz_types.std]\ncallback_url = \"{url}\"\nsigning_scheme = \"{scheme}\"\nsigning_secret = {{ env = \"SWH_SECRET\" }}\n");
        std::fs::write(&file, text).unwrap();
        file.to_str().unwrap().to_string()
    };
    let path = write("standard-webhooks");
    let out = chime(&[db, ("SWH_SECRET", "not-a-whsec-secret-at-all")], &["apply", "-f", &path], None).await;
    assert!(!out.ok && out.stderr.contains("signing_secret: must be `whsec_` and the standard base64"), "{}{}", out.stdout, out.stderr);
    std::fs::write(&file, format!("[biz_types.std]\ncallback_url = \"{url}\"\nsigning_scheme = \"standard-webhooks\"\n")).unwrap();
    let out = chime(&[db], &["apply", "-f", file.to_str().unwrap()], None).await;
    assert!(!out.ok && out.stderr.contains("signing_scheme: standard-webhooks signs with a secret in the form"), "{}{}", out.stdout, out.stderr);
    // A whsec_ secret and the switch in one file.
    let new_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let out = chime(&[db, ("SWH_SECRET", new_secret)], &["apply", "-f", &write("standard-webhooks")], None).await;
    assert!(out.ok && out.stdout.contains("signing_scheme: chime → standard-webhooks"), "{}{}", out.stdout, out.stderr);
    let stored = chime::biz_types::by_name(&app.pool, "std").await.unwrap().unwrap();
    assert_eq!((stored.signing_scheme.as_str(), stored.signing_secret.expose().unwrap()), ("standard-webhooks", new_secret));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One request as a library is given it, and whether it should accept it.
struct Case {
    name: String,
    secret: String,
    body: Vec<u8>,
    headers: Value,
    accepted: bool,
}

impl Case {
    fn of(name: &str, request: &Received, secret: &str, accepted: bool) -> Case {
        let headers: serde_json::Map<String, Value> =
            request.headers.iter().filter(|(k, _)| k.starts_with("webhook-")).map(|(k, v)| (k.clone(), json!(v))).collect();
        Case { name: name.into(), secret: secret.into(), body: request.body.clone(), headers: Value::Object(headers), accepted }
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What a library says of each case: runs `program` with `args`, the cases on its stdin.
fn verdicts(program: &Path, args: &[&Path], cases: &[Case]) -> Value {
    use std::io::Write;
    assert!(
        !program.is_absolute() || program.exists(),
        "{} is missing: run tests/setup.sh, which installs the Standard Webhooks libraries under target/",
        program.display()
    );
    let input: Vec<Value> = cases
        .iter()
        .map(|c| json!({"name": c.name, "secret": c.secret, "body": String::from_utf8(c.body.clone()).unwrap(), "headers": c.headers}))
        .collect();
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&serde_json::to_vec(&input).unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{} failed: {}", program.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A real node signs with `standard-webhooks`: a callback retried after a 500 carries the
/// same `webhook-id` (its task's id) and no `Chime-Signature`; during a rotation's overlap a
/// callback and a failure notice (`webhook-id` its notice's id) carry both signatures; and
/// the specification's Python and JavaScript libraries accept each with each secret that
/// signed it, and refuse a tampered body, a tampered id and a secret that did not sign.
#[tokio::test]
async fn the_specifications_libraries_verify_callbacks_and_notices() {
    let python: PathBuf = root().join("target/standard-webhooks-venv/bin/python");
    let package: PathBuf = root().join("target/standard-webhooks/node_modules/standardwebhooks");
    assert!(package.exists(), "{} is missing: run tests/setup.sh", package.display());

    let app = spawn_node().await;
    let callbacks = Receiver::start(vec![Answer::status(500)], Answer::status(200)).await;
    let notices = Receiver::start(vec![], Answer::status(204)).await;
    let admin = admin_token(&app).await;
    let body = json!({"name": "orders", "callback_url": callbacks.url, "failure_url": notices.url, "signing_scheme": "standard-webhooks",
                      "max_attempts": 2, "backoff_initial_ms": 50, "backoff_max_ms": 50});
    let created = app.post("/api/v1/admin/biz-types", &admin, body).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let first_secret = created.body["signing_secret"].as_str().unwrap().to_string();
    let token = app.post("/api/v1/admin/biz-types/orders/tokens", &admin, json!({})).await.body["token"].as_str().unwrap().to_string();

    // Answered 500, then delivered: two attempts of one message.
    let retried = app.create_task(&token, json!({"biz_type": "orders", "payload": {"order": "Zoë 🎉"}})).await;
    let retried_id = retried["id"].as_str().unwrap();
    wait_for_status(&app, &token, retried_id, "succeeded").await;
    let attempts = callbacks.received();
    assert_eq!(attempts.len(), 2);
    for attempt in &attempts {
        assert_eq!(attempt.header("webhook-id"), Some(retried_id), "the task's id, on each attempt");
        let t: i64 = attempt.header("webhook-timestamp").unwrap().parse().unwrap();
        assert!((t - chrono::Utc::now().timestamp()).abs() < 60, "unix seconds of the attempt: {t}");
        assert_eq!(attempt.header("webhook-signature").unwrap().split(' ').count(), 1, "one secret");
        assert_eq!(attempt.header("chime-signature"), None, "one scheme");
        assert_eq!(attempt.header("chime-task-id"), Some(retried_id), "chime's other headers stay");
    }

    // A rotation with an overlap: the next callbacks carry both signatures. An engine turn
    // under way when it commits may still sign one with the first secret alone.
    let rotated = app.post("/api/v1/admin/biz-types/orders/rotate-secret", &admin, json!({"overlap_secs": 3600})).await;
    let second_secret = rotated.body["signing_secret"].as_str().unwrap().to_string();
    app.create_task(&token, json!({"biz_type": "orders", "payload": {"n": 1}})).await;
    let overlapping = wait_until("a callback signed with both secrets", Duration::from_secs(20), || async {
        app.create_task(&token, json!({"biz_type": "orders", "payload": {"n": 2}})).await;
        callbacks.received().into_iter().skip(2).find(|r| r.header("webhook-signature").is_some_and(|s| s.split(' ').count() == 2))
    })
    .await;

    // A task that fails for good (a 400 is not retried): its notice, signed twice too.
    callbacks.answer_with(Answer::status(400));
    let failed = app.create_task(&token, json!({"biz_type": "orders", "payload": {"n": 3}})).await;
    let failed_id = failed["id"].as_str().unwrap().to_string();
    wait_for_status(&app, &token, &failed_id, "failed").await;
    let notice = wait_until("the failure notice", Duration::from_secs(20), || async {
        notices.received().into_iter().find(|n| n.json()["task"]["id"] == json!(failed_id))
    })
    .await;
    let notice_id: String =
        sqlx::query_scalar("SELECT id::text FROM failure_notices WHERE task_id = $1::uuid").bind(&failed_id).fetch_one(&app.pool).await.unwrap();
    assert_eq!(notice.header("webhook-id"), Some(notice_id.as_str()), "the notice's id");
    assert_eq!((notice.header("chime-signature"), notice.header("chime-event")), (None, Some("task.failed")));
    assert_eq!(notice.header("webhook-signature").unwrap().split(' ').count(), 2, "{:?}", notice.headers);

    let other_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let mut tampered = overlapping.clone();
    tampered.body = serde_json::to_vec(&json!({"tampered": true})).unwrap();
    let mut other_id = notice.clone();
    other_id.headers.retain(|(k, _)| k != "webhook-id");
    other_id.headers.push(("webhook-id".into(), retried_id.into()));
    let cases = [
        Case::of("first attempt", &attempts[0], &first_secret, true),
        Case::of("retry", &attempts[1], &first_secret, true),
        Case::of("retry, another secret", &attempts[1], other_secret, false),
        Case::of("overlap, new secret", &overlapping, &second_secret, true),
        Case::of("overlap, old secret", &overlapping, &first_secret, true),
        Case::of("overlap, tampered body", &tampered, &second_secret, false),
        Case::of("overlap, tampered body, old secret", &tampered, &first_secret, false),
        Case::of("notice, new secret", &notice, &second_secret, true),
        Case::of("notice, old secret", &notice, &first_secret, true),
        Case::of("notice, another secret", &notice, other_secret, false),
        Case::of("notice, another id", &other_id, &second_secret, false),
    ];
    let expected: serde_json::Map<String, Value> = cases.iter().map(|c| (c.name.clone(), json!(c.accepted))).collect();
    let expected = Value::Object(expected);
    assert_eq!(verdicts(&python, &[&root().join("tests/standard-webhooks/verify.py")], &cases), expected, "Python's standardwebhooks");
    assert_eq!(
        verdicts(Path::new("node"), &[&root().join("tests/standard-webhooks/verify.js"), &package], &cases),
        expected,
        "npm's standardwebhooks"
    );
}
