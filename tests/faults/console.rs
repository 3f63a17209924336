//! The console's sign-in form under the memory attack.

use std::time::Instant;

use reqwest::header::COOKIE;

use crate::helpers::{chime_node, client, fresh_database};
use crate::{heavy, rss_kib};

/// 1,500 sign-in posts with fresh 15 KB user names, each carrying a token pair the client
/// made up (no page load needed): a `chime serve` process's resident memory grows by less
/// than 4 MB. Before, the limiter kept every name it was asked about, refused or not, and
/// never let go: +15.5 MB here in a debug build (the issue measured +118 MB); now a refused
/// attempt adds nothing and a key is 32 bytes: +0.1 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_posts_with_fresh_long_names_do_not_grow_memory() {
    const POSTS: usize = 1500;
    const BOUND_KIB: u64 = 4 * 1024;
    let _turn = heavy().await;
    let db_url = fresh_database().await;
    let (node, address) = chime_node(&db_url, &[("CHIME_ENGINE", "false")]).await;
    let client = client();
    let padding = "n".repeat(15 * 1024);
    let post = |i: usize| {
        let username = format!("{i}{padding}");
        client
            .post(format!("{address}/console/login"))
            .header(COOKIE, "chime_login=chosen-by-the-client")
            .form(&[("username", username.as_str()), ("password", "guess"), ("csrf", "chosen-by-the-client"), ("next", "/console")])
            .send()
    };
    // A first round settles the process's buffers (and uses up the address's free failures).
    for i in 0..50 {
        assert!([401, 429].contains(&post(i).await.unwrap().status().as_u16()));
    }
    let before = rss_kib(node.id().unwrap());
    let started = Instant::now();
    for i in 50..50 + POSTS {
        assert_eq!(post(i).await.unwrap().status(), 429);
    }
    let grown = rss_kib(node.id().unwrap()).saturating_sub(before);
    println!("{POSTS} sign-in posts with 15 KB names in {:?}: resident memory +{grown} KiB", started.elapsed());
    assert!(grown < BOUND_KIB, "+{grown} KiB after {POSTS} posts (bound {BOUND_KIB} KiB)");
}
