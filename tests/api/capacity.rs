//! A node's capacity (`--node-capacity`), shared among the biz types with due work by
//! weight (docs/design/claim.md, Fair between biz types).

use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chrono::Utc;
use serde_json::{Value, json};

use crate::helpers::{chime_process, spawn_app, wait_until};
use crate::receiver::{Answer, Receiver};

/// Two `chime serve` processes holding at most 12 tasks each, a receiver that holds each
/// request 300 ms, and a herd of 300 tasks due at once in each of two biz types: `light`
/// of weight 1 and `heavy` of weight 3, each allowed far more in flight than the nodes
/// hold. While both have tasks waiting, heavy gets three times light's callbacks. A task of
/// a third biz type created while the nodes are full is delivered within about one
/// request's hold, not after the herds (about 6 s).
#[tokio::test]
async fn the_nodes_capacity_is_shared_by_weight_and_a_herd_leaves_the_next_place_to_a_neighbour() {
    const HOLD: Duration = Duration::from_millis(300);
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer { delay: HOLD, ..Answer::status(200) }).await;
    let mut tokens = Vec::new();
    for (name, weight) in [("light", 1), ("heavy", 3), ("solo", 1)] {
        let settings = Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(1000), weight: Some(weight), ..Default::default() };
        biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
        tokens.push(biz_types::create_token(&app.pool, name).await.unwrap());
    }
    let _nodes =
        [chime_process(&app.db_url, &[("CHIME_NODE_CAPACITY", "12")]).await, chime_process(&app.db_url, &[("CHIME_NODE_CAPACITY", "12")]).await];
    let due = Utc::now() + chrono::Duration::seconds(1);
    for (name, token) in ["light", "heavy"].iter().zip(&tokens) {
        let herd: Vec<Value> = (0..300).map(|i| json!({"biz_type": name, "run_at": due.to_rfc3339(), "payload": {"biz": name, "i": i}})).collect();
        assert_eq!(app.post("/api/v1/tasks/batch", token, json!({"tasks": herd})).await.status, 200);
    }

    // A second into the herds, the nodes are full; solo's task is created due now.
    let first = receiver.wait_for(1, Duration::from_secs(10)).await[0].at;
    tokio::time::sleep_until((first + Duration::from_secs(1)).into()).await;
    let created = Instant::now();
    app.create_task(&tokens[2], json!({"biz_type": "solo", "payload": {"biz": "solo"}})).await;
    let solo = wait_until("solo's task at the receiver", Duration::from_secs(15), || async {
        receiver.received().into_iter().find(|r| r.json()["payload"]["biz"] == "solo").map(|r| r.at - created)
    })
    .await;
    tokio::time::sleep_until((first + Duration::from_secs(3)).into()).await;

    // Between 0.5 s and 3 s in, both herds have tasks waiting (heavy's last about 5 s).
    let received = receiver.received();
    let within = |biz: &str| {
        received
            .iter()
            .filter(|r| r.json()["payload"]["biz"] == biz && r.at >= first + Duration::from_millis(500) && r.at < first + Duration::from_secs(3))
            .count()
    };
    let (light, heavy) = (within("light"), within("heavy"));
    println!("in 2.5 s: light {light}, heavy {heavy}; solo arrived {solo:?} after it was created");
    assert!(light > 0, "light was starved");
    let ratio = heavy as f64 / light as f64;
    assert!((2.0..=4.5).contains(&ratio), "heavy (weight 3) got {heavy} callbacks to light's (weight 1) {light}: ×{ratio:.2}, not about 3");
    assert!(solo < HOLD + Duration::from_millis(700), "solo's task waited {solo:?} behind the herds");
}
