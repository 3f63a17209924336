//! End-to-end tests of the web console: the real server, driven by a real headless Chromium
//! through ChromeDriver (see `browser.rs`; Debian's `chromium` and `chromium-driver`
//! packages, which `.ci/run` installs). These tests fail, never skip, when the browser is
//! missing.

// A toolkit: not every test uses every helper.
#[allow(dead_code)]
mod browser;
mod smoke;
