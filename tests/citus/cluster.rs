//! A real Citus cluster for the tests: a coordinator and two workers, three PostgreSQL 15
//! servers with `shared_preload_libraries = 'citus'`, started once per test binary by the
//! embedded PostgreSQL's own throwaway start (`embedded_pg::start_throwaway_with`: run as
//! the `postgres` user when the tests run as root, reached over Unix sockets, stopped and
//! removed by its watchdog when this process ends, however it ends).
//!
//! Each test gets a database of its own, made on every node: Citus keeps its metadata per
//! database, so a database is a cluster of its own (the extension created in it on each
//! node, the coordinator and workers registered in it). Measured on the 2-core CI machine:
//! about 2 s a database, which beats a cluster per test (three initdb) and keeps tests
//! apart; a template cloned per test, as tests/api does, cannot be had (a database with
//! citus has the extension's maintenance daemon connected to it, which CREATE DATABASE ...
//! TEMPLATE refuses).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use chime::db::embedded_pg::{self, EmbeddedPg};
use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::OnceCell;

/// PostgreSQL 15's binaries: tests/setup.sh builds Citus for 15.
const BIN: &str = "/usr/lib/postgresql/15/bin";

/// Every node preloads Citus. Four shards per distributed table rather than Citus's 32:
/// each partition of `tasks` and `attempts` is a table per shard, and the tests make a
/// few partitions per database; two shards a worker is enough to see placement. Logical
/// WAL: a shard move (`citus_move_shard_placement`, shard_move.rs) copies a shard and
/// follows its writes by logical replication. Background workers: Citus runs a
/// maintenance daemon per database on each node, and the tests' databases live side by
/// side; with PostgreSQL's 8, a move's replication workers could not start beside them
/// ("could not start maintenance background worker") and the move hung.
const CONF: &str = "shared_preload_libraries = 'citus'\ncitus.shard_count = 4\nwal_level = logical\n\
                    max_worker_processes = 64\nmax_logical_replication_workers = 16\nmax_replication_slots = 32\nmax_wal_senders = 32\n";

pub struct Cluster {
    pub coordinator: EmbeddedPg,
    pub workers: Vec<EmbeddedPg>,
}

static CLUSTER: OnceCell<Cluster> = OnceCell::const_new();

pub async fn cluster() -> &'static Cluster {
    CLUSTER
        .get_or_init(|| async {
            assert!(
                Path::new(BIN).join("postgres").exists(),
                "{BIN}/postgres is missing: the Citus tests need PostgreSQL 15 with the citus extension (bash tests/setup.sh installs both)"
            );
            let (coordinator, first, second) = tokio::join!(start(), start(), start());
            Cluster { coordinator, workers: vec![first, second] }
        })
        .await
}

async fn start() -> EmbeddedPg {
    let node = embedded_pg::start_throwaway_with(Path::new(BIN), CONF).await.expect("starting a PostgreSQL 15 with citus preloaded");
    // How a node reaches itself (Citus's default is localhost over TCP, which these servers
    // do not listen on): a shard move's logical replication connects there.
    let mut conn = PgConnection::connect(&node.url("postgres")).await.unwrap();
    let socket_dir = node.socket_dir().to_str().unwrap().replace('\'', "''");
    conn.execute(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET citus.local_hostname = '{socket_dir}'"))).await.unwrap();
    conn.execute("SELECT pg_reload_conf()").await.unwrap();
    conn.close().await.unwrap();
    node
}

/// A fresh database on the cluster, not migrated: made on each node, with the citus
/// extension, and the workers registered on the coordinator. Returns its URL on the
/// coordinator, which is where chime connects.
pub async fn citus_database() -> String {
    let name = database_name("citus");
    make_database(&cluster().await.coordinator, &name).await;
    make_cluster_of(&name).await
}

/// A fresh database on the coordinator alone, without Citus: as a plain primary's.
pub async fn plain_database() -> String {
    let name = database_name("plain");
    let coordinator = &cluster().await.coordinator;
    make_database(coordinator, &name).await;
    coordinator.url(&name)
}

fn database_name(kind: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!("chime_{kind}_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

async fn make_database(node: &EmbeddedPg, name: &str) {
    let mut conn = PgConnection::connect(&node.url("postgres")).await.unwrap();
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await.unwrap();
    conn.close().await.unwrap();
}

/// Makes `name`, a database on the coordinator, a Citus cluster's, as an operator does
/// (docs/book/src/citus.md, Setting up): the database made on each worker, the extension
/// created on every node, the workers registered on the coordinator. Returns its URL there.
pub async fn make_cluster_of(name: &str) -> String {
    let cluster = cluster().await;
    futures_util::future::join_all(cluster.workers.iter().map(|worker| make_database(worker, name))).await;
    let nodes = std::iter::once(&cluster.coordinator).chain(&cluster.workers);
    futures_util::future::join_all(nodes.map(|node| async {
        let mut conn = PgConnection::connect(&node.url(name)).await.unwrap();
        conn.execute("CREATE EXTENSION citus").await.unwrap();
        conn.close().await.unwrap();
    }))
    .await;
    let url = cluster.coordinator.url(name);
    let mut conn = PgConnection::connect(&url).await.unwrap();
    sqlx::query("SELECT citus_set_coordinator_host($1, 5432)")
        .bind(cluster.coordinator.socket_dir().to_str().unwrap())
        .execute(&mut conn)
        .await
        .unwrap();
    for worker in &cluster.workers {
        add_node(&mut conn, worker).await;
    }
    conn.close().await.unwrap();
    url
}

/// Registers `worker` on the coordinator (`conn`). Tried again, up to five times: with the
/// whole suite making its databases at once on two cores, Citus's connection to the worker
/// for it has failed, rarely ("failure on connection marked as essential"); the worker's
/// log is printed each time, to say why. Registering a node again is harmless.
async fn add_node(conn: &mut PgConnection, worker: &EmbeddedPg) {
    let host = worker.socket_dir().to_str().unwrap().to_string();
    for tries in 1.. {
        match sqlx::query("SELECT citus_add_node($1, 5432)").bind(&host).execute(&mut *conn).await {
            Ok(_) => return,
            Err(e) if tries < 5 => {
                let log = std::fs::read_to_string(worker.socket_dir().with_file_name("postgres.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
                eprintln!("registering the worker {host} failed ({e}); trying again; its log ends:\n{}", tail.join("\n"));
                tokio::time::sleep(std::time::Duration::from_millis(500 * tries)).await;
            }
            Err(e) => panic!("registering the worker {host}: {e}"),
        }
    }
}

/// A fresh database on the cluster, migrated by chime (the Citus step included).
pub async fn migrated_database() -> String {
    let url = citus_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    chime::db::migrate_on(&mut conn).await.expect("chime migrate on the Citus coordinator");
    conn.close().await.unwrap();
    url
}

/// The URL of `database` on the worker whose Unix socket is in `socket_dir`.
pub fn worker_url(socket_dir: &str, database: &str) -> String {
    let cluster = CLUSTER.get().expect("the cluster is started");
    let worker = cluster.workers.iter().find(|w| w.socket_dir().to_str() == Some(socket_dir)).expect("a worker of the cluster");
    worker.url(database)
}
