//! Requests actix-http cannot parse, sent over raw TCP to a real `chime serve`: refused with
//! 400 or 431 and not logged as the node's error.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{chime_process_logging, fresh_database};

/// Sends `request` as bytes; returns the answer as text (status line, headers, body).
async fn raw(address: &str, request: &[u8]) -> String {
    let mut socket = tokio::net::TcpStream::connect(address.trim_start_matches("http://")).await.unwrap();
    // The node may answer and close before it has read everything: a write error then is
    // not a failure.
    let _ = socket.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).to_string()
}

/// Huge headers (431), a duplicate Host, Transfer-Encoding with Content-Length and a 70 KB
/// path (400 or 431) are refused, and none is logged at ERROR: they are the client's
/// mistakes. Before, each one logged "stream error: request parse error" at ERROR.
#[tokio::test]
async fn unparseable_requests_are_refused_without_an_error_in_the_log() {
    let db_url = fresh_database().await;
    let log_path = std::env::temp_dir().join(format!("chime-protocol-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let (node, address) = chime_process_logging(&db_url, &[("CHIME_ENGINE", "false")], log).await;
    let host = address.trim_start_matches("http://");
    let requests = [
        ("huge headers", format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Big: {}\r\n\r\n", "a".repeat(140_000)), ["431"].as_slice()),
        ("a duplicate Host", format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nHost: evil.example\r\n\r\n"), &["400"]),
        (
            "Transfer-Encoding with Content-Length",
            format!("POST /api/v1/tasks HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
            &["400"],
        ),
        ("a 70 KB path", format!("GET /{} HTTP/1.1\r\nHost: {host}\r\n\r\n", "p".repeat(70_000)), &["400", "431"]),
    ];
    let mut refused = Vec::new();
    for (what, request, statuses) in &requests {
        let answer = raw(&address, request.as_bytes()).await;
        let status = answer.split(' ').nth(1).unwrap_or("none").to_string();
        println!("{what}: {}", answer.lines().next().unwrap_or("no answer"));
        refused.push((*what, statuses.contains(&status.as_str()), status));
    }
    // Something the node does log, so that the log is known to be flushed up to here.
    let _ = raw(&address, format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await;
    drop(node);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logged = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    let errors: Vec<&str> = logged.lines().filter(|l| l.contains("ERROR")).collect();
    println!("logged at ERROR: {errors:#?}");
    assert!(refused.iter().all(|(_, ok, _)| *ok), "{refused:?}");
    assert!(errors.is_empty(), "{errors:#?}");
}
