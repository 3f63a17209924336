//! What the database server chime writes to reports about itself and its replication
//! (docs/design/contract.md, High availability), for the console's Cluster page: where the server is, whether it is the
//! primary, its version, and the standbys streaming from it.
//!
//! Everything here is read from functions, settings and `pg_stat_replication`: it locks
//! nothing and writes nothing. Both statements run in one transaction, so the facts are of
//! one server even when `DATABASE_URL` names several hosts or goes through a pooler.
//!
//! `pg_stat_replication` lists every WAL sender to anyone, but only a superuser or a member
//! of `pg_read_all_stats` (which `pg_monitor` includes) sees more than the application
//! name: for other roles the address, state and positions are NULL, hence
//! [`Standby::details`] is an `Option`.

use crate::db::Pool;

/// The server chime's connections reach, as it describes itself.
#[derive(Debug)]
pub struct Server {
    pub address: Address,
    /// `pg_is_in_recovery()`: a standby. chime writes only to primaries, so this should
    /// never be seen; if it is, the page says so.
    pub in_recovery: bool,
    /// `server_version`, e.g. "15.8 (Debian 15.8-1.pgdg120+1)".
    pub version: String,
    /// `synchronous_standby_names`; empty when replication is asynchronous.
    pub synchronous_standby_names: String,
    /// `synchronous_commit` as chime's sessions have it: with `off` or `local`, commits do
    /// not wait for a synchronous standby even when one is named.
    pub synchronous_commit: String,
    /// The WAL senders, i.e. the standbys and WAL archivers streaming from this server.
    pub standbys: Vec<Standby>,
}

/// Where the server says the session reached it.
#[derive(Debug, PartialEq)]
pub enum Address {
    /// `inet_server_addr()` and `inet_server_port()`.
    Tcp { host: String, port: i32 },
    /// Over a Unix socket both are NULL: the server's socket directories and port instead.
    /// The directories are `None` when chime's role may not read that setting (it lacks
    /// `pg_monitor`, which includes `pg_read_all_settings`).
    UnixSocket { directories: Option<Vec<String>>, port: String },
}

#[derive(Debug)]
pub struct Standby {
    /// What the standby calls itself (`application_name`, the name
    /// `synchronous_standby_names` matches): visible to every role.
    pub application_name: String,
    /// `None` when chime's role may not see them (it lacks `pg_monitor`).
    pub details: Option<StandbyDetails>,
}

#[derive(Debug)]
pub struct StandbyDetails {
    /// `None` when the standby connects over a Unix socket.
    pub client_addr: Option<String>,
    /// `startup`, `catchup`, `streaming`, `backup` or `stopping`.
    pub state: String,
    /// `async`, `potential`, `sync` or `quorum`.
    pub sync_state: String,
    /// `replay_lag` in seconds: `None` once a caught-up standby has been idle a moment, and
    /// for a receiver that replays nothing (`pg_receivewal`).
    pub replay_lag_secs: Option<f64>,
    /// WAL bytes written here and not yet replayed there; `None` when the standby reports
    /// no replay position.
    pub bytes_behind: Option<i64>,
}

impl Server {
    /// Synchronous replication is asked for and no visible standby is synchronous: every
    /// commit waits until one connects. Unknown (false) when the details are hidden.
    pub fn commits_wait(&self) -> bool {
        !self.synchronous_standby_names.is_empty()
            && !matches!(self.synchronous_commit.as_str(), "off" | "local")
            && self.standbys.iter().all(|s| s.details.as_ref().is_some_and(|d| !matches!(d.sync_state.as_str(), "sync" | "quorum")))
    }
}

#[derive(sqlx::FromRow)]
struct ServerRow {
    host: Option<String>,
    port: Option<i32>,
    socket_directories: Option<String>,
    port_setting: String,
    in_recovery: bool,
    version: String,
    synchronous_standby_names: String,
    synchronous_commit: String,
}

#[derive(sqlx::FromRow)]
struct StandbyRow {
    application_name: Option<String>,
    client_addr: Option<String>,
    state: Option<String>,
    sync_state: Option<String>,
    replay_lag_secs: Option<f64>,
    bytes_behind: Option<i64>,
}

/// Reads what the server reports about itself and the standbys streaming from it.
pub async fn read(pool: &Pool) -> Result<Server, sqlx::Error> {
    let mut conn = pool.begin().await?;
    let server: ServerRow = crate::db::query_as(
        "SELECT host(inet_server_addr()) AS host, inet_server_port() AS port,
                -- Not current_setting(), which raises an error for a role that may not
                -- read it; pg_settings leaves it out instead.
                (SELECT setting FROM pg_settings WHERE name = 'unix_socket_directories') AS socket_directories,
                current_setting('port') AS port_setting,
                pg_is_in_recovery() AS in_recovery,
                current_setting('server_version') AS version,
                current_setting('synchronous_standby_names') AS synchronous_standby_names,
                current_setting('synchronous_commit') AS synchronous_commit",
    )
    .fetch_one(&mut *conn)
    .await?;
    // A standby has no current WAL position (the function raises an error there): its
    // cascading standbys are measured against what it has replayed itself.
    let rows: Vec<StandbyRow> = crate::db::query_as(
        "SELECT application_name, host(client_addr) AS client_addr, state, sync_state,
                extract(epoch FROM replay_lag)::float8 AS replay_lag_secs,
                pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
                                replay_lsn)::bigint AS bytes_behind
           FROM pg_stat_replication
          ORDER BY application_name, pid",
    )
    .fetch_all(&mut *conn)
    .await?;
    conn.commit().await?;
    let address = match (server.host, server.port) {
        (Some(host), Some(port)) => Address::Tcp { host, port },
        _ => Address::UnixSocket { directories: server.socket_directories.as_deref().map(setting_list), port: server.port_setting },
    };
    let standbys = rows
        .into_iter()
        .map(|r| Standby {
            application_name: r.application_name.unwrap_or_default(),
            // The state is NULL only when the role may not see the WAL sender's details.
            details: r.state.map(|state| StandbyDetails {
                client_addr: r.client_addr,
                state,
                sync_state: r.sync_state.unwrap_or_default(),
                replay_lag_secs: r.replay_lag_secs,
                bytes_behind: r.bytes_behind,
            }),
        })
        .collect();
    Ok(Server {
        address,
        in_recovery: server.in_recovery,
        version: server.version,
        synchronous_standby_names: server.synchronous_standby_names,
        synchronous_commit: server.synchronous_commit,
        standbys,
    })
}

/// The items of a list setting such as `unix_socket_directories`: separated by commas,
/// each optionally in double quotes (which keep commas and spaces; `""` is a quote).
fn setting_list(setting: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut item = String::new();
    let mut quoted = false;
    let mut chars = setting.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                item.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => items.push(std::mem::take(&mut item).trim().to_string()),
            c => item.push(c),
        }
    }
    items.push(item.trim().to_string());
    items.retain(|i| !i.is_empty());
    items
}

#[cfg(test)]
mod tests {
    use super::setting_list;

    #[test]
    fn list_settings_are_split_and_unquoted() {
        assert_eq!(setting_list("/var/run/postgresql, /tmp"), ["/var/run/postgresql", "/tmp"]);
        assert_eq!(setting_list(r#""/tmp/a, b""c""#), [r#"/tmp/a, b"c"#]);
        assert!(setting_list("").is_empty());
    }
}
