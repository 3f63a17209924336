//! The cluster page: nodes (by host name, pid and version) and their heartbeats, the
//! leader, the database server and its standbys, partitions and cold storage. It refreshes
//! itself, as the dashboard does.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{ConsoleError, Ctx, Session, render};
use crate::partitions;
use crate::replication::{self, Address};
use crate::state::AppState;

#[derive(sqlx::FromRow)]
pub struct PartitionRow {
    pub name: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// PostgreSQL's estimate (kept by autovacuum and ANALYZE): exact counts would read
    /// every row of every partition.
    pub rows: i64,
    pub size: String,
}

#[derive(Template)]
#[template(path = "cluster.html")]
struct Page {
    ctx: Ctx,
    nodes: Vec<crate::nodes::Registered>,
    leader: Option<Uuid>,
    database: replication::Server,
    /// The host of DATABASE_URL the statements go to now.
    writing_to: String,
    horizon: DateTime<Utc>,
    partitions: Vec<PartitionRow>,
    cold_rows: i64,
    cold_size: String,
}

impl Page {
    /// A node's host name and pid, while it is registered.
    fn name_of(&self, id: &Uuid) -> Option<String> {
        self.nodes.iter().find(|n| n.id == *id).map(crate::nodes::Registered::name)
    }

    /// WAL bytes as `pg_size_pretty` would put them.
    fn bytes(&self, n: &i64) -> String {
        let mut size = *n as f64;
        for unit in ["bytes", "kB", "MB", "GB"] {
            if size.abs() < 10240.0 {
                return if unit == "bytes" { format!("{n} bytes") } else { format!("{size:.0} {unit}") };
            }
            size /= 1024.0;
        }
        format!("{size:.0} TB")
    }
}

pub async fn show(req: HttpRequest, session: Session, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    let pool = &state.pool;
    let nodes = crate::nodes::list(pool).await?;
    let mut rows = Vec::new();
    for table in ["tasks", "attempts"] {
        for p in partitions::list(pool, table).await?.into_iter().rev() {
            let (count, size) = partitions::estimate(pool, &p.name).await?;
            rows.push(PartitionRow { name: p.name, from: p.from, to: p.to, rows: count, size });
        }
    }
    let (cold_rows, cold_size) = partitions::estimate(pool, "tasks_cold").await?;
    let page = Page {
        ctx: Ctx::new(&session, &req, "cluster"),
        nodes,
        leader: crate::leader::current(pool).await?,
        database: replication::read(pool).await?,
        writing_to: state.health.writing_to(),
        horizon: partitions::horizon(pool).await?,
        partitions: rows,
        cold_rows,
        cold_size,
    };
    render(StatusCode::OK, &page.ctx, &page)
}
