//! NATS JetStream's own behaviour that the consumer relies on.

use jobguard::broker::Source;

use super::{Nats, Settings, TestBroker};

/// Consumers started together all declare the same streams at the same moment. The server may
/// refuse all but one of the creates ("subjects overlap with an existing stream") though the
/// stream each wanted then exists: every consumer must come up on it, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_started_together_all_come_up_on_one_stream() {
    let Some(url) = Nats::url() else {
        return;
    };
    for round in 0..10 {
        let name = &format!("declared-together-{}-{round}", std::process::id());
        Nats::reset(&url, name).await;
        let sources = futures::future::join_all(
            (0..8).map(|_| Nats::source(&url, name, Settings::default())),
        )
        .await;
        for source in sources {
            source.close().await;
        }
        Nats::reset(&url, name).await;
    }
}
