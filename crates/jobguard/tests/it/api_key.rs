//! Idempotency keys for external APIs: examples, limits, and properties of the derivation.

use std::collections::HashMap;

use jobguard::external::{ApiKey, ApiKeyFormat, KeyAlphabet};
use jobguard::{Error, JobKey, KeyError};
use proptest::prelude::*;

const ALPHABETS: [KeyAlphabet; 3] = [
    KeyAlphabet::Printable,
    KeyAlphabet::Token,
    KeyAlphabet::Alphanumeric,
];

fn formats() -> Vec<ApiKeyFormat> {
    let mut formats = vec![ApiKeyFormat::STRIPE];
    for alphabet in ALPHABETS {
        for max_len in [32, 40, 64, 255] {
            formats.push(ApiKeyFormat::new(max_len, alphabet).unwrap());
        }
    }
    formats
}

fn check(api_key: &ApiKey, format: ApiKeyFormat) {
    let text = api_key.as_str();
    assert!(!text.is_empty());
    assert!(
        text.len() <= format.max_len(),
        "{text} is longer than {}",
        format.max_len()
    );
    assert!(
        text.chars().all(|c| format.alphabet().allows(c)),
        "{text} has a character outside {:?}",
        format.alphabet()
    );
}

#[test]
fn readable_when_it_fits() {
    let key = JobKey::new("charge", ["order-8812"]).unwrap();
    let api_key = ApiKey::derive(&key, "create-charge", ApiKeyFormat::STRIPE).unwrap();
    assert_eq!(api_key.as_str(), "charge:order-8812:create-charge");
    assert_eq!(api_key.to_string(), api_key.as_str());
    let token = ApiKeyFormat::new(64, KeyAlphabet::Token).unwrap();
    assert_eq!(
        ApiKey::derive(&key, "create-charge", token).unwrap(),
        api_key
    );
}

#[test]
fn hashed_when_too_long_or_outside_the_alphabet() {
    let key = JobKey::new("charge", ["order-8812"]).unwrap();
    let strict = ApiKeyFormat::new(40, KeyAlphabet::Alphanumeric).unwrap();
    let api_key = ApiKey::derive(&key, "create-charge", strict).unwrap();
    assert_eq!(api_key.as_str().len(), 40);
    assert!(api_key.as_str().starts_with("chargeor"), "{api_key}");
    check(&api_key, strict);

    let long = JobKey::new("charge", ["x".repeat(300)]).unwrap();
    let api_key = ApiKey::derive(&long, "create-charge", ApiKeyFormat::STRIPE).unwrap();
    assert_eq!(api_key.as_str().len(), 255);
    assert!(!api_key.as_str().contains(':'));
    check(&api_key, ApiKeyFormat::STRIPE);

    let spaced = JobKey::new("email", ["hello world"]).unwrap();
    let api_key = ApiKey::derive(&spaced, "send", ApiKeyFormat::STRIPE).unwrap();
    assert!(
        api_key.as_str().starts_with("email-hello-world-send-"),
        "{api_key}"
    );
    check(&api_key, ApiKeyFormat::STRIPE);
}

#[test]
fn steps_of_one_job_get_different_keys() {
    let key = JobKey::new("order", ["8812"]).unwrap();
    for format in formats() {
        let charge = ApiKey::derive(&key, "charge", format).unwrap();
        let receipt = ApiKey::derive(&key, "receipt", format).unwrap();
        assert_ne!(charge, receipt, "{format:?}");
    }
}

#[test]
fn bad_steps_and_formats_are_typed_errors() {
    let key = JobKey::new("order", ["8812"]).unwrap();
    assert!(matches!(
        ApiKey::derive(&key, "", ApiKeyFormat::STRIPE),
        Err(KeyError::EmptyKind)
    ));
    assert!(matches!(
        ApiKey::derive(&key, "a:b", ApiKeyFormat::STRIPE),
        Err(KeyError::InvalidKind { .. })
    ));
    assert!(matches!(
        ApiKeyFormat::new(31, KeyAlphabet::Printable),
        Err(Error::ApiKeyFormat { .. })
    ));
}

fn part() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{1,12}",
        "[ -~]{1,20}",
        "\\PC{1,8}",
        "[a-z]{200,300}",
    ]
}

fn step() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_.-]{0,15}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Same inputs, same key; within every format's length and alphabet.
    #[test]
    fn deterministic_and_within_limits(
        kind in "[a-z][a-z0-9_-]{0,10}",
        parts in prop::collection::vec(part(), 1..4),
        step in step(),
    ) {
        let key = JobKey::new(&kind, &parts);
        prop_assume!(key.is_ok());
        let key = key.unwrap();
        for format in formats() {
            let first = ApiKey::derive(&key, &step, format).unwrap();
            check(&first, format);
            let again = JobKey::parse(key.as_str()).unwrap();
            prop_assert_eq!(&first, &ApiKey::derive(&again, &step, format).unwrap());
        }
    }

    /// Distinct (job key, step) pairs never share an API key, in any format.
    #[test]
    fn collision_free_on_a_corpus(
        corpus in prop::collection::vec(
            (prop::collection::vec(part(), 1..3), step()),
            50..120,
        ),
    ) {
        for format in formats() {
            let mut seen: HashMap<ApiKey, (String, String)> = HashMap::new();
            for (parts, step) in &corpus {
                let Ok(key) = JobKey::new("charge", parts) else { continue };
                let api_key = ApiKey::derive(&key, step, format).unwrap();
                let input = (key.to_string(), step.clone());
                if let Some(previous) = seen.insert(api_key.clone(), input.clone()) {
                    prop_assert_eq!(previous, input, "{} collided in {:?}", api_key, format);
                }
            }
        }
    }

    /// Keys that differ only past the length limit still differ: the hash covers everything.
    #[test]
    fn long_keys_differ_by_their_tails(prefix in "[a-z]{300}", a in "[a-z]{1,5}", b in "[a-z]{1,5}") {
        prop_assume!(a != b);
        let ka = JobKey::new("charge", [format!("{prefix}{a}")]).unwrap();
        let kb = JobKey::new("charge", [format!("{prefix}{b}")]).unwrap();
        for format in formats() {
            prop_assert_ne!(
                ApiKey::derive(&ka, "pay", format).unwrap(),
                ApiKey::derive(&kb, "pay", format).unwrap()
            );
        }
    }
}
