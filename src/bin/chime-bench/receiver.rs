//! The callback receiver of the bench and the soak: answers each callback with the status
//! its caller's rule gives (the bench: always 200; the soak: some failures on purpose) and
//! notes when each arrived and what it was answered, so that a run can wait for its tasks,
//! measure their lateness and count what was delivered, repeated and lost.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::http::StatusCode;
use actix_web::{App, HttpResponse, HttpServer, dev::ServerHandle, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

/// The fields of chime's callback body the receiver reads (the rest is skipped).
#[derive(Debug, Deserialize)]
pub struct Callback<'a> {
    pub task_id: Uuid,
    pub biz_type: &'a str,
    pub run_at: DateTime<Utc>,
    /// 1 for a task's first attempt (since it was created or replayed).
    pub attempt: i32,
}

/// One callback as it arrived, and what it was answered.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub task_id: Uuid,
    pub run_at: DateTime<Utc>,
    pub at: DateTime<Utc>,
    pub attempt: i32,
    /// Answered 2xx: delivered.
    pub delivered: bool,
}

#[derive(Default)]
struct Book {
    /// Every callback, by biz type, in arrival order.
    arrivals: HashMap<String, Vec<Arrival>>,
    /// 2xx answers per task (task ids are unique across biz types).
    delivered: HashMap<Uuid, u32>,
    /// Tasks answered 2xx at least once, by biz type.
    distinct: HashMap<String, usize>,
}

/// What the receiver saw.
#[derive(Default)]
pub struct Log(Mutex<Book>);

impl Log {
    /// Distinct tasks of this biz type delivered so far.
    pub fn distinct(&self, biz_type: &str) -> usize {
        self.0.lock().unwrap().distinct.get(biz_type).copied().unwrap_or(0)
    }

    /// Distinct tasks delivered so far, every biz type.
    pub fn delivered(&self) -> usize {
        self.0.lock().unwrap().delivered.len()
    }

    /// Of `ids`, how many were never delivered.
    pub fn undelivered(&self, ids: &[Uuid]) -> usize {
        let book = self.0.lock().unwrap();
        ids.iter().filter(|id| !book.delivered.contains_key(id)).count()
    }

    /// Every arrival for this biz type, repeats and refusals included, in arrival order.
    pub fn arrivals(&self, biz_type: &str) -> Vec<Arrival> {
        self.0.lock().unwrap().arrivals.get(biz_type).cloned().unwrap_or_default()
    }
}

/// How the receiver answers a callback.
type Rule = dyn Fn(&Callback) -> StatusCode + Send + Sync;

struct Shared {
    log: Arc<Log>,
    rule: Box<Rule>,
}

async fn receive(body: web::Bytes, shared: web::Data<Shared>) -> HttpResponse {
    let at = Utc::now();
    let Ok(callback) = serde_json::from_slice::<Callback>(&body) else {
        return HttpResponse::BadRequest().finish();
    };
    let status = (shared.rule)(&callback);
    let delivered = status.is_success();
    let arrival = Arrival { task_id: callback.task_id, run_at: callback.run_at, at, attempt: callback.attempt, delivered };
    let mut book = shared.log.0.lock().unwrap();
    match book.arrivals.get_mut(callback.biz_type) {
        Some(arrivals) => arrivals.push(arrival),
        None => {
            book.arrivals.insert(callback.biz_type.to_string(), vec![arrival]);
        }
    }
    if delivered {
        let answers = book.delivered.entry(callback.task_id).or_default();
        *answers += 1;
        if *answers == 1 {
            *book.distinct.entry(callback.biz_type.to_string()).or_default() += 1;
        }
    }
    HttpResponse::new(status)
}

pub struct Receiver {
    pub url: String,
    pub log: Arc<Log>,
    handle: ServerHandle,
}

impl Receiver {
    /// Listens on a free local port, with two workers (the machine's cores are chime's), and
    /// answers each callback with `rule`'s status.
    pub fn start(rule: impl Fn(&Callback) -> StatusCode + Send + Sync + 'static) -> anyhow::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/callback", listener.local_addr()?);
        let log = Arc::new(Log::default());
        let shared = web::Data::new(Shared { log: log.clone(), rule: Box::new(rule) });
        let server = HttpServer::new(move || App::new().app_data(shared.clone()).route("/callback", web::post().to(receive)))
            .workers(2)
            .disable_signals()
            .listen(listener)?
            .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(Receiver { url, log, handle })
    }

    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn callback(task_id: Uuid, biz_type: &str, attempt: i32) -> String {
        serde_json::json!({"task_id": task_id, "biz_type": biz_type, "run_at": "2026-01-01T00:00:00Z", "attempt": attempt, "payload": {}}).to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn notes_each_callback_with_the_answer_its_rule_gave() {
        chime::engine::install_tls_provider();
        let receiver = Receiver::start(|c| if c.attempt == 1 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK }).unwrap();
        let client = reqwest::Client::new();
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        for (id, biz_type, attempt, answer) in [(a, "x", 1, 503), (a, "x", 2, 200), (a, "x", 2, 200), (b, "x", 2, 200), (c, "y", 1, 503)] {
            let reply = client.post(&receiver.url).body(callback(id, biz_type, attempt)).send().await.unwrap();
            assert_eq!(reply.status().as_u16(), answer, "{biz_type} attempt {attempt}");
        }
        let reply = client.post(&receiver.url).body(r#"{"task_id":"not a task"}"#).send().await.unwrap();
        assert_eq!(reply.status().as_u16(), 400);

        let log = &receiver.log;
        let seen: Vec<_> = log.arrivals("x").iter().map(|a| (a.task_id, a.attempt, a.delivered)).collect();
        assert_eq!(seen, [(a, 1, false), (a, 2, true), (a, 2, true), (b, 2, true)]);
        assert_eq!((log.distinct("x"), log.distinct("y"), log.distinct("z")), (2, 0, 0));
        assert_eq!(log.arrivals("y").len(), 1);
        assert_eq!(log.delivered(), 2);
        assert_eq!(log.undelivered(&[a, b, c, Uuid::new_v4()]), 2);
        receiver.stop().await;
    }
}
