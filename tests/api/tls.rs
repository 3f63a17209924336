//! TLS to PostgreSQL: a real server that accepts only TLS over TCP, with certificates made
//! here by `openssl`, and every `sslmode` chime documents.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use chime::db::embedded_pg::{self, EmbeddedPg};
use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::OnceCell;

use crate::cli::chime;
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, chime_node, client, free_port};
use crate::receiver::{Answer, Receiver};

/// A throwaway PostgreSQL listening on 127.0.0.1 whose `pg_hba.conf` has only `hostssl`
/// lines for TCP. Its certificate names `localhost` only, so 127.0.0.1 serves as a host
/// name the certificate does not cover.
struct TlsServer {
    port: u16,
    /// The CA that signed the server's certificate.
    ca: PathBuf,
    /// A CA that signed nothing here.
    other_ca: PathBuf,
    /// Kept for the life of the process; its watchdog removes it (certificates included).
    _cluster: EmbeddedPg,
}

static SERVER: OnceCell<TlsServer> = OnceCell::const_new();

async fn server() -> &'static TlsServer {
    SERVER.get_or_init(start_tls_server).await
}

async fn start_tls_server() -> TlsServer {
    let mut pg = embedded_pg::start_throwaway().await.expect("starting a throwaway PostgreSQL");
    let dir = pg.data_dir().join("tls");
    std::fs::create_dir(&dir).unwrap();
    let ca = make_ca(&dir, "ca");
    let other_ca = make_ca(&dir, "other-ca");
    let (cert, key) = server_cert(&dir);
    let port = listen_over_tls(&mut pg, &cert, &key, "hostssl", &[]).await;
    TlsServer { port, ca, other_ca, _cluster: pg }
}

/// Makes the throwaway PostgreSQL `pg` serve TCP on 127.0.0.1 with TLS, with this certificate
/// and key, to clients that `hba` lets in (`hostssl`: TLS only; `host`: with or without;
/// trusted, unless `hba` names a method), with `more` settings; returns its port.
async fn listen_over_tls(pg: &mut EmbeddedPg, cert: &Path, key: &Path, hba: &str, more: &[String]) -> u16 {
    let pgdata = pg.data_dir().join("pgdata");
    // PostgreSQL refuses a key readable by others or owned by another user.
    let owner = std::fs::metadata(&pgdata).unwrap();
    std::os::unix::fs::chown(key, Some(owner.uid()), Some(owner.gid())).unwrap();
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).unwrap();

    // The Unix socket stays for the embedded setup's own use; TCP is TLS or nothing.
    let line = if hba.contains(' ') { hba.to_string() } else { format!("{hba} all all 127.0.0.1/32 trust") };
    std::fs::write(pgdata.join("pg_hba.conf"), format!("local all all trust\n{line}\n")).unwrap();
    let port = free_port();
    let mut conn = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    for setting in [
        "ssl = on".to_string(),
        format!("ssl_cert_file = '{}'", cert.display()),
        format!("ssl_key_file = '{}'", key.display()),
        "listen_addresses = '127.0.0.1'".to_string(),
        format!("port = {port}"),
    ]
    .into_iter()
    .chain(more.iter().cloned())
    {
        conn.execute(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET {setting}"))).await.unwrap();
    }
    conn.close().await.unwrap();
    // listen_addresses and port take a restart; the cluster is fresh, so a hard stop is fine.
    pg.crash().await.unwrap();
    pg.restart().await.unwrap();
    port
}

/// A certificate for `localhost` signed by the CA `make_ca(dir, "ca")` made, and its key;
/// returns their paths.
fn server_cert(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::write(dir.join("server.ext"), "subjectAltName = DNS:localhost\nbasicConstraints = CA:FALSE\nextendedKeyUsage = serverAuth\n").unwrap();
    let new_key = "req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key -out server.csr -subj /CN=localhost";
    openssl(dir, &new_key.split(' ').collect::<Vec<_>>());
    let sign = "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.crt";
    openssl(dir, &sign.split(' ').collect::<Vec<_>>());
    (dir.join("server.crt"), dir.join("server.key"))
}

/// A self-signed CA in `dir`; returns its certificate.
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &format!("/CN=chime test {name}"),
            "-addext",
            "basicConstraints = critical, CA:TRUE",
            "-addext",
            "keyUsage = critical, keyCertSign, cRLSign",
        ],
    );
    dir.join(crt)
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl TlsServer {
    fn url(&self, host: &str, query: &str) -> String {
        format!("postgres://postgres@{host}:{}/chime?{query}", self.port)
    }
}

/// The error chain as `chime` prints it.
async fn connect_error(url: &str) -> String {
    match chime::db::connect(url, 1).await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => {
            let error = format!("{e:#}");
            println!("{url}: {error}");
            error
        }
    }
}

/// What chime says to do when a certificate fails verification, after OpenSSL's reason.
fn says_what_to_do(error: &str) -> bool {
    error.contains("name the CA that signed it in sslrootcert") && error.contains("use sslmode=require to encrypt without verifying it")
}

/// Connects through chime's own `db::connect` and checks the session is encrypted.
async fn connect_over_tls(url: &str) -> Pool {
    let pool = chime::db::connect(url, 1).await.unwrap_or_else(|e| panic!("{url}: {e:#}"));
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(&pool).await.unwrap();
    assert!(ssl, "{url}: the session is not encrypted");
    pool
}

#[tokio::test]
async fn a_server_that_requires_tls_refuses_sslmode_disable() {
    let server = server().await;
    let error = connect_error(&server.url("localhost", "sslmode=disable")).await;
    assert!(error.contains("no pg_hba.conf entry") && error.contains("no encryption"), "{error}");
}

#[tokio::test]
async fn sslmode_require_connects_over_tls() {
    let server = server().await;
    connect_over_tls(&server.url("127.0.0.1", "sslmode=require")).await;
    // prefer takes TLS when the server offers it.
    connect_over_tls(&server.url("127.0.0.1", "sslmode=prefer")).await;
}

#[tokio::test]
async fn verify_full_with_the_ca_connects_to_localhost() {
    let server = server().await;
    connect_over_tls(&server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", server.ca.display()))).await;
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let server = server().await;
    let error = connect_error(&server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", server.other_ca.display()))).await;
    assert!(error.contains("sslmode=verify-full") && error.contains("certificate verify failed: unable to get local issuer certificate"), "{error}");
    assert!(says_what_to_do(&error), "{error}");
}

#[tokio::test]
async fn verify_full_refuses_a_host_name_the_certificate_does_not_name() {
    let server = server().await;
    let error = connect_error(&server.url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={}", server.ca.display()))).await;
    assert!(error.contains("sslmode=verify-full") && error.contains("certificate verify failed: IP address mismatch"), "{error}");
    assert!(says_what_to_do(&error) && error.contains("connect by a host name it holds"), "{error}");
}

/// verify-ca checks the chain but not the name: 127.0.0.1 is accepted, another CA is not.
#[tokio::test]
async fn verify_ca_checks_the_ca_but_not_the_host_name() {
    let server = server().await;
    connect_over_tls(&server.url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={}", server.ca.display()))).await;
    let error = connect_error(&server.url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={}", server.other_ca.display()))).await;
    assert!(error.contains("sslmode=verify-ca") && error.contains("certificate verify failed: unable to get local issuer certificate"), "{error}");
    assert!(says_what_to_do(&error), "{error}");
}

/// A bad sslrootcert is reported as such before any connection is tried.
#[tokio::test]
async fn a_bad_sslrootcert_is_a_clear_error() {
    let server = server().await;
    let missing = server.ca.with_file_name("missing.crt");
    let error = connect_error(&server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", missing.display()))).await;
    assert!(error.contains(&format!("cannot read sslrootcert {}", missing.display())), "{error}");
    // A key is not a certificate.
    let key = server.ca.with_file_name("ca.key");
    let error = connect_error(&server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", key.display()))).await;
    assert!(error.contains("no certificate in it"), "{error}");
}

/// sqlx gives OpenSSL the first certificate of sslrootcert only (libpq takes them all): a
/// bundle whose first is the CA that signed the server's works; one whose first is another
/// is refused, and chime has said at start that only the first is trusted.
#[tokio::test]
async fn only_the_first_certificate_of_an_sslrootcert_bundle_is_trusted_and_chime_says_so() {
    let server = server().await;
    let (ca, other) = (std::fs::read(&server.ca).unwrap(), std::fs::read(&server.other_ca).unwrap());
    let (right_first, other_first) = (server.ca.with_file_name("right-first.crt"), server.ca.with_file_name("other-first.crt"));
    std::fs::write(&right_first, [ca.as_slice(), &other].concat()).unwrap();
    std::fs::write(&other_first, [other.as_slice(), &ca].concat()).unwrap();
    connect_over_tls(&server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", right_first.display()))).await;
    let db_url = server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", other_first.display()));
    let out = chime(&[("DATABASE_URL", db_url.as_str())], &["migrate"], None).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("certificate verify failed: unable to get local issuer certificate"), "{}", out.stderr);
    assert!(out.stderr.contains("holds 2 certificates, of which only the first is trusted"), "{}", out.stderr);
}

/// A real `chime serve` on a verify-full DATABASE_URL migrates, becomes ready and delivers.
#[tokio::test]
async fn chime_serve_over_verify_full_delivers_a_task() {
    let server = server().await;
    let db_url = server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", server.ca.display()));
    let (_child, address) = chime_node(&db_url, &[]).await;
    let app = TestApp { address, pool: connect_over_tls(&db_url).await, db_url, client: client() };
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Settings::default() };
    biz_types::create(&app.pool, "tls", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "tls").await.unwrap();
    let task = app.post("/api/v1/tasks", &token, serde_json::json!({"biz_type": "tls", "key": "t-1"})).await;
    assert_eq!(task.status, 201, "{}", task.body);
    let id = task.body["id"].as_str().unwrap();
    wait_for_status(&app, &token, id, "succeeded").await;
    assert_eq!(receiver.received().len(), 1);

    // The admin subcommands connect the same way.
    let out = chime(&[("DATABASE_URL", app.db_url.as_str())], &["biz-type", "list"], None).await;
    assert!(out.ok && out.stdout.contains("tls"), "{}{}", out.stdout, out.stderr);
}

/// The binary refuses to start on a failed handshake and says why.
#[tokio::test]
async fn chime_stops_at_start_when_the_certificate_is_not_trusted() {
    let server = server().await;
    let db_url = server.url("localhost", &format!("sslmode=verify-full&sslrootcert={}", server.other_ca.display()));
    let out = chime(&[("DATABASE_URL", db_url.as_str())], &["migrate"], None).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("sslmode=verify-full") && out.stderr.contains("certificate verify failed: unable to get local issuer certificate"),
        "{}",
        out.stderr
    );
    assert!(says_what_to_do(&out.stderr), "{}", out.stderr);
}

/// A server whose certificate is X.509 version 1 and self-signed, as the one `CREATE
/// EXTENSION citus` turns TLS on with (RSA, no extensions, so `openssl x509 -req` makes
/// version 1), and which, as Citus leaves it, takes clients with or without TLS.
struct V1Server {
    port: u16,
    cert: PathBuf,
    _cluster: EmbeddedPg,
}

static V1_SERVER: OnceCell<V1Server> = OnceCell::const_new();

async fn v1_server() -> &'static V1Server {
    V1_SERVER.get_or_init(start_v1_server).await
}

async fn start_v1_server() -> V1Server {
    let mut pg = embedded_pg::start_throwaway().await.expect("starting a throwaway PostgreSQL");
    let dir = pg.data_dir().join("tls");
    std::fs::create_dir(&dir).unwrap();
    openssl(&dir, &["req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
    openssl(&dir, &["x509", "-req", "-in", "server.csr", "-signkey", "server.key", "-days", "2", "-out", "server.crt"]);
    let text = Command::new("openssl").args(["x509", "-noout", "-text", "-in"]).arg(dir.join("server.crt")).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("Version: 1 (0x0)"), "not a version 1 certificate");
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let port = listen_over_tls(&mut pg, &cert, &key, "host", &[]).await;
    V1Server { port, cert, _cluster: pg }
}

/// Under `prefer` (the default) and `require`, which do not verify the certificate, chime
/// connects over TLS to a server whose certificate is version 1, as psql does: OpenSSL reads
/// it. Before, with rustls, chime connected without TLS under prefer and refused under
/// require ("invalid peer certificate: UnsupportedCertVersion").
#[tokio::test]
async fn a_version_1_certificate_is_used_over_tls_under_sslmode_prefer_and_require() {
    let server = v1_server().await;
    for query in ["sslmode=prefer", "sslmode=require", ""] {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres?{query}", server.port);
        connect_over_tls(&url).await;
    }

    // A real `chime serve` starts (migrates, becomes ready) and works on it, every session
    // of it encrypted (the server would take them without TLS too).
    let db_url = format!("postgres://postgres@localhost:{}/chime?sslmode=require", server.port);
    let (_child, address) = chime_node(&db_url, &[]).await;
    let app = TestApp { address, pool: connect_over_tls(&db_url).await, db_url, client: client() };
    biz_types::create(&app.pool, "v1", &Settings { mode: Some("pull".into()), ..Settings::default() }, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "v1").await.unwrap();
    let task = app.post("/api/v1/tasks", &token, serde_json::json!({"biz_type": "v1", "key": "t-1"})).await;
    assert_eq!(task.status, 201, "{}", task.body);
    let got = app.get(&format!("/api/v1/tasks/{}", task.body["id"].as_str().unwrap()), &token).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let (sessions, plain): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE NOT ssl) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
         WHERE datname = 'chime' AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(sessions > 0 && plain == 0, "chime's sessions: {sessions}, of which {plain} without TLS");
}

/// Under `verify-ca` and `verify-full`, a version 1 certificate that sslrootcert does not
/// vouch for is refused at once (not retried for the start's 10 s), saying why (OpenSSL's
/// reason) and what to do.
#[tokio::test]
async fn a_version_1_certificate_that_cannot_be_verified_is_refused_saying_why_and_what_to_do() {
    // The TLS server's CA, which did not sign it.
    let other_ca = &server().await.ca;
    let server = v1_server().await;
    for mode in ["verify-full", "verify-ca"] {
        let url = format!("postgres://postgres@localhost:{}/postgres?sslmode={mode}&sslrootcert={}", server.port, other_ca.display());
        let started = std::time::Instant::now();
        let error = connect_error(&url).await;
        assert!(error.contains(&format!("sslmode={mode}")) && error.contains("certificate verify failed: self-signed certificate"), "{error}");
        assert!(says_what_to_do(&error) && error.contains("for a self-signed one, the certificate itself"), "{error}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused after {:?}", started.elapsed());
    }
}

/// A self-signed version 1 certificate given as its own root is trusted, as libpq trusts
/// it: verify-full connects by the name it holds, and verify-ca by any; verify-full by
/// another name is refused.
#[tokio::test]
async fn a_self_signed_version_1_certificate_is_its_own_root() {
    let server = v1_server().await;
    let root = format!("sslrootcert={}", server.cert.display());
    connect_over_tls(&format!("postgres://postgres@localhost:{}/postgres?sslmode=verify-full&{root}", server.port)).await;
    connect_over_tls(&format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-ca&{root}", server.port)).await;
    let error = connect_error(&format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&{root}", server.port)).await;
    assert!(error.contains("certificate verify failed: IP address mismatch") && says_what_to_do(&error), "{error}");
}

/// A client certificate signed by the server's CA, whose key is in the form `openssl
/// ecparam -genkey` writes (SEC 1, "BEGIN EC PRIVATE KEY"), which libpq takes: against a
/// server that authenticates by certificate only, chime signs in with it over TLS. OpenSSL
/// through native-tls takes only PKCS#8 keys ("expected PKCS#8 PEM" before chime
/// converted it), and an unreadable key file is a clear error naming `sslkey`.
#[tokio::test]
async fn a_client_certificate_with_a_sec1_key_signs_in() {
    let mut pg = embedded_pg::start_throwaway().await.expect("starting a throwaway PostgreSQL");
    let dir = pg.data_dir().join("tls");
    std::fs::create_dir(&dir).unwrap();
    let ca = make_ca(&dir, "ca");
    let (cert, key) = server_cert(&dir);
    // The client: CN is the database user, as `cert` authentication requires.
    openssl(&dir, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "client.key"]);
    assert!(std::fs::read_to_string(dir.join("client.key")).unwrap().contains("BEGIN EC PRIVATE KEY"));
    openssl(&dir, &["req", "-new", "-key", "client.key", "-out", "client.csr", "-subj", "/CN=postgres"]);
    openssl(&dir, &["x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-out", "client.crt"]);
    // Certificates only, checked against the CA.
    let more = [format!("ssl_ca_file = '{}'", ca.display())];
    let port = listen_over_tls(&mut pg, &cert, &key, "hostssl all all 127.0.0.1/32 cert", &more).await;

    let base = format!("postgres://postgres@localhost:{port}/chime?sslmode=verify-full&sslrootcert={}", ca.display());
    let without = connect_error(&base).await;
    assert!(without.contains("certificate"), "no client certificate, no session: {without}");
    let url = format!("{base}&sslcert={}&sslkey={}", dir.join("client.crt").display(), dir.join("client.key").display());
    let pool = connect_over_tls(&url).await;
    let dn: Option<String> = sqlx::query_scalar("SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(&pool).await.unwrap();
    assert_eq!(dn.as_deref(), Some("/CN=postgres"));

    let missing = connect_error(&format!("{base}&sslcert={}&sslkey={}", dir.join("client.crt").display(), dir.join("nowhere.key").display())).await;
    assert!(missing.contains("sslkey") && missing.contains("nowhere.key"), "{missing}");
}
