//! The provider over real loopback HTTP: a started server and [`ProviderClient`].

use std::sync::Arc;
use std::time::Duration;

use jobguard_provider::{Provider, ProviderClient, ProviderConfig, ProviderError, RunningProvider};
use serde_json::json;
use tokio::sync::Barrier;

async fn start() -> (RunningProvider, ProviderClient) {
    start_with(ProviderConfig::default()).await
}

async fn start_with(config: ProviderConfig) -> (RunningProvider, ProviderClient) {
    let running = Provider::start(config).await.expect("bind a loopback port");
    let client = ProviderClient::new(running.url());
    (running, client)
}

fn with_latency(latency: Duration) -> ProviderConfig {
    ProviderConfig {
        latency,
        ..ProviderConfig::default()
    }
}

#[tokio::test]
async fn health_answers_ok() {
    let (running, _) = start().await;
    let response = reqwest::get(format!("{}/health", running.url()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok");
    running.stop().await;
}

#[tokio::test]
async fn the_same_key_and_params_replay_the_original_charge() {
    let (running, client) = start().await;

    let first = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();
    let again = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();

    assert_eq!(first, again);
    assert_eq!(first.id, "ch_000001");
    assert_eq!(first.order, "order-1");
    assert_eq!(first.amount, 500);
    assert_eq!(first.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(running.provider().charges(), vec![first.clone()]);
    assert_eq!(client.charges().await.unwrap(), vec![first]);
    running.stop().await;
}

#[tokio::test]
async fn a_replay_is_marked_with_the_idempotent_replayed_header() {
    let (running, _) = start().await;
    let http = reqwest::Client::new();
    let send = || {
        http.post(format!("{}/v1/charges", running.url()))
            .header("Idempotency-Key", "key-1")
            .json(&json!({"order": "order-1", "amount": 500}))
            .send()
    };

    let first = send().await.unwrap();
    assert!(first.status().is_success());
    assert!(first.headers().get("idempotent-replayed").is_none());
    let replay = send().await.unwrap();
    assert!(replay.status().is_success());
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(running.provider().charges().len(), 1);
    running.stop().await;
}

#[tokio::test]
async fn a_key_reused_with_other_params_is_refused_and_charges_nothing() {
    let (running, client) = start().await;
    let first = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();

    let other_amount = client.create_charge("order-1", 700, Some("key-1")).await;
    let other_order = client.create_charge("order-2", 500, Some("key-1")).await;

    for result in [other_amount, other_order] {
        let error = result.unwrap_err();
        assert!(
            matches!(&error, ProviderError::KeyReused { key } if key == "key-1"),
            "{error:?}"
        );
        assert!(!error.is_retryable());
    }
    assert_eq!(running.provider().charges(), vec![first]);
    running.stop().await;
}

#[tokio::test]
async fn concurrent_requests_with_one_key_create_one_charge() {
    const REQUESTS: usize = 5;
    let (running, client) = start_with(with_latency(Duration::from_secs(1))).await;
    let barrier = Arc::new(Barrier::new(REQUESTS));

    let mut tasks = Vec::new();
    for _ in 0..REQUESTS {
        let client = client.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client.create_charge("order-1", 500, Some("key-1")).await
        }));
    }
    let mut created = Vec::new();
    let mut in_flight = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(charge) => created.push(charge),
            Err(ProviderError::InFlight) => in_flight += 1,
            Err(error) => panic!("unexpected error: {error:?}"),
        }
    }

    assert_eq!(created.len(), 1, "exactly one request processes the key");
    assert_eq!(in_flight, REQUESTS - 1);
    assert_eq!(running.provider().charges(), created);
    // Once the first request has finished, a retry gets its charge back.
    let retry = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();
    assert_eq!(retry, created[0]);
    assert_eq!(running.provider().charges().len(), 1);
    running.stop().await;
}

#[tokio::test]
async fn requests_without_a_key_charge_every_time() {
    let (running, client) = start().await;

    let first = client.create_charge("order-1", 500, None).await.unwrap();
    let second = client.create_charge("order-1", 500, None).await.unwrap();

    assert_ne!(first.id, second.id);
    assert_eq!(running.provider().charges(), vec![first, second]);
    running.stop().await;
}

#[tokio::test]
async fn the_keyless_api_charges_every_time_and_ignores_a_key() {
    let (running, client) = start().await;

    let first = client.create_charge_keyless("order-1", 500).await.unwrap();
    let second = client.create_charge_keyless("order-1", 500).await.unwrap();
    let with_key = reqwest::Client::new()
        .post(format!("{}/v1/legacy/charges", running.url()))
        .header("Idempotency-Key", "key-1")
        .json(&json!({"order": "order-1", "amount": 500}))
        .send()
        .await
        .unwrap();
    assert!(with_key.status().is_success());

    let charges = running.provider().charges();
    assert_eq!(charges.len(), 3);
    assert_eq!(charges[..2], [first.clone(), second.clone()]);
    let ids: Vec<&str> = charges.iter().map(|charge| charge.id.as_str()).collect();
    assert_eq!(ids, ["ch_000001", "ch_000002", "ch_000003"]);
    assert!(
        charges
            .iter()
            .all(|charge| charge.idempotency_key.is_none())
    );
    running.stop().await;
}

#[tokio::test]
async fn find_charges_returns_the_charges_of_one_order() {
    let (running, client) = start().await;
    let a1 = client.create_charge_keyless("order-a", 100).await.unwrap();
    let b1 = client
        .create_charge("order-b", 200, Some("key-b"))
        .await
        .unwrap();
    let a2 = client.create_charge("order-a", 300, None).await.unwrap();

    assert_eq!(
        client.find_charges("order-a").await.unwrap(),
        vec![a1.clone(), a2.clone()]
    );
    assert_eq!(
        client.find_charges("order-b").await.unwrap(),
        vec![b1.clone()]
    );
    assert_eq!(client.find_charges("order-c").await.unwrap(), vec![]);
    assert_eq!(client.charges().await.unwrap(), vec![a1, b1, a2]);
    running.stop().await;
}

#[tokio::test]
async fn find_charges_encodes_the_order() {
    let (running, client) = start().await;
    let charge = client
        .create_charge("order 1&x=y", 100, None)
        .await
        .unwrap();
    assert_eq!(
        client.find_charges("order 1&x=y").await.unwrap(),
        vec![charge]
    );
    running.stop().await;
}

#[tokio::test]
async fn an_unavailable_lookup_answers_503_but_listing_still_works() {
    let (running, client) = start().await;
    let charge = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();

    running.provider().set_lookup_available(false);
    let error = client.find_charges("order-1").await.unwrap_err();
    assert!(
        matches!(error, ProviderError::Unavailable { status: 503 }),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert_eq!(client.charges().await.unwrap(), vec![charge.clone()]);

    running.provider().set_lookup_available(true);
    assert_eq!(client.find_charges("order-1").await.unwrap(), vec![charge]);
    running.stop().await;
}

#[tokio::test]
async fn invalid_charges_are_rejected_with_400_and_charge_nothing() {
    let (running, client) = start().await;
    let too_long = "k".repeat(256);
    let attempts = [
        client.create_charge("", 500, Some("key-1")).await,
        client.create_charge("order-1", 0, Some("key-1")).await,
        client.create_charge("order-1", -5, None).await,
        client.create_charge_keyless("order-1", 0).await,
        client.create_charge("order-1", 500, Some("")).await,
        client.create_charge("order-1", 500, Some(&too_long)).await,
    ];
    for attempt in attempts {
        let error = attempt.unwrap_err();
        assert!(
            matches!(error, ProviderError::Rejected { status: 400, .. }),
            "{error:?}"
        );
        assert!(!error.is_retryable());
    }
    let not_json = reqwest::Client::new()
        .post(format!("{}/v1/charges", running.url()))
        .body("order=1")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);
    assert!(running.provider().charges().is_empty());

    // Rejected requests did not claim the key, and the longest allowed key works.
    let longest = "k".repeat(255);
    client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();
    client
        .create_charge("order-1", 500, Some(&longest))
        .await
        .unwrap();
    assert_eq!(running.provider().charges().len(), 2);
    running.stop().await;
}

#[tokio::test]
async fn an_abandoned_request_charges_nothing_and_frees_its_key() {
    let latency = Duration::from_millis(500);
    let (running, client) = start_with(with_latency(latency)).await;

    // The client gives up while the provider is still processing: the request future is dropped
    // and its connection closed.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        client.create_charge("order-1", 500, Some("key-1")),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the request should still have been in flight"
    );

    // Long after the request would have finished, nothing was charged.
    tokio::time::sleep(latency * 3).await;
    assert_eq!(running.provider().charges(), vec![]);

    // The key is not stuck in flight: a retry with it creates the one charge.
    let charge = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap();
    assert_eq!(charge.idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(running.provider().charges(), vec![charge]);
    running.stop().await;
}

#[tokio::test]
async fn an_abandoned_keyless_request_charges_nothing() {
    let latency = Duration::from_millis(500);
    let (running, client) = start_with(with_latency(latency)).await;

    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        client.create_charge_keyless("order-1", 500),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the request should still have been in flight"
    );
    tokio::time::sleep(latency * 3).await;
    assert_eq!(running.provider().charges(), vec![]);
    running.stop().await;
}

#[tokio::test]
async fn webhooks_are_recorded_in_arrival_order_with_their_keys() {
    let (running, client) = start().await;

    client
        .send_webhook(
            "charge.succeeded",
            &json!({"order": "order-1"}),
            Some("wh-1"),
        )
        .await
        .unwrap();
    client
        .send_webhook("order paid/1", &json!({"order": "order-2"}), None)
        .await
        .unwrap();

    let webhooks = running.provider().webhooks();
    assert_eq!(webhooks.len(), 2);
    assert_eq!(webhooks[0].topic, "charge.succeeded");
    assert_eq!(webhooks[0].idempotency_key.as_deref(), Some("wh-1"));
    assert_eq!(webhooks[0].body, json!({"order": "order-1"}));
    assert_eq!(webhooks[1].topic, "order paid/1");
    assert_eq!(webhooks[1].idempotency_key, None);
    assert_eq!(webhooks[1].body, json!({"order": "order-2"}));
    assert_eq!(client.webhooks().await.unwrap(), webhooks);
    running.stop().await;
}

#[tokio::test]
async fn failing_webhooks_answer_503_until_the_budget_is_spent() {
    let (running, client) = start().await;
    running.provider().fail_next_webhooks(2);

    for _ in 0..2 {
        let error = client
            .send_webhook("charge.succeeded", &json!({"n": 1}), Some("wh-1"))
            .await
            .unwrap_err();
        assert!(
            matches!(error, ProviderError::Unavailable { status: 503 }),
            "{error:?}"
        );
        assert!(error.is_retryable());
    }
    assert_eq!(running.provider().webhooks(), vec![]);

    client
        .send_webhook("charge.succeeded", &json!({"n": 1}), Some("wh-1"))
        .await
        .unwrap();
    let webhooks = running.provider().webhooks();
    assert_eq!(webhooks.len(), 1);
    assert_eq!(webhooks[0].idempotency_key.as_deref(), Some("wh-1"));
    running.stop().await;
}

#[tokio::test]
async fn a_poison_webhook_is_rejected_with_422_and_not_recorded() {
    let (running, client) = start().await;

    let error = client
        .send_webhook("charge.succeeded", &json!({"reject": true}), Some("wh-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::Rejected { status: 422, .. }),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    // `reject` must be the boolean `true` to poison a message.
    client
        .send_webhook("charge.succeeded", &json!({"reject": "no"}), None)
        .await
        .unwrap();
    assert_eq!(running.provider().webhooks().len(), 1);
    running.stop().await;
}

#[tokio::test]
async fn a_webhook_that_is_not_json_is_rejected_with_400() {
    let (running, client) = start().await;
    let response = reqwest::Client::new()
        .post(format!("{}/v1/webhooks/charge.succeeded", running.url()))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(client.webhooks().await.unwrap().is_empty());
    running.stop().await;
}

#[tokio::test]
async fn webhook_latency_delays_but_records() {
    let config = ProviderConfig {
        webhook_latency: Duration::from_millis(50),
        ..ProviderConfig::default()
    };
    let (running, client) = start_with(config).await;
    client.send_webhook("t", &json!({}), None).await.unwrap();
    assert_eq!(running.provider().webhooks().len(), 1);
    running.stop().await;
}

#[tokio::test]
async fn a_stopped_provider_is_a_retryable_transport_error() {
    let (running, client) = start().await;
    running.stop().await;

    let error = client
        .create_charge("order-1", 500, Some("key-1"))
        .await
        .unwrap_err();
    assert!(matches!(error, ProviderError::Transport(_)), "{error:?}");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn dropping_a_running_provider_shuts_it_down() {
    let (running, _) = start().await;
    let url = running.url();
    drop(running);

    // Shutdown is signalled, not awaited; give the server task time to finish.
    let mut attempts = 0;
    loop {
        let client = ProviderClient::new(url.clone());
        match client.charges().await {
            Err(ProviderError::Transport(_)) => break,
            other => {
                attempts += 1;
                assert!(attempts < 100, "the server still answers: {other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_provider_serves_on_a_listener_of_its_own() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let provider = Provider::new(ProviderConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(provider.clone().serve(listener, async {
        let _ = stopped.await;
    }));

    let charge = ProviderClient::new(url)
        .create_charge("order-1", 1, None)
        .await
        .unwrap();
    assert_eq!(provider.charges(), vec![charge]);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// Stripe forgets idempotency keys after 24 hours; with a key time to live the provider does
/// too: within it a repeat gets the original charge, after it the same request charges again.
#[tokio::test]
async fn a_key_past_its_time_to_live_charges_again() {
    let ttl = Duration::from_secs(3);
    let (running, client) = start_with(ProviderConfig {
        key_ttl: Some(ttl),
        ..ProviderConfig::default()
    })
    .await;
    let first = client
        .create_charge("order-1", 500, Some("charge:order-1"))
        .await
        .unwrap();
    let again = client
        .create_charge("order-1", 500, Some("charge:order-1"))
        .await
        .unwrap();
    assert_eq!(
        first.id, again.id,
        "within the time to live: the original charge"
    );

    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    let late = client
        .create_charge("order-1", 500, Some("charge:order-1"))
        .await
        .unwrap();
    assert_ne!(late.id, first.id, "the key was forgotten: a second charge");
    assert_eq!(running.provider().charges().len(), 2);
    running.stop().await;
}
