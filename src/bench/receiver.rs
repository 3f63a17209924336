//! The bench's callback receiver: answers 200 at once and notes when each callback
//! arrived, by biz type, so a scenario can wait for its tasks and measure their lateness.

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpResponse, HttpServer, dev::ServerHandle, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

/// One callback as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub task_id: Uuid,
    pub run_at: DateTime<Utc>,
    pub at: DateTime<Utc>,
}

#[derive(Default)]
struct Seen {
    ids: HashSet<Uuid>,
    arrivals: Vec<Arrival>,
}

#[derive(Default)]
pub struct Log(Mutex<HashMap<String, Seen>>);

impl Log {
    /// Distinct tasks of this biz type seen so far.
    pub fn distinct(&self, biz_type: &str) -> usize {
        self.0.lock().unwrap().get(biz_type).map_or(0, |s| s.ids.len())
    }

    /// Every arrival for this biz type, repeats included, in arrival order.
    pub fn arrivals(&self, biz_type: &str) -> Vec<Arrival> {
        self.0.lock().unwrap().get(biz_type).map_or_else(Vec::new, |s| s.arrivals.clone())
    }
}

/// The fields of chime's callback body the bench reads (the rest is skipped).
#[derive(Deserialize)]
struct Callback<'a> {
    task_id: Uuid,
    biz_type: &'a str,
    run_at: DateTime<Utc>,
}

async fn receive(body: web::Bytes, log: web::Data<Log>) -> HttpResponse {
    let at = Utc::now();
    let Ok(callback) = serde_json::from_slice::<Callback>(&body) else {
        return HttpResponse::BadRequest().finish();
    };
    let mut seen = log.0.lock().unwrap();
    let seen = seen.entry(callback.biz_type.to_string()).or_default();
    seen.ids.insert(callback.task_id);
    seen.arrivals.push(Arrival { task_id: callback.task_id, run_at: callback.run_at, at });
    HttpResponse::Ok().finish()
}

pub struct Receiver {
    pub url: String,
    pub log: Arc<Log>,
    handle: ServerHandle,
}

impl Receiver {
    /// Listens on a free local port, with two workers (the machine's cores are chime's).
    pub fn start() -> anyhow::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/callback", listener.local_addr()?);
        let log = web::Data::new(Log::default());
        let shared = log.clone().into_inner();
        let server = HttpServer::new(move || App::new().app_data(log.clone()).route("/callback", web::post().to(receive)))
            .workers(2)
            .disable_signals()
            .listen(listener)?
            .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(Receiver { url, log: shared, handle })
    }

    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}
