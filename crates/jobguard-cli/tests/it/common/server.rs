//! A running `jobguard serve` for the tests that talk to it over HTTP, and the requests they
//! send.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::{Db, block_on};

/// The longest a server may take to start before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);

/// A running `jobguard serve`, killed when dropped. Its stdout and stderr are collected.
pub struct Server {
    child: Child,
    /// Where to reach it: 127.0.0.1 and the port it bound.
    pub base: String,
    output: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(db: &Db, args: &[&str], env: &[(&str, &str)]) -> Server {
        let bind: &[&str] = if args.contains(&"--bind") {
            &[]
        } else {
            &["--bind", "127.0.0.1:0"]
        };
        let mut command = db.command(&[&["serve"][..], bind, args].concat());
        command
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start jobguard serve");
        let output = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().unwrap();
        let collected = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = BufReader::new(stdout).read_to_string(&mut text);
            collected.lock().unwrap().push_str(&text);
        });
        let (found, port) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let collected = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let address = rest.split_whitespace().next().unwrap_or("");
                    let port = address.rsplit(':').next().unwrap_or("").to_owned();
                    let _ = found.send(port);
                }
                let mut output = collected.lock().unwrap();
                output.push_str(&line);
                output.push('\n');
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            output,
        };
        match port.recv_timeout(DEADLINE) {
            Ok(port) => server.base = format!("http://127.0.0.1:{port}"),
            Err(_) => panic!(
                "jobguard serve did not start: {}",
                server.output.lock().unwrap()
            ),
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Stops the server and returns everything it printed.
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The reader threads finish once the pipes close.
        std::thread::sleep(Duration::from_millis(200));
        self.output.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

pub fn request(method: &str, url: &str, token: Option<&str>) -> Answer {
    request_with(method, url, token, &[])
}

/// [`request`] with more headers, such as the `Origin` a browser sends.
pub fn request_with(
    method: &str,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    block_on(async {
        let client = reqwest::Client::new();
        let mut request = match method {
            "POST" => client.post(url),
            "DELETE" => client.delete(url),
            _ => client.get(url),
        };
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("reach jobguard serve");
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        }
    })
}

pub fn get(url: &str, token: Option<&str>) -> Answer {
    request("GET", url, token)
}
