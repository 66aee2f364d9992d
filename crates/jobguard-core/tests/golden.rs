//! Golden vectors for the other languages' bindings: keys, fingerprints and API keys as this
//! crate computes them, in `crates/jobguard-py/tests/golden.json`, which pytest checks the
//! Python package against. `JOBGUARD_BLESS=1` rewrites the file; otherwise the file must match.

use jobguard_core::api_key::{ApiKey, ApiKeyFormat, KeyAlphabet};
use jobguard_core::fingerprint::Fingerprint;
use jobguard_core::key::JobKey;
use serde_json::{Value, json};

fn keys() -> Value {
    let long = "x".repeat(600);
    let fits = "y".repeat(512 - "k:".len());
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("credit", vec!["order-8812"]),
        ("fee", vec!["account-7", "2026-10"]),
        ("k", vec!["a:b", "c"]),
        ("k", vec!["a", "b:c"]),
        ("k", vec!["%3A", "%25", ":%", "%"]),
        ("k", vec!["100%"]),
        ("unicode", vec!["ü", "日本語", "emoji-🎉", "é:ü"]),
        ("dotted.kind-x_1", vec!["1"]),
        ("k", vec![&fits]),
        ("k", vec![&long]),
        ("", vec!["a"]),
        ("2fa", vec!["a"]),
        ("a b", vec!["a"]),
        ("k", vec![]),
        ("k", vec![""]),
        ("k", vec!["a", ""]),
        ("k", vec!["nul\0"]),
        ("kind:with:colons", vec!["a"]),
    ];
    let kind_max = "k".repeat(64);
    let kind_over = "k".repeat(65);
    let mut cases = cases;
    cases.push((&kind_max, vec!["a"]));
    cases.push((&kind_over, vec!["a"]));
    cases
        .into_iter()
        .map(|(kind, parts)| match JobKey::new(kind, &parts) {
            Ok(key) => json!({"kind": kind, "parts": parts, "encoded": key.as_str()}),
            Err(_) => json!({"kind": kind, "parts": parts, "error": true}),
        })
        .collect()
}

fn fingerprints() -> Value {
    let payloads = [
        "null",
        "true",
        "false",
        "0",
        "1",
        "-7",
        "1.5",
        "1.0",
        "0.1",
        "1e100",
        "12345678901234567",
        "\"\"",
        "\"1\"",
        "\"日本語 🎉\"",
        "[]",
        "[[]]",
        "[[], []]",
        "[\"ab\", \"c\"]",
        "[\"a\", \"bc\"]",
        "{}",
        "{\"a\": \"b\"}",
        "{\"ab\": \"\"}",
        "{\"account\": 7, \"amount\": 500}",
        "{\"amount\": 500, \"account\": 7}",
        "{\"x\": {\"b\": 1, \"a\": [{\"q\": 1, \"p\": 2}]}, \"y\": true, \"z\": null}",
        "{\"ü\": 1, \"u\": 2, \"Z\": 3}",
    ];
    payloads
        .iter()
        .map(|text| {
            let fingerprint = Fingerprint::of_json(text).expect("JSON");
            json!({"json": text, "hex": fingerprint.to_hex()})
        })
        .collect()
}

fn api_keys() -> Value {
    let alphabets = [
        ("printable", KeyAlphabet::Printable),
        ("token", KeyAlphabet::Token),
        ("alphanumeric", KeyAlphabet::Alphanumeric),
    ];
    let long = format!("import:{}", "m".repeat(400));
    let keys = [
        "charge:order-8812",
        "k:a%3Ab:c",
        "unicode:日本語",
        "k:with space",
        long.as_str(),
    ];
    let mut out = Vec::new();
    for key in keys {
        let job = JobKey::parse(key).expect("a key");
        for (name, alphabet) in alphabets {
            for max_len in [32, 40, 64, 255] {
                let format = ApiKeyFormat::new(max_len, alphabet).expect("a format");
                for step in ["create-charge", "send.receipt_2"] {
                    let derived = ApiKey::derive(&job, step, format).expect("a step");
                    out.push(json!({
                        "key": key, "step": step, "max_len": max_len, "alphabet": name,
                        "api_key": derived.as_str(),
                    }));
                }
            }
        }
    }
    Value::Array(out)
}

#[test]
fn golden_vectors_match_the_committed_file() {
    let golden = json!({
        "keys": keys(),
        "fingerprints": fingerprints(),
        "api_keys": api_keys(),
    });
    let text = serde_json::to_string_pretty(&golden).expect("JSON") + "\n";
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../jobguard-py/tests/golden.json"
    );
    if std::env::var_os("JOBGUARD_BLESS").is_some() {
        std::fs::write(path, &text).expect("write golden.json");
        return;
    }
    let committed = std::fs::read_to_string(path).expect("golden.json: run with JOBGUARD_BLESS=1");
    assert!(
        committed == text,
        "crates/jobguard-py/tests/golden.json is stale: rerun with JOBGUARD_BLESS=1"
    );
}
