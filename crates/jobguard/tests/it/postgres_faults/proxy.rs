//! A TCP proxy in front of PostgreSQL that cuts a connection around its `COMMIT`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

/// The simple-protocol `Query` message sqlx sends to commit a transaction.
const COMMIT_QUERY: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// The server's `CommandComplete` for a commit that committed.
const COMMIT_DONE: &[u8] = b"C\0\0\0\x0bCOMMIT\0";
/// `ReadyForQuery`, idle: the server is done with the commit, whichever way it went.
const READY_IDLE: &[u8] = b"Z\0\0\0\x05I";

/// What the proxy does to the next connection that sends `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards the commit, swallows the server's answer and closes both sides once the
    /// server has answered: the commit happened, the client cannot know.
    AfterCommit,
    /// Like `AfterCommit`, then closes every other connection and every new one until
    /// [`Proxy::accept_again`]: nobody can check what happened.
    AfterCommitThenUnreachable,
    /// Forwards the commit and closes the client's side at once, while the server is still
    /// committing; the server's side stays open until the server has answered.
    CommitInFlight,
    /// Drops the commit and closes both sides: the server rolls back.
    BeforeCommit,
}

struct State {
    upstream: SocketAddr,
    armed: Mutex<Option<Fault>>,
    refuse: AtomicBool,
    fired: AtomicUsize,
    fired_notify: Notify,
    server_committed: AtomicBool,
    kill: watch::Sender<u64>,
}

pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.kill.send_modify(|generation| *generation += 1);
    }
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            armed: Mutex::new(None),
            refuse: AtomicBool::new(false),
            fired: AtomicUsize::new(0),
            fired_notify: Notify::new(),
            server_committed: AtomicBool::new(false),
            kill: watch::channel(0).0,
        });
        let accept = tokio::spawn({
            let state = Arc::clone(&state);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if state.refuse.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    tokio::spawn(serve(Arc::clone(&state), client));
                }
            }
        });
        Proxy {
            addr,
            state,
            accept,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Injects `fault` into the next `COMMIT`, once.
    pub fn arm(&self, fault: Fault) {
        *self.state.armed.lock().unwrap() = Some(fault);
    }

    pub fn disarm(&self) {
        *self.state.armed.lock().unwrap() = None;
    }

    /// Forwards new connections again after `AfterCommitThenUnreachable`.
    pub fn accept_again(&self) {
        self.state.refuse.store(false, Ordering::SeqCst);
    }

    /// Waits until the armed fault was injected and, when the commit was forwarded, the
    /// server answered it; then returns how many commits were cut.
    pub async fn fired(&self) -> usize {
        tokio::time::timeout(Duration::from_secs(10), self.state.fired_notify.notified())
            .await
            .expect("the proxy never cut a commit");
        self.state.fired.load(Ordering::SeqCst)
    }

    /// Whether the server answered a cut commit with `COMMIT`.
    pub fn server_committed(&self) -> bool {
        self.state.server_committed.load(Ordering::SeqCst)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

async fn serve(state: Arc<State>, client: TcpStream) {
    let Ok(server) = TcpStream::connect(state.upstream).await else {
        return;
    };
    let mut kill = state.kill.subscribe();
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let mut up = vec![0_u8; 64 * 1024];
    let mut down = vec![0_u8; 64 * 1024];
    loop {
        tokio::select! {
            read = client_rd.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                let chunk = &up[..n];
                if contains(chunk, COMMIT_QUERY) {
                    let fault = state.armed.lock().unwrap().take();
                    if let Some(fault) = fault {
                        let client = (client_rd, client_wr);
                        cut(&state, fault, chunk, client, server_rd, server_wr).await;
                        return;
                    }
                }
                if server_wr.write_all(chunk).await.is_err() {
                    return;
                }
            }
            read = server_rd.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if client_wr.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
            _ = kill.changed() => return,
        }
    }
}

/// Injects `fault` into a connection whose client just sent `commit`; closes both sides.
async fn cut(
    state: &State,
    fault: Fault,
    commit: &[u8],
    client: (OwnedReadHalf, OwnedWriteHalf),
    mut server_rd: OwnedReadHalf,
    mut server_wr: OwnedWriteHalf,
) {
    if fault != Fault::BeforeCommit {
        server_wr
            .write_all(commit)
            .await
            .expect("forward the commit");
        if fault == Fault::CommitInFlight {
            drop(client);
        }
        // Swallow the server's answer; wait until it is complete, so the commit is done.
        let mut answer = Vec::new();
        let mut buf = [0_u8; 4096];
        let answered = tokio::time::timeout(Duration::from_secs(10), async {
            while !contains(&answer, READY_IDLE) {
                match server_rd.read(&mut buf).await {
                    Ok(n @ 1..) => answer.extend_from_slice(&buf[..n]),
                    _ => return,
                }
            }
        })
        .await;
        assert!(answered.is_ok(), "the server did not answer the commit");
        state
            .server_committed
            .store(contains(&answer, COMMIT_DONE), Ordering::SeqCst);
    }
    if fault == Fault::AfterCommitThenUnreachable {
        state.refuse.store(true, Ordering::SeqCst);
        state.kill.send_modify(|generation| *generation += 1);
    }
    state.fired.fetch_add(1, Ordering::SeqCst);
    state.fired_notify.notify_one();
    // Dropping the halves closes both sides (the client's is already closed when the
    // commit was left in flight).
}
