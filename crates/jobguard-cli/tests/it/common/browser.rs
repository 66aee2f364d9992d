//! A headless Chromium driven over WebDriver with fantoccini, for the dashboard's test: Debian's
//! chromium and chromedriver, found or installed when running as root; every process killed
//! when dropped. The tests are plain `#[test]`s, so the session's calls block, on a runtime the
//! driver keeps (fantoccini's session runs as a task on it).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use super::free_port;

/// The longest any wait on the browser may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);

/// Chromium and chromedriver from Debian: found, installed when running as root, or the test
/// is skipped (and fails on CI).
pub struct Browser {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

impl Browser {
    pub fn find() -> Option<Browser> {
        // scripts/test exports where it found or installed them.
        let found = || {
            let named = |var: &str| std::env::var_os(var).map(PathBuf::from);
            Some(Browser {
                chromium: named("JOBGUARD_TEST_CHROMIUM")
                    .or_else(|| which("chromium"))
                    .or_else(|| which("chromium-browser"))?,
                chromedriver: named("JOBGUARD_TEST_CHROMEDRIVER")
                    .or_else(|| which("chromedriver"))?,
            })
        };
        if let Some(browser) = found() {
            return Some(browser);
        }
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
        if root {
            eprintln!("installing Debian's chromium and chromium-driver for the browser test");
            let installed = Command::new("apt-get")
                .args(["install", "-y", "-q", "chromium", "chromium-driver"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|status| status.success())
                || (Command::new("apt-get")
                    .args(["update", "-q"])
                    .status()
                    .is_ok_and(|status| status.success())
                    && Command::new("apt-get")
                        .args(["install", "-y", "-q", "chromium", "chromium-driver"])
                        .env("DEBIAN_FRONTEND", "noninteractive")
                        .status()
                        .is_ok_and(|status| status.success()));
            if installed && let Some(browser) = found() {
                return Some(browser);
            }
        }
        jobguard_testsupport::skip(
            "chromium and chromedriver are missing and could not be installed",
            "as root: apt-get install chromium chromium-driver",
        )
    }

    pub fn start(&self) -> Driver {
        let port = free_port();
        let profile = std::env::temp_dir().join(format!(
            "jobguard-serve-chromium-{}-{port}",
            std::process::id()
        ));
        let child = Command::new(&self.chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            chromium: self.chromium.clone(),
            profile,
            browser: Mutex::new(None),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime"),
        };
        let started = Instant::now();
        while !driver.ready() {
            assert!(started.elapsed() < DEADLINE, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        driver
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// A running chromedriver, killed (with its browsers) when dropped.
pub struct Driver {
    child: Child,
    base: String,
    chromium: PathBuf,
    profile: PathBuf,
    /// The browser's process, killed with the driver in case the session could not close it.
    browser: Mutex<Option<u32>>,
    /// Where the sessions' calls run, and fantoccini's task for each session with them.
    rt: tokio::runtime::Runtime,
}

impl Driver {
    pub fn session(&self) -> Session<'_> {
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,1500",
                    format!("--user-data-dir={}", self.profile.display()),
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("an object")
        };
        // Plain HTTP to the chromedriver on localhost: no TLS, so no second crypto provider.
        let client = self
            .block_on(
                ClientBuilder::new(HttpConnector::new())
                    .capabilities(capabilities)
                    .connect(&self.base),
            )
            .unwrap_or_else(|error| panic!("no WebDriver session: {error}"));
        if let Some(pid) = client
            .capabilities()
            .and_then(|capabilities| capabilities.get("goog:processID")?.as_u64())
        {
            *self.browser.lock().unwrap() = Some(pid as u32);
        }
        Session {
            driver: self,
            client: Some(client),
        }
    }

    pub fn ready(&self) -> bool {
        self.block_on(async {
            let Ok(response) = reqwest::get(format!("{}/status", self.base)).await else {
                return false;
            };
            let status: Value = response.json().await.unwrap_or(Value::Null);
            status["value"]["ready"] == true
        })
    }

    fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.rt
            .block_on(async { tokio::time::timeout(DEADLINE, future).await })
            .expect("the browser answered in time")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(pid) = *self.browser.lock().unwrap() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// A WebDriver session: one headless Chromium, closed when dropped.
pub struct Session<'d> {
    driver: &'d Driver,
    /// `None` once closed.
    client: Option<Client>,
}

impl Session<'_> {
    fn client(&self) -> &Client {
        self.client.as_ref().expect("the session is open")
    }

    /// Runs a WebDriver command that must succeed.
    fn run<T>(&self, what: &str, command: impl Future<Output = Result<T, CmdError>>) -> T {
        self.driver
            .block_on(command)
            .unwrap_or_else(|error| panic!("WebDriver {what} failed: {error}"))
    }

    pub fn navigate(&self, url: &str) {
        self.run("navigate", self.client().goto(url));
    }

    pub fn script(&self, script: &str) -> Value {
        self.run("script", self.client().execute(script, Vec::new()))
    }

    pub fn wait_for_script(
        &self,
        what: &str,
        script: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let started = Instant::now();
        loop {
            let value = self.script(script);
            if done(&value) {
                return value;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "gave up waiting for {what} in the browser: {value}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the element matching `css` with a real pointer click, found again (and clicked
    /// again) if the dashboard re-rendered it in between.
    pub fn click(&self, css: &str) {
        self.retry(css, "click", |client| async move {
            client.find(Locator::Css(css)).await?.click().await
        });
    }

    /// Types `text` into the element matching `css`, found again if the page re-rendered it.
    pub fn type_into(&self, css: &str, text: &str) {
        self.retry(css, "type into", |client| async move {
            client.find(Locator::Css(css)).await?.send_keys(text).await
        });
    }

    /// Runs `action` on the element matching `css` until it succeeds: the element may not be
    /// rendered yet, or be replaced by a re-render between finding and acting.
    fn retry<'c, F>(&'c self, css: &str, what: &str, action: impl Fn(&'c Client) -> F)
    where
        F: Future<Output = Result<(), CmdError>>,
    {
        let started = Instant::now();
        loop {
            let Err(error) = self.driver.block_on(action(self.client())) else {
                return;
            };
            assert!(started.elapsed() < DEADLINE, "cannot {what} {css}: {error}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn screenshot(&self, path: &Path) {
        let png = self.run("screenshot", self.client().screenshot());
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // No panic here: the test may be failing already.
            let closed = async { tokio::time::timeout(DEADLINE, client.close()).await };
            let _ = self.driver.rt.block_on(closed);
        }
    }
}
