//! The servers a database URL names, and finding the one that accepts writes.
//!
//! libpq takes several hosts, tried in order, in both of its forms: the URL
//! `postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write` and the key=value
//! string `host=h1,h2 port=5432,5433 dbname=db`. sqlx takes one host, so each host becomes
//! a `PgConnectOptions` of its own, and chime picks among them: the first that accepts
//! writes (docs/design/contract.md, High availability). chime always writes, so it uses only such a server whatever
//! `target_session_attrs` says.

use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, Row};

/// How long one host may take to accept a session, unless `connect_timeout` says otherwise:
/// a host that drops packets gives no answer at all.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The hosts of one database URL, in the order they are tried.
#[derive(Clone, Debug)]
pub struct Hosts {
    /// The setting the URL came from, for messages: `DATABASE_URL`.
    pub setting: &'static str,
    hosts: Vec<Host>,
    connect_timeout: Duration,
    /// `sslrootcert`, read at start for a clear error (`db::check_root_cert`).
    pub root_cert: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Host {
    /// `host:port`, or the socket directory and port: how messages name it.
    pub label: String,
    pub options: PgConnectOptions,
}

impl Hosts {
    /// Parses either libpq form. One host behaves as a URL always has.
    pub fn parse(text: &str, setting: &'static str) -> anyhow::Result<Hosts> {
        let invalid = || format!("{setting} is not a valid PostgreSQL URL or key=value connection string");
        let url = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            split_url_hosts(text).with_context(invalid)?
        } else if text.contains('=') {
            key_value_to_url(text).with_context(invalid)?
        } else {
            bail!("{}: expected postgres://… or host=… dbname=…", invalid());
        };
        let mut url = url::Url::parse(&url).with_context(invalid)?;
        // chime's own parameters, taken out of what sqlx sees (it would warn of each).
        let mut connect_timeout = CONNECT_TIMEOUT;
        let mut root_cert = None;
        let mut client_key = None;
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        let mut rest = Vec::new();
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "target_session_attrs" => check_session_attrs(&value, setting)?,
                "connect_timeout" => {
                    let secs: u64 = value
                        .parse()
                        .ok()
                        .filter(|s| *s > 0)
                        .with_context(|| format!("connect_timeout={value} in {setting}: expected a number of seconds"))?;
                    connect_timeout = Duration::from_secs(secs);
                }
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                    root_cert = Some(value.to_string());
                    rest.push((key.into_owned(), value.into_owned()));
                }
                "sslkey" | "ssl-key" => client_key = Some(client_key_pkcs8(&value, setting)?),
                "host" | "hostaddr" => hosts.extend(value.split(',').map(str::to_string)),
                "port" => ports.extend(value.split(',').map(str::to_string)),
                _ => rest.push((key.into_owned(), value.into_owned())),
            }
        }
        url.set_query(None);
        if !rest.is_empty() {
            url.query_pairs_mut().extend_pairs(rest);
        }
        let with_key = |options: PgConnectOptions| match &client_key {
            Some(key) => options.ssl_client_key_from_pem(key),
            None => options,
        };
        if hosts.is_empty() {
            let options: PgConnectOptions = url.as_str().parse().with_context(invalid)?;
            let options = with_ports(with_key(options), &ports, 0, setting)?;
            return Ok(Hosts { setting, hosts: vec![Host::new(options)], connect_timeout, root_cert });
        }
        if ports.len() > 1 && ports.len() != hosts.len() {
            bail!("{setting} names {} hosts and {} ports: give one port for all, or one per host", hosts.len(), ports.len());
        }
        let mut parsed = Vec::with_capacity(hosts.len());
        for (i, host) in hosts.iter().enumerate() {
            let mut one = url.clone();
            one.query_pairs_mut().append_pair("host", host);
            let options: PgConnectOptions = one.as_str().parse().with_context(invalid)?;
            parsed.push(Host::new(with_ports(with_key(options), &ports, i, setting)?));
        }
        Ok(Hosts { setting, hosts: parsed, connect_timeout, root_cert })
    }

    /// The single host of `options`: a pool's own, for what connects without a URL.
    pub fn single(options: PgConnectOptions, setting: &'static str) -> Hosts {
        Hosts { setting, hosts: vec![Host::new(options)], connect_timeout: CONNECT_TIMEOUT, root_cert: None }
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Tries the hosts in order, from the first; returns the first that accepts writes (its
    /// index and a session on it, made with `customize`), or why none did, host by host.
    pub async fn find_writable(
        &self,
        customize: &(dyn Fn(PgConnectOptions) -> PgConnectOptions + Send + Sync),
    ) -> Result<(usize, PgConnection), NoWritableHost> {
        let mut refusals = Vec::with_capacity(self.hosts.len());
        let mut certificates_refused = 0;
        for (i, host) in self.hosts.iter().enumerate() {
            let options = customize(host.options.clone());
            let attempt = tokio::time::timeout(self.connect_timeout, options.connect()).await;
            let reason = match attempt {
                Err(_) => format!("did not answer within {} s", self.connect_timeout.as_secs()),
                Ok(Err(e)) => {
                    certificates_refused += usize::from(refused_certificate(&e).is_some());
                    refusal(&e)
                }
                Ok(Ok(mut conn)) => match writable(&mut conn).await {
                    Ok(Writable::Yes) => return Ok((i, conn)),
                    Ok(no) => {
                        let _ = conn.close().await;
                        no.to_string()
                    }
                    Err(e) => refusal(&e),
                },
            };
            refusals.push(format!("{} {reason}", host.label));
        }
        let certificate_refused = certificates_refused == self.hosts.len();
        Err(NoWritableHost { setting: self.setting, refusals, certificate_refused })
    }
}

impl Host {
    fn new(options: PgConnectOptions) -> Host {
        let label = match options.get_socket() {
            Some(dir) => format!("{}:{} (Unix socket)", dir.display(), options.get_port()),
            None if options.get_host().contains(':') => format!("[{}]:{}", options.get_host(), options.get_port()),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        };
        Host { label, options }
    }
}

/// No host accepted writes; says why for each, in order.
#[derive(Debug)]
pub struct NoWritableHost {
    setting: &'static str,
    refusals: Vec<String>,
    /// Every host's certificate failed verification (sslmode=verify-ca or verify-full):
    /// trying again will not help.
    pub certificate_refused: bool,
}

impl std::fmt::Display for NoWritableHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (setting, refusals) = (self.setting, self.refusals.join("; "));
        match (self.refusals.len(), self.certificate_refused) {
            (1, false) => write!(f, "the database in {setting} does not accept writes: {refusals}"),
            (_, false) => write!(f, "no host in {setting} accepts writes: {refusals}"),
            // OpenSSL has said why, host by host; then what to do about it.
            (_, true) => write!(
                f,
                "the server's certificate in {setting} cannot be verified: {refusals}. To verify it, name the CA \
                 that signed it in sslrootcert (for a self-signed one, the certificate itself), and under \
                 verify-full connect by a host name it holds; or use sslmode=require to encrypt without verifying it"
            ),
        }
    }
}

impl std::error::Error for NoWritableHost {}

/// Whether a session's server takes writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Writable {
    Yes,
    /// In recovery: a standby, or a primary being demoted.
    Standby,
    /// A primary with `default_transaction_read_only` (set by hand, or by a failover
    /// manager fencing it).
    ReadOnly,
}

impl std::fmt::Display for Writable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Writable::Yes => "accepts writes",
            Writable::Standby => "is a standby",
            Writable::ReadOnly => "accepts no writes (default_transaction_read_only is on)",
        })
    }
}

/// Asks the session's server. As a simple query (one message, text results), which a
/// pooler in transaction mode passes through whole: a statement with parameters takes two
/// rounds, between which the pooler may hand the server session to another client.
pub async fn writable(conn: &mut PgConnection) -> Result<Writable, sqlx::Error> {
    let row = sqlx::raw_sql("SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'").fetch_one(conn).await?;
    let (recovery, read_only): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
    Ok(match (recovery, read_only) {
        (true, _) => Writable::Standby,
        (false, true) => Writable::ReadOnly,
        (false, false) => Writable::Yes,
    })
}

/// Why a host refused, in a few words.
fn refusal(e: &sqlx::Error) -> String {
    if let Some(why) = refused_certificate(e) {
        return format!("sent a certificate that failed verification ({why})");
    }
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => "refused the connection".into(),
        sqlx::Error::Io(io) => format!("could not be reached ({io})"),
        sqlx::Error::Database(db) => format!("answered: {}", db.message()),
        e => format!("failed: {e}"),
    }
}

/// OpenSSL's reason for refusing the server's certificate, when that is why a connection
/// failed: "certificate verify failed: unable to get local issuer certificate" (or "...:
/// IP address mismatch", "...: self-signed certificate"). Only under verify-ca and
/// verify-full, which verify it; prefer and require encrypt without verifying.
///
/// sqlx passes native-tls's error on as `Error::Tls`. Its source is OpenSSL's error stack,
/// whose reason says that verification failed; OpenSSL's verify result, which says why, is
/// not exposed by native-tls but ends its text, in parentheses: "{stack} (why)".
fn refused_certificate(e: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Tls(tls) = e else { return None };
    let stack = tls.source()?.downcast_ref::<openssl::error::ErrorStack>()?;
    let failed = stack.errors().iter().find_map(|err| err.reason().filter(|r| *r == "certificate verify failed"))?;
    let text = tls.to_string();
    let why = text.strip_prefix(&stack.to_string()).and_then(|rest| rest.strip_prefix(" (")?.strip_suffix(')'));
    Some(match why {
        Some(why) => format!("{failed}: {why}"),
        None => failed.to_string(),
    })
}

/// The client key named by `sslkey`, as PKCS#8 PEM. OpenSSL, through native-tls, takes
/// only PKCS#8 ("BEGIN PRIVATE KEY"), where libpq also takes the older forms that `openssl
/// genrsa` and `openssl ecparam -genkey` write ("BEGIN RSA PRIVATE KEY", "BEGIN EC PRIVATE
/// KEY"): read whichever it is and hand sqlx the PKCS#8 form.
fn client_key_pkcs8(path: &str, setting: &str) -> anyhow::Result<Vec<u8>> {
    let pem = std::fs::read(path).with_context(|| format!("sslkey in {setting}: cannot read {path}"))?;
    let key = openssl::pkey::PKey::private_key_from_pem(&pem)
        .with_context(|| format!("sslkey in {setting}: {path} is not an unencrypted private key in PEM form"))?;
    key.private_key_to_pem_pkcs8().with_context(|| format!("sslkey in {setting}: cannot convert {path} to PKCS#8"))
}

/// docs/design/contract.md, High availability: any value is accepted; one that allows a standby is said to be ignored.
fn check_session_attrs(value: &str, setting: &str) -> anyhow::Result<()> {
    match value {
        "read-write" | "primary" => Ok(()),
        "any" | "read-only" | "standby" | "prefer-standby" => {
            tracing::warn!(
                "target_session_attrs={value} in {setting} would allow a standby; chime writes, so it uses only a server \
                 that accepts writes (as with read-write) and ignores it"
            );
            Ok(())
        }
        _ => bail!("target_session_attrs={value} in {setting} is not one of read-write, primary, any, read-only, standby, prefer-standby"),
    }
}

/// Port `i` of a `port=` list (one for all hosts, or one per host), if the list gives one.
fn with_ports(options: PgConnectOptions, ports: &[String], i: usize, setting: &str) -> anyhow::Result<PgConnectOptions> {
    let Some(port) = ports.get(i).or(ports.first().filter(|_| ports.len() == 1)) else { return Ok(options) };
    if port.is_empty() {
        return Ok(options);
    }
    let port: u16 = port.parse().ok().with_context(|| format!("port {port} in {setting} is not a port number"))?;
    Ok(options.port(port))
}

/// A URL naming several hosts (`h1:p1,h2:p2`) becomes one the `url` crate parses: the hosts
/// move into `host` and `port` parameters. A URL with one host is left as it is.
fn split_url_hosts(text: &str) -> anyhow::Result<String> {
    let (scheme, rest) = text.split_once("://").context("no scheme")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hostlist) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if !hostlist.contains(',') {
        return Ok(text.to_string());
    }
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    for entry in hostlist.split(',') {
        let (host, port) = match entry.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').context("an IPv6 address without its closing ]")?;
                (host, after.strip_prefix(':').unwrap_or(""))
            }
            None => entry.rsplit_once(':').unwrap_or((entry, "")),
        };
        anyhow::ensure!(!host.is_empty(), "an empty host in the host list");
        let host = percent_encoding::percent_decode_str(host).decode_utf8().context("a host that is not UTF-8")?;
        hosts.push(host.into_owned());
        ports.push(port.to_string());
    }
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut url = url::Url::parse(&format!("{scheme}://{user}localhost{path}"))?;
    url.set_query((!query.is_empty()).then_some(query));
    // An empty port is the default; keep the list aligned with the hosts.
    let ports = if ports.iter().all(String::is_empty) {
        String::new()
    } else {
        ports.iter().map(|p| if p.is_empty() { "5432" } else { p }).collect::<Vec<_>>().join(",")
    };
    url.query_pairs_mut().append_pair("host", &hosts.join(","));
    if !ports.is_empty() {
        url.query_pairs_mut().append_pair("port", &ports);
    }
    Ok(url.to_string())
}

/// libpq's key=value form (`host=h1,h2 port=5432 dbname=chime user='a b'`) as a URL whose
/// parameters sqlx knows: every key becomes a query parameter.
fn key_value_to_url(text: &str) -> anyhow::Result<String> {
    let mut url = url::Url::parse("postgres://localhost")?;
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        anyhow::ensure!(chars.next() == Some('='), "expected key=value after {key:?}");
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.push(chars.next().context("a value ends in a backslash")?),
                    Some(c) => value.push(c),
                    None => bail!("the quoted value of {key} is not closed"),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(chars.next().context("a value ends in a backslash")?);
                } else {
                    value.push(c);
                }
            }
        }
        url.query_pairs_mut().append_pair(&key, &value);
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(text: &str) -> Vec<String> {
        Hosts::parse(text, "DATABASE_URL").unwrap().hosts.iter().map(|h| h.label.clone()).collect()
    }

    #[test]
    fn both_libpq_forms_name_several_hosts_in_order() {
        assert_eq!(labels("postgres://u:p@h1:5433,h2,[::1]:5435/chime?sslmode=disable"), ["h1:5433", "h2:5432", "[::1]:5435"]);
        assert_eq!(labels("host=h1,h2 port=5433,5434 dbname=chime user=u"), ["h1:5433", "h2:5434"]);
        assert_eq!(labels("host=h1,h2 port=6000"), ["h1:6000", "h2:6000"]);
        let hosts =
            Hosts::parse("postgresql://me:s%40cret@a:1,b:2/orders?application_name=x&target_session_attrs=read-write", "DATABASE_URL").unwrap();
        for host in hosts.hosts() {
            assert_eq!(host.options.get_username(), "me");
            assert_eq!(host.options.get_database(), Some("orders"));
            assert_eq!(host.options.get_application_name(), Some("x"));
        }
        let kv = Hosts::parse("host=h dbname='my db' user=u password='it''s' connect_timeout=2", "DATABASE_URL");
        assert!(kv.is_err(), "'' is not libpq's quote escape");
        let kv = Hosts::parse(r"host=h dbname='my db' user=u password='it\'s' connect_timeout=2", "DATABASE_URL").unwrap();
        assert_eq!(kv.hosts()[0].options.get_database(), Some("my db"));
        assert_eq!(kv.connect_timeout, Duration::from_secs(2));
    }

    #[test]
    fn one_host_parses_as_before() {
        assert_eq!(labels("postgres://u@db.example:6543/chime?sslmode=disable"), ["db.example:6543"]);
        assert_eq!(labels("postgres://u@%2Fvar%2Frun%2Fpostgresql/chime"), ["/var/run/postgresql:5432 (Unix socket)"]);
        assert_eq!(labels("postgres://u@localhost/chime?host=/tmp/sock&port=5999"), ["/tmp/sock:5999 (Unix socket)"]);
    }

    #[test]
    fn bad_lists_and_attributes_are_named() {
        let e = Hosts::parse("host=a,b,c port=1,2", "DATABASE_URL").unwrap_err().to_string();
        assert!(e.contains("3 hosts and 2 ports"), "{e}");
        let e = Hosts::parse("postgres://a,b/chime?target_session_attrs=writable", "DATABASE_URL").unwrap_err().to_string();
        assert!(e.contains("target_session_attrs=writable") && e.contains("read-write"), "{e}");
        assert!(Hosts::parse("postgres://a,b/chime?target_session_attrs=any", "DATABASE_URL").is_ok());
        let e = Hosts::parse("postgres://a:x,b/chime", "DATABASE_URL").unwrap_err();
        assert!(format!("{e:#}").contains("port x"), "{e:#}");
        assert!(Hosts::parse("not a url", "DATABASE_URL").is_err());
    }

    #[test]
    fn no_writable_host_names_each_host_and_why() {
        let e = NoWritableHost {
            setting: "DATABASE_URL",
            refusals: vec!["127.0.0.1:5433 is a standby".into(), "127.0.0.1:5432 refused the connection".into()],
            certificate_refused: false,
        };
        assert_eq!(e.to_string(), "no host in DATABASE_URL accepts writes: 127.0.0.1:5433 is a standby; 127.0.0.1:5432 refused the connection");
        // A certificate that fails verification: what to do follows OpenSSL's reason.
        let why = "127.0.0.1:5432 sent a certificate that failed verification (certificate verify failed: IP address mismatch)";
        let e = NoWritableHost { setting: "DATABASE_URL", refusals: vec![why.into()], certificate_refused: true };
        let e = e.to_string();
        assert!(e.starts_with(&format!("the server's certificate in DATABASE_URL cannot be verified: {why}. To verify it")), "{e}");
        assert!(e.contains("sslrootcert") && e.ends_with("use sslmode=require to encrypt without verifying it"), "{e}");
    }
}
