//! A headless Chromium driven over WebDriver, for the dashboard's test: Debian's chromium and
//! chromedriver, found or installed when running as root; every process killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::{block_on, free_port};

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
}

impl Driver {
    pub fn session(&self) -> Session<'_> {
        let capabilities = json!({"capabilities": {"alwaysMatch": {
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
        }}});
        let created = webdriver(
            "POST",
            &format!("{}/session", self.base),
            Some(&capabilities),
        );
        let session = &created["value"];
        if let Some(pid) = session["capabilities"]["goog:processID"].as_u64() {
            *self.browser.lock().unwrap() = Some(pid as u32);
        }
        let id = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {created}"))
            .to_owned();
        Session { driver: self, id }
    }
}

impl Driver {
    pub fn ready(&self) -> bool {
        block_on(async {
            let Ok(response) = reqwest::get(format!("{}/status", self.base)).await else {
                return false;
            };
            let status: Value = response.json().await.unwrap_or(Value::Null);
            status["value"]["ready"] == true
        })
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
    id: String,
}

impl Session<'_> {
    pub fn url(&self, path: &str) -> String {
        format!("{}/session/{}{path}", self.driver.base, self.id)
    }

    pub fn navigate(&self, url: &str) {
        webdriver("POST", &self.url("/url"), Some(&json!({"url": url})));
    }

    pub fn script(&self, script: &str) -> Value {
        webdriver(
            "POST",
            &self.url("/execute/sync"),
            Some(&json!({"script": script, "args": []})),
        )["value"]
            .clone()
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

    /// The element matching `css`, found again if the page re-rendered it.
    pub fn element(&self, css: &str) -> String {
        let started = Instant::now();
        loop {
            let found = webdriver_answer(
                "POST",
                &self.url("/element"),
                Some(&json!({"using": "css selector", "value": css})),
            );
            if let Some(id) = found["value"]
                .as_object()
                .and_then(|element| element.values().next())
                .and_then(Value::as_str)
            {
                return id.to_owned();
            }
            assert!(started.elapsed() < DEADLINE, "no element {css}: {found}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the element matching `css` with a real pointer click, again if the dashboard
    /// re-rendered it in between.
    pub fn click(&self, css: &str) {
        let started = Instant::now();
        loop {
            let element = self.element(css);
            let clicked = webdriver_answer(
                "POST",
                &self.url(&format!("/element/{element}/click")),
                Some(&json!({})),
            );
            if clicked["value"].is_null() {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "cannot click {css}: {clicked}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.element(css);
        webdriver(
            "POST",
            &self.url(&format!("/element/{element}/value")),
            Some(&json!({"text": text})),
        );
    }

    pub fn screenshot(&self, path: &Path) {
        let encoded = webdriver("GET", &self.url("/screenshot"), None)["value"]
            .as_str()
            .expect("a base64 screenshot")
            .to_owned();
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("valid base64");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = webdriver_answer("DELETE", &self.url(""), None);
    }
}

/// A WebDriver command that must succeed.
fn webdriver(method: &str, url: &str, body: Option<&Value>) -> Value {
    let answer = webdriver_answer(method, url, body);
    assert!(
        answer["value"].get("error").is_none(),
        "WebDriver {method} {url} failed: {answer}"
    );
    answer
}

/// A WebDriver command's answer, errors included.
fn webdriver_answer(method: &str, url: &str, body: Option<&Value>) -> Value {
    block_on(async {
        let client = reqwest::Client::new();
        let request = match method {
            "POST" => client.post(url).json(body.unwrap_or(&json!({}))),
            "DELETE" => client.delete(url),
            _ => client.get(url),
        };
        let response = request
            .timeout(DEADLINE)
            .send()
            .await
            .expect("reach chromedriver");
        response.json().await.unwrap_or(Value::Null)
    })
}
