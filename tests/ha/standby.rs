//! A standby named first in DATABASE_URL: chime writes and leads on the primary.

use std::time::Duration;

use crate::cluster::{Server, advisory_locks, chime_sessions, url};
use crate::helpers::chime_node;
use crate::helpers::wait_until;
use crate::receiver::{Answer, Receiver};
use crate::{create_task, heavy, orders};

/// A primary and its synchronous standby, the standby listed first, in both of libpq's
/// forms: chime starts, serves creates, delivers them, and leads on the primary; the
/// standby holds no advisory lock and no chime session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_listed_first_is_skipped() {
    let _turn = heavy().await;
    let primary = Server::primary().await;
    let standby = Server::standby_of(&primary).await;
    primary.make_synchronous(&standby).await;
    let pool = chime::db::connect(&url(primary.port, "chime"), 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = orders(&pool, &receiver.url).await;

    let forms = [
        format!("postgres://postgres@127.0.0.1:{},127.0.0.1:{}/chime?target_session_attrs=read-write&sslmode=disable", standby.port, primary.port),
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} dbname=chime user=postgres target_session_attrs=primary sslmode=disable",
            standby.port, primary.port
        ),
    ];
    let mut nodes = Vec::new();
    for (i, db_url) in forms.iter().enumerate() {
        let (child, address) = chime_node(db_url, &[]).await;
        let id = create_task(&address, &token).await;
        let received = receiver.wait_for(i + 1, Duration::from_secs(10)).await;
        assert!(received.iter().any(|r| r.header("chime-task-id") == Some(&id)), "the task created through {db_url} was not delivered");
        nodes.push(child);
    }

    // A node leads, on the primary (the lock and its session are there).
    wait_until("a leader on the primary", Duration::from_secs(15), || async { chime::leader::current(&pool).await.unwrap().is_some() }).await;
    // Sessions on the primary have lived long enough to count; the standby has none.
    wait_until("chime's sessions on the primary", Duration::from_secs(10), || async { chime_sessions(primary.port).await > 0 }).await;
    assert_eq!(advisory_locks(standby.port).await, 0, "an advisory lock on the standby");
    assert_eq!(chime_sessions(standby.port).await, 0, "chime holds sessions on the standby");
    for child in &mut nodes {
        assert!(child.try_wait().unwrap().is_none(), "a node exited");
    }
}
