//! A headless Chromium driven through ChromeDriver (WebDriver), for the console's tests.
//!
//! Each [`Browser`] is its own `chromedriver` process, with its own Chromium and a fresh
//! profile directory, so tests running in parallel share nothing. The helpers panic with the
//! page's URL and part of its source when something is not there, rather than returning
//! errors: these are tests.
//!
//! Call [`Browser::close`] at the end of a test to end the session cleanly; a `Browser` that
//! is dropped instead (a failed assertion) kills ChromeDriver and Chromium outright.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// Where Debian's `chromium` and `chromium-driver` packages put them.
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Headless, as root (no sandbox), in a container (no GPU, a small /dev/shm), and quiet
/// (no first-run UI, no background requests, no extensions).
const CHROMIUM_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-extensions",
    "--window-size=1280,900",
];

/// How long ChromeDriver and Chromium may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a page may take to load, and a submitted form to leave its page.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often waits look again.
const POLL: Duration = Duration::from_millis(50);

/// One browser session: a ChromeDriver process, the Chromium it started, and a WebDriver
/// client for it.
pub struct Browser {
    client: Client,
    // Declared after the client: when dropped, ChromeDriver and Chromium are killed.
    driver: Driver,
}

/// The `chromedriver` process and the scratch directory (Chromium's profile, ChromeDriver's
/// log). ChromeDriver leads its own process group, which Chromium and its helper processes
/// inherit, so dropping this kills all of them and removes the directory.
struct Driver {
    child: Child,
    dir: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Driver {
    fn log_path(&self) -> PathBuf {
        self.dir.join("chromedriver.log")
    }

    /// The end of ChromeDriver's log, for error messages.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        format!("ChromeDriver's log ({}), last lines:\n{tail}", self.log_path().display())
    }
}

impl Browser {
    /// Starts ChromeDriver on a port of its choosing and opens a headless Chromium session.
    /// Panics if Chromium or ChromeDriver is not installed: the console tests never skip.
    pub async fn start() -> Browser {
        for path in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: the console tests drive headless Chromium through ChromeDriver; \
                 install them with `apt-get install chromium chromium-driver` (.ci/run does)"
            );
        }

        static SESSIONS: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!("chime-browser-{}-{}", std::process::id(), SESSIONS.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        let profile = dir.join("profile");
        std::fs::create_dir_all(&profile).unwrap_or_else(|e| panic!("creating {}: {e}", profile.display()));

        // --port=0: ChromeDriver binds a free port itself and prints it, so there is no
        // window in which another test could take a port we picked.
        let log = dir.join("chromedriver.log");
        let mut child = {
            use std::os::unix::process::CommandExt as _;
            Command::new(CHROMEDRIVER)
                .arg("--port=0")
                .arg(format!("--log-path={}", log.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {CHROMEDRIVER}: {e}"))
        };
        let stdout = child.stdout.take().unwrap();
        let mut driver = Driver { child, dir };

        let port = tokio::time::timeout(START_TIMEOUT, announced_port(stdout))
            .await
            .unwrap_or_else(|_| panic!("ChromeDriver did not announce its port within {START_TIMEOUT:?}"))
            .unwrap_or_else(|output| {
                let status = driver.child.try_wait().ok().flatten();
                panic!("ChromeDriver exited ({status:?}) without announcing its port; it printed:\n{output}\n{}", driver.log_tail())
            });
        let webdriver = format!("http://127.0.0.1:{port}");

        // It prints the port once it listens; still, wait until it accepts a connection.
        let deadline = Instant::now() + START_TIMEOUT;
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                panic!("ChromeDriver exited ({status}) before answering on {webdriver}\n{}", driver.log_tail());
            }
            assert!(Instant::now() < deadline, "ChromeDriver did not answer on {webdriver}\n{}", driver.log_tail());
            tokio::time::sleep(POLL).await;
        }

        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let Value::Object(capabilities) = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
            // No implicit wait: `exists` answers at once, `wait_for` polls explicitly.
            "timeouts": {
                "implicit": 0,
                "pageLoad": PAGE_TIMEOUT.as_millis() as u64,
                "script": PAGE_TIMEOUT.as_millis() as u64,
            },
        }) else {
            unreachable!()
        };
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        let client = match tokio::time::timeout(START_TIMEOUT, builder.connect(&webdriver)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => panic!("opening a Chromium session through ChromeDriver: {e}\n{}", driver.log_tail()),
            Err(_) => panic!("Chromium did not start within {START_TIMEOUT:?}\n{}", driver.log_tail()),
        };
        Browser { client, driver }
    }

    /// The WebDriver client, for what the helpers below do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Ends the session (ChromeDriver closes Chromium), then stops ChromeDriver.
    pub async fn close(self) {
        let Browser { client, driver } = self;
        if let Err(e) = client.close().await {
            panic!("closing the browser session: {e}\n{}", driver.log_tail());
        }
        drop(driver);
    }

    /// Loads a URL and waits for the page to load. A relative URL is resolved against the
    /// current page's.
    pub async fn goto(&self, url: &str) {
        let result = self.client.goto(url).await;
        self.ok(result, format!("loading {url}")).await;
    }

    pub async fn current_url(&self) -> String {
        match self.client.current_url().await {
            Ok(url) => url.to_string(),
            Err(e) => panic!("reading the current URL: {e}"),
        }
    }

    /// The page's HTML as it is now (after any scripts changed it).
    pub async fn source(&self) -> String {
        match self.client.source().await {
            Ok(source) => source,
            Err(e) => panic!("reading the page source: {e}"),
        }
    }

    /// Clears the field and types `value` into it, as a user would.
    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        let result = field.clear().await;
        self.ok(result, format!("clearing `{css}`")).await;
        let result = field.send_keys(value).await;
        self.ok(result, format!("typing into `{css}`")).await;
    }

    /// Sets the field's value directly and fires `input` and `change`, for inputs that
    /// typing does not fill predictably (date and time inputs type in the locale's order).
    pub async fn set_value(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        let script = "const f = arguments[0]; f.value = arguments[1];
            f.dispatchEvent(new Event('input', { bubbles: true }));
            f.dispatchEvent(new Event('change', { bubbles: true }));
            return f.value;";
        let result = self.client.execute(script, vec![element_arg(&field), json!(value)]).await;
        let set = self.ok(result, format!("setting the value of `{css}`")).await;
        if set != json!(value) {
            panic!("`{css}` did not take the value {value:?} (it has {set}){}", self.page_context().await);
        }
    }

    /// Chooses the `<option>` of the `<select>` whose visible text or value is `choice`.
    pub async fn select(&self, css: &str, choice: &str) {
        let select = self.find(css).await;
        let result = select.find_all(Locator::Css("option")).await;
        let options = self.ok(result, format!("listing the options of `{css}`")).await;
        let mut seen = Vec::new();
        for option in options {
            let text = option.prop("text").await.ok().flatten().unwrap_or_default();
            let value = option.prop("value").await.ok().flatten().unwrap_or_default();
            if text.trim() == choice || value == choice {
                let result = option.click().await;
                self.ok(result, format!("choosing {choice:?} in `{css}`")).await;
                return;
            }
            seen.push(format!("{text:?} (value {value:?})"));
        }
        panic!("`{css}` has no option with the text or value {choice:?}; it has: {}{}", seen.join(", "), self.page_context().await);
    }

    /// Ticks (`true`) or unticks a checkbox, clicking it only if it is not that way already.
    pub async fn check(&self, css: &str, checked: bool) {
        let checkbox = self.find(css).await;
        let result = checkbox.is_selected().await;
        if self.ok(result, format!("reading `{css}`")).await != checked {
            let result = checkbox.click().await;
            self.ok(result, format!("clicking `{css}`")).await;
            let result = checkbox.is_selected().await;
            if self.ok(result, format!("reading `{css}`")).await != checked {
                panic!("clicking `{css}` did not make it checked={checked}{}", self.page_context().await);
            }
        }
    }

    /// Clicks the first element matching `css`. ChromeDriver waits for a navigation the
    /// click starts; use [`Browser::submit`] for forms, which also waits for the new page.
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        let result = element.click().await;
        self.ok(result, format!("clicking `{css}`")).await;
    }

    /// Submits the form: clicks its submit button (or, without one, calls `requestSubmit()`,
    /// which also runs the browser's validation), then waits until the browser has left the
    /// page and the next one has loaded. Panics if the page stays: at once, naming the fields,
    /// when the browser's validation stopped the form (say, an empty `required` field); to
    /// test that validation, click the button with [`Browser::click`] instead.
    pub async fn submit(&self, form_css: &str) {
        let form = self.find(form_css).await;
        let result = form.find_all(Locator::Css("button[type=submit], button:not([type]), input[type=submit], input[type=image]")).await;
        let buttons = self.ok(result, format!("finding the submit button of `{form_css}`")).await;
        let result = match buttons.first() {
            Some(button) => button.click().await,
            None => self.client.execute("arguments[0].requestSubmit()", vec![element_arg(&form)]).await.map(drop),
        };
        self.ok(result, format!("submitting `{form_css}`")).await;

        // The old page's form goes stale once the browser has navigated away: this works
        // when the answer is at the same URL, which comparing URLs would not see.
        // Chrome sometimes reports the same thing, mid-navigation, as an "unknown error".
        let gone = |e: &CmdError| {
            let message = e.to_string();
            e.is_stale_element_reference()
                || e.is_no_such_element()
                || message.contains("does not belong to the document")
                || message.contains("frame was detached")
                || message.contains("Cannot find context")
        };
        let deadline = Instant::now() + PAGE_TIMEOUT;
        let mut validity_checked = false;
        loop {
            match form.is_enabled().await {
                Err(e) if gone(&e) => break,
                Err(e) => panic!("waiting for `{form_css}` to be submitted: {e}{}", self.page_context().await),
                Ok(_) => {}
            }
            // Still here: if the browser refused to send the form, say why at once.
            if !validity_checked {
                validity_checked = true;
                match self.client.execute(INVALID_FIELDS, vec![element_arg(&form)]).await {
                    Err(e) if gone(&e) => break,
                    Err(e) => panic!("checking `{form_css}`'s fields: {e}{}", self.page_context().await),
                    Ok(Value::Array(invalid)) if !invalid.is_empty() => panic!(
                        "the browser did not submit `{form_css}`: its validation failed: {}{}",
                        invalid.iter().map(|v| v.as_str().unwrap_or_default()).collect::<Vec<_>>().join("; "),
                        self.page_context().await
                    ),
                    Ok(_) => {}
                }
            }
            if Instant::now() >= deadline {
                panic!("submitting `{form_css}` did not leave the page within {PAGE_TIMEOUT:?}{}", self.page_context().await);
            }
            tokio::time::sleep(POLL).await;
        }
        self.wait_loaded().await;
    }

    /// The rendered text of the first element matching `css` (what a user sees: hidden
    /// elements give "").
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        let result = element.text().await;
        self.ok(result, format!("reading the text of `{css}`")).await
    }

    /// The rendered text of every element matching `css`, in document order.
    pub async fn texts(&self, css: &str) -> Vec<String> {
        // Found again when the page replaced an element between finding and reading it (the
        // dashboard swaps its table in place as it refreshes itself).
        'found: for _ in 0..5 {
            let mut texts = Vec::new();
            for element in self.find_all(css).await {
                match element.text().await {
                    Ok(text) => texts.push(text),
                    Err(e) if e.is_stale_element_reference() => continue 'found,
                    Err(e) => texts.push(self.ok(Err(e), format!("reading the text of `{css}`")).await),
                };
            }
            return texts;
        }
        panic!("the elements of `{css}` were replaced at every one of 5 readings{}", self.page_context().await)
    }

    /// Whether anything matches `css` now (no waiting).
    pub async fn exists(&self, css: &str) -> bool {
        !self.find_all(css).await.is_empty()
    }

    /// Waits until something matches `css`, looking every 50 ms; panics after `timeout`.
    pub async fn wait_for(&self, css: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.exists(css).await {
            if Instant::now() >= deadline {
                panic!("nothing matched `{css}` within {timeout:?}{}", self.page_context().await);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Presses and releases each key in turn, as a person at the keyboard would, wherever the
    /// focus is (`fantoccini::key::Key` names the special ones: `Key::Tab.into()`).
    pub async fn press(&self, keys: &[char]) {
        let mut actions = KeyActions::new("keyboard".into());
        for &key in keys {
            actions = actions.then(KeyAction::Down { value: key }).then(KeyAction::Up { value: key });
        }
        let result = self.client.perform_actions(actions).await;
        self.ok(result, format!("pressing {keys:?}")).await;
    }

    /// Runs JavaScript in the page; what it `return`s, as JSON.
    pub async fn execute(&self, script: &str) -> Value {
        let result = self.client.execute(script, Vec::new()).await;
        self.ok(result, format!("running the script {script:?}")).await
    }

    /// Saves a PNG of the viewport, creating the directory it goes in.
    pub async fn screenshot(&self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        let result = self.client.screenshot().await;
        let png = self.ok(result, "taking a screenshot".to_string()).await;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The first element matching `css`; panics, showing the page, if there is none.
    async fn find(&self, css: &str) -> Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) if e.is_no_such_element() => panic!("nothing matches `{css}`{}", self.page_context().await),
            Err(e) => panic!("looking for `{css}`: {e}{}", self.page_context().await),
        }
    }

    async fn find_all(&self, css: &str) -> Vec<Element> {
        let result = self.client.find_all(Locator::Css(css)).await;
        self.ok(result, format!("looking for `{css}`")).await
    }

    /// Waits until the current document has loaded (ChromeDriver mostly has already).
    async fn wait_loaded(&self) {
        let deadline = Instant::now() + PAGE_TIMEOUT;
        loop {
            let result = self.client.execute("return document.readyState", Vec::new()).await;
            if self.ok(result, "reading document.readyState".to_string()).await == json!("complete") {
                return;
            }
            if Instant::now() >= deadline {
                panic!("the page did not finish loading within {PAGE_TIMEOUT:?}{}", self.page_context().await);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The value, or a panic saying what failed, on which page.
    async fn ok<T>(&self, result: Result<T, CmdError>, doing: String) -> T {
        match result {
            Ok(value) => value,
            Err(e) => panic!("{doing}: {e}{}", self.page_context().await),
        }
    }

    /// The current URL and the start of the page's body, to append to a panic message.
    async fn page_context(&self) -> String {
        let url = match self.client.current_url().await {
            Ok(url) => url.to_string(),
            Err(e) => format!("(unknown: {e})"),
        };
        let source = match self.client.source().await {
            Ok(source) => source,
            Err(e) => format!("(unavailable: {e})"),
        };
        let body = source.find("<body").map_or(source.as_str(), |at| &source[at..]);
        let mut context = format!("\n  page: {url}\n  source");
        if body.len() < source.len() {
            context.push_str(" from <body>");
        }
        const LIMIT: usize = 2000;
        if body.chars().count() > LIMIT {
            let _ = write!(context, " (first {LIMIT} characters):\n{}…", body.chars().take(LIMIT).collect::<String>());
        } else {
            let _ = write!(context, ":\n{body}");
        }
        context
    }
}

/// The fields of the form `arguments[0]` that the browser's validation rejects, as
/// "name: message" (none when the form has `novalidate`).
const INVALID_FIELDS: &str = "const form = arguments[0];
    if (form.noValidate) return [];
    return Array.from(form.elements)
        .filter(f => f.willValidate && !f.validity.valid)
        .map(f => (f.name || f.id || f.tagName.toLowerCase()) + ': ' + f.validationMessage);";

/// An element as a script argument (`arguments[i]` in the page).
fn element_arg(element: &Element) -> Value {
    serde_json::to_value(element).expect("an element serializes")
}

/// Reads ChromeDriver's standard output until it says which port it listens on ("ChromeDriver
/// was started successfully on port 12345."), then keeps draining it on that thread. Err:
/// what it printed before closing its output without saying.
async fn announced_port(stdout: std::process::ChildStdout) -> Result<u16, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut printed = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.is_none() {
                continue;
            }
            let port = line
                .trim_end_matches('.')
                .rsplit_once(" on port ")
                .filter(|_| line.contains("started successfully"))
                .and_then(|(_, port)| port.trim().parse::<u16>().ok());
            match port {
                Some(port) => {
                    let _ = tx.take().unwrap().send(Ok(port));
                }
                None => {
                    printed.push_str(&line);
                    printed.push('\n');
                }
            }
        }
        if let Some(tx) = tx {
            let _ = tx.send(Err(printed));
        }
    });
    rx.await.unwrap_or_else(|_| Err("(the reading thread ended)".into()))
}
