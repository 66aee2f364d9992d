//! RabbitMQ's own behaviour that the consumer relies on.

use std::time::Duration;

use jobguard::broker::Source;

use super::{Rabbit, Settings, TestBroker};

/// Every requeue of a failed RabbitMQ delivery counts in the quorum queue's delivery count,
/// so a message that keeps failing reaches the limit and is dead-lettered. The consumer
/// requeues with `basic.reject`: RabbitMQ 4.x no longer counts a requeued `basic.nack`, and a
/// message nacked back would come back as delivery 1 forever. (The server here is 3.10, which
/// counts both; this test pins the counting the consumer relies on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_counts_every_requeue_of_a_failing_message() {
    use jobguard::broker::Delivery;

    let Some(url) = Rabbit::url() else {
        return;
    };
    let name = &format!("counted-requeues-{}", std::process::id());
    Rabbit::reset(&url, name).await;
    let body = br#"{"kind": "credit", "key": "credit:order-1", "payload": {}}"#.to_vec();
    Rabbit::publish(&url, name, vec![body.clone()]).await;
    let settings = Settings::default();
    let mut source = Rabbit::source(&url, name, settings).await;
    let mut attempts = Vec::new();
    loop {
        let mut deliveries = tokio::time::timeout(Duration::from_secs(30), source.receive(1))
            .await
            .expect("a delivery within 30 s")
            .expect("receive");
        let Some(delivery) = deliveries.pop() else {
            continue;
        };
        assert_eq!(delivery.body(), body.as_slice());
        attempts.push(delivery.attempt());
        if delivery.attempt() >= settings.max_deliveries || attempts.len() > 10 {
            delivery
                .dead_letter("failed on the last delivery".into())
                .await
                .expect("dead-letter");
            break;
        }
        delivery.retry(Duration::ZERO).await.expect("requeue");
    }
    source.close().await;
    assert_eq!(attempts, [1, 2, 3], "each requeue counts one delivery");
    assert_eq!(Rabbit::dead_letters(&url, name).await, vec![body]);
    assert_eq!(Rabbit::left_behind(&url, name).await, 0);
    Rabbit::reset(&url, name).await;
}
