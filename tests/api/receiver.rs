//! A real HTTP receiver for callbacks: records every request and answers from a script.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub delay: Duration,
    /// Sent as `Location`, for a redirect.
    pub location: Option<String>,
    /// More headers to answer with (name, value), e.g. `Chime-Snooze`.
    pub headers: Vec<(String, String)>,
    /// The body to answer with (JSON); None: `answer <status>`.
    pub body: Option<String>,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Answer { status, retry_after: None, delay: Duration::ZERO, location: None, headers: Vec::new(), body: None }
    }

    /// A 2xx answer asking to be called again later: `Chime-Snooze: <value>`.
    pub fn snooze(value: &str) -> Self {
        Answer { headers: vec![("Chime-Snooze".into(), value.into())], ..Answer::status(200) }
    }

    pub fn redirect(status: u16, to: &str) -> Self {
        Answer { location: Some(to.into()), ..Answer::status(status) }
    }
}

#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub method: String,
    /// The path and query asked for.
    pub uri: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    script: VecDeque<Answer>,
    otherwise: Option<Answer>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: usize,
    peak_in_flight: usize,
}

#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl Receiver {
    /// Answers with `script` in order, then with `otherwise` for every later request.
    pub async fn start(script: Vec<Answer>, otherwise: Answer) -> Receiver {
        Self::start_at(0, script, otherwise).await
    }

    /// Like `start`, on a given port (0: any free one).
    pub async fn start_at(port: u16, script: Vec<Answer>, otherwise: Answer) -> Receiver {
        let state = Arc::new(Mutex::new(State { script: script.into(), otherwise: Some(otherwise), ..Default::default() }));
        let shared = state.clone();
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let url = format!("http://127.0.0.1:{}/hook", listener.local_addr().unwrap().port());
        let server = HttpServer::new(move || App::new().app_data(web::Data::new(shared.clone())).default_service(web::to(handle)))
            .listen(listener)
            .unwrap()
            .workers(1)
            .disable_signals()
            .run();
        tokio::spawn(server);
        Receiver { url, state }
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// The most requests this receiver was answering at once (each held for its answer's
    /// `delay`).
    pub fn peak_in_flight(&self) -> usize {
        self.state.lock().unwrap().peak_in_flight
    }

    /// From now on answer every request with `answer`.
    pub fn answer_with(&self, answer: Answer) {
        let mut state = self.state.lock().unwrap();
        state.script.clear();
        state.otherwise = Some(answer);
    }

    /// Waits until `n` requests have arrived (at most `within`).
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let start = Instant::now();
        loop {
            let received = self.received();
            if received.len() >= n || start.elapsed() > within {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn handle(req: HttpRequest, body: web::Bytes, state: web::Data<Arc<Mutex<State>>>) -> HttpResponse {
    let answer = {
        let mut s = state.lock().unwrap();
        s.received.push(Received {
            at: Instant::now(),
            method: req.method().to_string(),
            uri: req.uri().to_string(),
            headers: req.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string())).collect(),
            body: body.to_vec(),
        });
        s.in_flight += 1;
        s.peak_in_flight = s.peak_in_flight.max(s.in_flight);
        s.script.pop_front().or_else(|| s.otherwise.clone()).unwrap()
    };
    // Counted out when the answer goes, or when the request is dropped mid-way.
    let _answering = Answering(state.get_ref().clone());
    tokio::time::sleep(answer.delay).await;
    let mut response = HttpResponse::build(actix_web::http::StatusCode::from_u16(answer.status).unwrap());
    if let Some(secs) = answer.retry_after {
        response.insert_header(("Retry-After", secs.to_string()));
    }
    if let Some(to) = answer.location {
        response.insert_header(("Location", to));
    }
    for (name, value) in answer.headers {
        response.append_header((name, value));
    }
    match answer.body {
        Some(body) => response.content_type("application/json").body(body),
        None => response.body(format!("answer {}", answer.status)),
    }
}

/// A request being answered, counted in `State::in_flight` until dropped.
struct Answering(Arc<Mutex<State>>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.lock().unwrap().in_flight -= 1;
    }
}
