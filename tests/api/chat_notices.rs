//! Notices in a chat tool (docs/book/src/concepts/chat-notices.md): the real engine and
//! notice sender against real local receivers that check each platform's documented request
//! shape, and its signature recomputed with `openssl` rather than chime's HMAC.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::chat_notices::Pace;
use chime::failure_notices::Sender;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::admin::admin_token;
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, engine, spawn_app, wait_until};
use crate::receiver::{Answer, Received, Receiver};

const CONSOLE: &str = "https://chime.example.com/ops";

/// A notice sender on `app`'s database with the given pace, its links to `CONSOLE`; the
/// lifecycle must live as long as it.
fn chat_sender(app: &TestApp, pace: Pace) -> (Sender, chime::lifecycle::Lifecycle) {
    let lifecycle = chime::lifecycle::Lifecycle::default();
    let sender = Sender::start(chime::db::Health::new(&app.pool), Uuid::new_v4(), CallbackHosts::Any, lifecycle.signal())
        .with_public_url(Some(format!("{CONSOLE}/")))
        .with_chat_pace(pace);
    (sender, lifecycle)
}

/// Summaries at once, then not again for a minute; retries after 100 ms.
fn quick() -> Pace {
    Pace { gather: Duration::ZERO, window: Duration::from_secs(60), first_retry: Duration::from_millis(100) }
}

/// A biz type whose callbacks go to `callback`, each task failing at its first answer
/// that is not 2xx, with its chat notices to `platform` at `url`; returns a token.
async fn chat_biz_type(app: &TestApp, name: &str, callback: &Receiver, platform: &str, url: &str, secret: Option<&str>) -> String {
    let settings = Settings {
        callback_url: Some(callback.url.clone()),
        max_attempts: Some(1),
        breaker_threshold: Some(0),
        chat_platform: Some(platform.into()),
        chat_url: Some(url.into()),
        chat_secret: secret.map(str::to_string),
        ..Default::default()
    };
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

/// Creates `n` tasks of `name` and lets the engine end them.
async fn fail_tasks(app: &TestApp, token: &str, name: &str, n: usize) {
    let mut engine = engine(app);
    let mut ids = vec![];
    for _ in 0..n {
        ids.push(app.create_task(token, json!({"biz_type": name})).await["id"].as_str().unwrap().to_string());
    }
    engine.turn().await;
    engine.settled().await;
    for id in &ids {
        wait_for_status(app, token, id, "failed").await;
    }
}

/// Takes chat turns until `receiver` has `n` requests.
async fn chat_until(sender: &Sender, receiver: &Receiver, n: usize) -> Vec<Received> {
    wait_until("the chat messages", Duration::from_secs(10), || async {
        sender.chat_turn().await;
        let received = receiver.received();
        if received.len() >= n { Ok(received) } else { Err(format!("{} received", received.len())) }
    })
    .await
}

/// base64 of HMAC-SHA256(key, message), by `openssl`: not chime's implementation.
fn openssl_hmac(key: &str, message: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-binary", "-mac", "HMAC", "-macopt", &format!("key:{key}")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child.stdin.take().unwrap().write_all(message.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let mut base64 = std::process::Command::new("openssl")
        .args(["base64", "-A"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    base64.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    String::from_utf8(base64.wait_with_output().unwrap().stdout).unwrap().trim().to_string()
}

/// The query parameters of a request, decoded.
fn query(request: &Received) -> Vec<(String, String)> {
    let query = request.uri.split_once('?').map_or("", |(_, q)| q);
    url::form_urlencoded::parse(query.as_bytes()).into_owned().collect()
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Each platform gets the message in its documented shape, signed as it documents where it
/// signs: DingTalk a markdown message, `timestamp` (ms) and `sign` (HMAC keyed by the secret
/// over "timestamp\nsecret", base64, URL-encoded) in the query; Feishu a text message,
/// `timestamp` (s) and `sign` (HMAC keyed by "timestamp\nsecret" over nothing) in the body;
/// WeCom a markdown message, its key left in the URL; Slack `text` and a mrkdwn section.
/// Each says what failed, how many, since when, and links the console.
#[tokio::test]
async fn each_platform_gets_its_documented_shape_and_signature() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let dingtalk_ok = Answer { body: Some(r#"{"errcode":0,"errmsg":"ok"}"#.into()), ..Answer::status(200) };
    let feishu_ok = Answer { body: Some(r#"{"code":0,"msg":"success","data":{}}"#.into()), ..Answer::status(200) };
    let dingtalk = Receiver::start(vec![], dingtalk_ok.clone()).await;
    let feishu = Receiver::start(vec![], feishu_ok).await;
    let wecom = Receiver::start(vec![], dingtalk_ok).await;
    let slack = Receiver::start(vec![], Answer::status(200)).await;
    let ding_secret = "SEC0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd";
    let feishu_secret = "fs_secret_Qw3rTy";
    let chats = [
        ("pay-dingtalk", "dingtalk", format!("{}?access_token=tok123", dingtalk.url), Some(ding_secret)),
        ("pay-feishu", "feishu", feishu.url.clone(), Some(feishu_secret)),
        ("pay-wecom", "wecom", format!("{}?key=693a91f6-7xxx", wecom.url), None),
        ("pay-slack", "slack", slack.url.clone(), None),
    ];
    for (name, platform, url, secret) in &chats {
        let token = chat_biz_type(&app, name, &callback, platform, url, *secret).await;
        fail_tasks(&app, &token, name, 2).await;
    }
    let (sender, _lifecycle) = chat_sender(&app, quick());
    let before = chrono::Utc::now();
    chat_until(&sender, &slack, 1).await;
    for r in [&dingtalk, &feishu, &wecom] {
        chat_until(&sender, r, 1).await;
    }
    let after = chrono::Utc::now();
    let since = |text: &str, name: &str| {
        let expected = format!("{name}: 2 tasks failed since ");
        assert!(text.contains(&expected), "{name}: {text}");
        assert!(text.contains("last error: ") && text.contains("500"), "{name} quotes the last error: {text}");
    };
    let link = |name: &str| format!("{CONSOLE}/console/tasks?biz_type={name}&status=failed");
    for r in [&dingtalk, &feishu, &wecom, &slack] {
        let received = r.received();
        assert_eq!(received.len(), 1, "one message for both tasks: {received:?}");
        assert_eq!(received[0].method, "POST");
        assert_eq!(received[0].header("content-type"), Some("application/json"));
    }

    // DingTalk: https://open.dingtalk.com/document/robots/custom-robot-access
    let d = &dingtalk.received()[0];
    let params = query(d);
    assert_eq!(param(&params, "access_token"), Some("tok123"), "the robot's token is kept: {}", d.uri);
    let timestamp = param(&params, "timestamp").expect("a timestamp");
    let ms: i64 = timestamp.parse().expect("milliseconds");
    assert!((before.timestamp_millis()..=after.timestamp_millis()).contains(&ms), "{ms} in ms, now");
    let sign = param(&params, "sign").expect("a sign");
    assert_eq!(sign, openssl_hmac(ding_secret, &format!("{timestamp}\n{ding_secret}")), "DingTalk's signature");
    assert!(d.uri.contains("&sign=") && !d.uri.contains('+') && !d.uri[d.uri.find("sign=").unwrap()..].contains('/'), "URL-encoded: {}", d.uri);
    let body = d.json();
    assert_eq!(body["msgtype"], "markdown", "{body}");
    assert!(body["markdown"]["title"].as_str().is_some_and(|t| t.starts_with("pay-dingtalk: 2 tasks failed")), "{body}");
    let text = body["markdown"]["text"].as_str().unwrap();
    since(text, "pay-dingtalk");
    assert!(text.contains(&format!("[Open in the chime console]({})", link("pay-dingtalk"))), "{text}");

    // Feishu/Lark: https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot
    let f = feishu.received()[0].json();
    assert_eq!(f["msg_type"], "text", "{f}");
    let timestamp = f["timestamp"].as_str().expect("the timestamp, a string");
    let secs: i64 = timestamp.parse().expect("seconds");
    assert!((before.timestamp()..=after.timestamp()).contains(&secs), "{secs} in s, now");
    assert_eq!(f["sign"].as_str().unwrap(), openssl_hmac(&format!("{timestamp}\n{feishu_secret}"), ""), "Feishu's signature");
    let text = f["content"]["text"].as_str().unwrap();
    since(text, "pay-feishu");
    assert!(text.contains(&link("pay-feishu")), "{text}");

    // WeCom: https://developer.work.weixin.qq.com/document/path/91770
    let w = &wecom.received()[0];
    assert_eq!(query(w), [("key".to_string(), "693a91f6-7xxx".to_string())], "no signature: the key stays the only parameter");
    let body = w.json();
    assert_eq!(body["msgtype"], "markdown", "{body}");
    assert_eq!(body.as_object().unwrap().len(), 2, "msgtype and markdown only: {body}");
    let content = body["markdown"]["content"].as_str().unwrap();
    assert!(content.len() <= 4096, "WeCom's markdown takes 4096 bytes");
    since(content, "pay-wecom");
    assert!(content.contains(&format!("[Open in the chime console]({})", link("pay-wecom"))), "{content}");

    // Slack: https://api.slack.com/messaging/webhooks
    let body = slack.received()[0].json();
    since(body["text"].as_str().unwrap(), "pay-slack");
    assert_eq!(body["blocks"][0]["type"], "section", "{body}");
    assert_eq!(body["blocks"][0]["text"]["type"], "mrkdwn", "{body}");
    let mrkdwn = body["blocks"][0]["text"]["text"].as_str().unwrap();
    since(mrkdwn, "pay-slack");
    assert!(mrkdwn.contains(&format!("<{}|Open in the chime console>", link("pay-slack").replace('&', "&amp;"))), "{mrkdwn}");

    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM chat_notices").fetch_one(&app.pool).await.unwrap();
    assert_eq!(left, 0, "the rows told of are deleted once delivered");
}

/// Failed tasks are summarised: the tasks that failed before a summary are one message, and
/// those after it wait for the window (no message while it lasts, their rows kept), then are
/// one message of their own. A receiver going down and coming up is sent as it happens,
/// window or not.
#[tokio::test]
async fn tasks_are_summarised_once_a_window_and_the_receiver_going_down_or_up_at_once() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let chat = Receiver::start(vec![], Answer::status(200)).await;
    let token = chat_biz_type(&app, "payments", &callback, "slack", &chat.url, None).await;
    fail_tasks(&app, &token, "payments", 5).await;
    let (sender, _lifecycle) = chat_sender(&app, quick());
    let first = chat_until(&sender, &chat, 1).await[0].json();
    let first = first["text"].as_str().unwrap();
    assert!(first.starts_with("payments: 5 tasks failed since "), "{first}");

    fail_tasks(&app, &token, "payments", 3).await;
    assert_eq!(sender.chat_turn().await, 0, "within the window no summary is claimed");
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM chat_notices").fetch_one(&app.pool).await.unwrap();
    assert_eq!(waiting, 3, "the tasks since wait for the next summary");

    // The breaker opens (2 failures in a row) and closes (a probe answered): each is sent
    // though the summary window still holds the tasks.
    biz_types::update(
        &app.pool,
        "payments",
        &Settings { breaker_threshold: Some(2), breaker_probe_ms: Some(100), ..Default::default() },
        CallbackHosts::Any,
    )
    .await
    .unwrap();
    let mut engine = engine(&app);
    for _ in 0..2 {
        app.create_task(&token, json!({"biz_type": "payments"})).await;
    }
    engine.turn().await;
    engine.settled().await;
    let down = chat_until(&sender, &chat, 2).await[1].json();
    let down = down["text"].as_str().unwrap();
    assert!(down.starts_with("payments: receiver down since "), "{down}");
    assert!(down.contains("2 failures in a row, the last: ") && down.contains("500"), "{down}");
    assert!(down.contains(&format!("{CONSOLE}/console/biz-types/payments")), "{down}");

    callback.answer_with(Answer::status(200));
    let probe = app.create_task(&token, json!({"biz_type": "payments"})).await;
    // Probes go out every 100 ms; the engine takes the probe task once one is due.
    let probe_id = probe["id"].as_str().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        engine.turn().await;
        engine.settled().await;
        let status: String = sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1::uuid").bind(probe_id).fetch_one(&app.pool).await.unwrap();
        if status == "succeeded" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the probe was not answered: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let up = chat_until(&sender, &chat, 3).await[2].json();
    let up = up["text"].as_str().unwrap();
    assert!(up.starts_with("payments: receiver up"), "{up}");
    assert!(up.contains("answering again at ") && up.contains("deliveries resume"), "{up}");

    // Once the window is over, the 3 tasks and the 2 the open breaker failed before it held
    // the rest are one message.
    let (later, _lifecycle) = chat_sender(&app, Pace { window: Duration::ZERO, ..quick() });
    let second = chat_until(&later, &chat, 4).await[3].json();
    let second = second["text"].as_str().unwrap();
    assert!(second.starts_with("payments: 5 tasks failed since "), "{second}");
}

/// A chat webhook that is down is retried with backoff while callbacks go on being
/// delivered and another biz type's chat messages are sent; once it answers, the retried
/// summary tells of the tasks that failed meanwhile too. One that hangs holds up nothing
/// either: the sender's own loop sends the other biz type's message at once.
#[tokio::test]
async fn a_chat_webhook_down_or_hanging_holds_up_no_callback_nor_other_biz_types_messages() {
    let app = spawn_app().await;
    let failing = Receiver::start(vec![], Answer::status(500)).await;
    let down = Receiver::start(vec![], Answer::status(503)).await;
    let hanging = Receiver::start(vec![], Answer { delay: Duration::from_secs(30), ..Answer::status(200) }).await;
    let fine = Receiver::start(vec![], Answer::status(200)).await;
    let down_token = chat_biz_type(&app, "down", &failing, "slack", &down.url, None).await;
    let hanging_token = chat_biz_type(&app, "hanging", &failing, "wecom", &hanging.url, None).await;
    let fine_token = chat_biz_type(&app, "fine", &failing, "slack", &fine.url, None).await;
    let delivered = Receiver::start(vec![], Answer::status(200)).await;
    let ok_token = chat_biz_type(&app, "delivered", &delivered, "slack", &fine.url, None).await;

    let (sender, _lifecycle) = chat_sender(&app, quick());
    let _running = tokio::spawn(sender.run());
    let running = engine(&app).spawn();
    fail_tasks(&app, &down_token, "down", 1).await;
    fail_tasks(&app, &hanging_token, "hanging", 1).await;
    down.wait_for(2, Duration::from_secs(10)).await;
    hanging.wait_for(1, Duration::from_secs(10)).await;
    assert!(down.received().len() >= 2, "the down webhook is tried again");
    assert_eq!(hanging.received().len(), 1, "the hanging webhook holds its message");

    // Meanwhile: callbacks are delivered, and another biz type's message is sent.
    let mut ids = vec![];
    for _ in 0..5 {
        ids.push(app.create_task(&ok_token, json!({"biz_type": "delivered"})).await["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        wait_for_status(&app, &ok_token, id, "succeeded").await;
    }
    assert_eq!(delivered.received().len(), 5);
    fail_tasks(&app, &fine_token, "fine", 1).await;
    let message = fine.wait_for(1, Duration::from_secs(5)).await;
    assert!(message.first().is_some_and(|m| m.json()["text"].as_str().unwrap().starts_with("fine: 1 task failed")), "{message:?}");

    let (tries, error): (i32, Option<String>) =
        sqlx::query_as("SELECT c.tries, c.last_error FROM chat_channels c JOIN biz_types b ON b.id = c.biz_type_id WHERE b.name = 'down'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(tries >= 1 && error.as_deref().is_some_and(|e| e.contains("503")), "{tries} tries, {error:?}");

    // The webhook comes back: the summary retried tells of the task failed meanwhile too.
    fail_tasks(&app, &down_token, "down", 1).await;
    let tried = down.received().len();
    down.answer_with(Answer::status(200));
    let received = down.wait_for(tried + 1, Duration::from_secs(10)).await;
    let last = received.last().unwrap().json();
    assert!(last["text"].as_str().unwrap().starts_with("down: 2 tasks failed since "), "{last}");
    let metrics = reqwest::get(format!("{}/metrics", app.address)).await.unwrap().text().await.unwrap();
    for counted in
        [r#"chime_chat_messages_total{biz_type="down",outcome="retried"}"#, r#"chime_chat_messages_total{biz_type="fine",outcome="delivered"}"#]
    {
        assert!(metrics.contains(counted), "{counted} in {metrics}");
    }
    // The sender forgets the rows it told of once the webhook has answered: a moment after.
    wait_until("the told rows forgotten", Duration::from_secs(10), || async {
        let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM chat_notices n JOIN biz_types b ON b.id = n.biz_type_id WHERE b.name = 'down'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if waiting == 0 { Ok(()) } else { Err(format!("{waiting} rows")) }
    })
    .await;
    running.stop().await;
}

/// Bad chat settings are refused with 422 naming the field, through the API and the
/// console's form alike; a good secret is never shown, only whether one is set, and a change
/// of platform drops it.
#[tokio::test]
async fn bad_chat_settings_are_refused_naming_the_field() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    let base = json!({"name": "alerts", "mode": "pull"});
    let with = |extra: Value| {
        let mut body = base.clone();
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    for (extra, field) in [
        (json!({"chat_platform": "teams", "chat_url": "https://h.test/x"}), "chat_platform"),
        (json!({"chat_platform": "slack", "chat_url": "ftp://h.test/x"}), "chat_url"),
        (json!({"chat_platform": "slack", "chat_url": "not a url"}), "chat_url"),
        (json!({"chat_platform": "slack"}), "chat_url"),
        (json!({"chat_url": "https://h.test/x"}), "chat_platform"),
        (json!({"chat_platform": "wecom", "chat_url": "https://h.test/x", "chat_secret": "abc"}), "chat_secret"),
        (json!({"chat_platform": "slack", "chat_url": "https://h.test/x", "chat_secret": "abc"}), "chat_secret"),
        (json!({"chat_platform": "dingtalk", "chat_url": "https://h.test/x", "chat_secret": "abc123"}), "chat_secret"),
    ] {
        let reply = app.post("/api/v1/admin/biz-types", &admin, with(extra.clone())).await;
        assert_eq!(reply.status, 422, "{extra}: {}", reply.body);
        assert!(reply.message().starts_with(&format!("{field}: ")), "{extra}: {}", reply.body);
    }

    let secret = "SECabcdef0123456789";
    let made = app
        .post(
            "/api/v1/admin/biz-types",
            &admin,
            with(json!({"chat_platform": "dingtalk", "chat_url": "https://h.test/robot?access_token=t", "chat_secret": secret})),
        )
        .await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["chat_platform"], "dingtalk");
    assert_eq!(made.body["chat_signed"], true);
    let shown = app.get("/api/v1/admin/biz-types/alerts", &admin).await;
    assert!(!shown.body.to_string().contains(secret) && !made.body.to_string().contains(secret), "the secret is never shown");
    assert_eq!(biz_types::by_name(&app.pool, "alerts").await.unwrap().unwrap().chat_secret.secret.unwrap().expose().unwrap(), secret);

    let wrong = app.patch("/api/v1/admin/biz-types/alerts", &admin, json!({"chat_secret": "nope"})).await;
    assert_eq!(wrong.status, 422, "{}", wrong.body);
    assert!(wrong.message().starts_with("chat_secret: a DingTalk robot's secret starts with `SEC`"), "{}", wrong.body);
    let moved =
        app.patch("/api/v1/admin/biz-types/alerts", &admin, json!({"chat_platform": "wecom", "chat_url": "https://h.test/wecom?key=k"})).await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(moved.body["chat_signed"], false, "a change of platform drops the secret");
    let stopped = app.patch("/api/v1/admin/biz-types/alerts", &admin, json!({"chat_platform": ""})).await;
    assert_eq!((stopped.body["chat_platform"].clone(), stopped.body["chat_url"].clone()), (Value::Null, Value::Null), "{}", stopped.body);
}

/// Rows no message will tell of (the biz type's chat tool removed) are deleted with
/// retention; a biz type that still has one keeps its rows.
#[tokio::test]
async fn rows_of_a_removed_chat_tool_go_with_retention() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    for name in ["kept", "removed"] {
        let token = chat_biz_type(&app, name, &callback, "slack", "https://hooks.slack.test/services/x", None).await;
        fail_tasks(&app, &token, name, 1).await;
    }
    biz_types::update(&app.pool, "removed", &Settings { chat_platform: Some(String::new()), ..Default::default() }, CallbackHosts::Any)
        .await
        .unwrap();
    let later = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    assert_eq!(chime::chat_notices::forget_unsendable(&app.pool, later).await.unwrap(), 1);
    let left: Vec<String> =
        sqlx::query_scalar("SELECT b.name FROM chat_notices n JOIN biz_types b ON b.id = n.biz_type_id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(left, ["kept"]);
}
