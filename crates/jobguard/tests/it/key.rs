//! Tests for job keys: examples, every error, serde, and properties of the encoding.

use jobguard::key::{MAX_KEY_LEN, MAX_KIND_LEN};
use jobguard::{JobKey, KeyError};
use proptest::prelude::*;

fn key(kind: &str, parts: &[&str]) -> JobKey {
    JobKey::new(kind, parts).unwrap()
}

/// A straightforward re-implementation of the documented encoding, without any validation.
fn reference_encode(kind: &str, parts: &[String]) -> String {
    let mut out = kind.to_owned();
    for part in parts {
        out.push(':');
        out.push_str(&part.replace('%', "%25").replace(':', "%3A"));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Examples
// ---------------------------------------------------------------------------------------------

#[test]
fn credit_example() {
    let k = key("credit", &["order-8812"]);
    assert_eq!(k.as_str(), "credit:order-8812");
    assert_eq!(k.to_string(), "credit:order-8812");
    assert_eq!(format!("{k:?}"), r#"JobKey("credit:order-8812")"#);
    assert_eq!(k.kind(), "credit");
    assert_eq!(k.parts(), ["order-8812"]);
    let s: &str = k.as_ref();
    assert_eq!(s, "credit:order-8812");
    assert_eq!(k.clone().into_string(), "credit:order-8812");
    assert_eq!(String::from(k), "credit:order-8812");
}

#[test]
fn monthly_fee_example() {
    let k = key("fee", &["account-7", "2026-10"]);
    assert_eq!(k.as_str(), "fee:account-7:2026-10");
    assert_eq!(k.kind(), "fee");
    assert_eq!(k.parts(), ["account-7", "2026-10"]);
    assert_ne!(k, key("fee", &["account-7", "2026-11"]));
    assert_eq!("fee:account-7:2026-10".parse::<JobKey>().unwrap(), k);
    assert_eq!(JobKey::try_from("fee:account-7:2026-10").unwrap(), k);
    assert_eq!(
        JobKey::try_from(String::from("fee:account-7:2026-10")).unwrap(),
        k
    );
}

#[test]
fn new_accepts_owned_and_borrowed_parts() {
    let owned = vec![String::from("account-7"), String::from("2026-10")];
    let from_vec = JobKey::new("fee", owned.clone()).unwrap();
    let from_slice = JobKey::new("fee", &owned).unwrap();
    let from_iter = JobKey::new("fee", owned.iter().map(String::as_str)).unwrap();
    assert_eq!(from_vec, from_slice);
    assert_eq!(from_vec, from_iter);
}

#[test]
fn kind_allows_identifier_characters() {
    let k = key("Billing.fee_v2-monthly", &["x"]);
    assert_eq!(k.kind(), "Billing.fee_v2-monthly");
    assert_eq!(
        key(&"a".repeat(MAX_KIND_LEN), &["x"]).kind().len(),
        MAX_KIND_LEN
    );
}

#[test]
fn parts_may_be_any_unicode() {
    let k = key("greet", &["crédit", "日本語", "a b", "🦀", "\t"]);
    assert_eq!(k.as_str(), "greet:crédit:日本語:a b:🦀:\t");
    assert_eq!(k.parts(), ["crédit", "日本語", "a b", "🦀", "\t"]);
}

#[test]
fn separator_in_parts_is_unambiguous() {
    let a = key("k", &["a:b", "c"]);
    let b = key("k", &["a", "b:c"]);
    assert_eq!(a.as_str(), "k:a%3Ab:c");
    assert_eq!(b.as_str(), "k:a:b%3Ac");
    assert_ne!(a, b);
    assert_eq!(a.parts(), ["a:b", "c"]);
    assert_eq!(b.parts(), ["a", "b:c"]);
    // A single part equal to the joined parts is different again.
    let c = key("k", &["a:b:c"]);
    assert_eq!(c.as_str(), "k:a%3Ab%3Ac");
    assert_ne!(a, c);
    assert_ne!(b, c);
}

#[test]
fn percent_in_parts_is_unambiguous() {
    // Without escaping `%`, the part "%3A" would read back as ":".
    let literal = key("k", &["%3A"]);
    let colon = key("k", &[":"]);
    assert_eq!(literal.as_str(), "k:%253A");
    assert_eq!(colon.as_str(), "k:%3A");
    assert_ne!(literal, colon);
    assert_eq!(literal.parts(), ["%3A"]);
    assert_eq!(colon.parts(), [":"]);
    let percent = key("k", &["100%", "%"]);
    assert_eq!(percent.as_str(), "k:100%25:%25");
    assert_eq!(percent.parts(), ["100%", "%"]);
}

#[test]
fn equality_and_ordering_follow_the_encoded_form() {
    let mut keys = [
        key("b", &["1"]),
        key("a", &["2"]),
        key("a", &["1", "x"]),
        key("a", &["1"]),
    ];
    keys.sort();
    let encoded: Vec<&str> = keys.iter().map(JobKey::as_str).collect();
    assert_eq!(encoded, ["a:1", "a:1:x", "a:2", "b:1"]);
    let set: std::collections::HashSet<JobKey> = [
        key("a", &["1"]),
        key("a", &["1"]),
        JobKey::parse("a:1").unwrap(),
    ]
    .into();
    assert_eq!(set.len(), 1);
}

#[test]
fn max_length_key_is_accepted() {
    let part = "x".repeat(MAX_KEY_LEN - "k:".len());
    let k = key("k", &[part.as_str()]);
    assert_eq!(k.as_str().len(), MAX_KEY_LEN);
    assert_eq!(JobKey::parse(k.as_str()).unwrap(), k);
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[test]
fn nul_in_kind() {
    assert_eq!(JobKey::new("cre\0dit", ["x"]), Err(KeyError::NulByte));
    assert_eq!(JobKey::parse("cre\0dit:x"), Err(KeyError::NulByte));
}

#[test]
fn nul_in_part() {
    assert_eq!(
        JobKey::new("credit", ["ok", "order\0"]),
        Err(KeyError::NulByte)
    );
    assert_eq!(JobKey::new("credit", ["\0"]), Err(KeyError::NulByte));
    assert_eq!(JobKey::parse("credit:ok:order\0"), Err(KeyError::NulByte));
}

#[test]
fn empty_kind() {
    assert_eq!(JobKey::new("", ["x"]), Err(KeyError::EmptyKind));
    assert_eq!(JobKey::parse(""), Err(KeyError::EmptyKind));
    assert_eq!(JobKey::parse(":x"), Err(KeyError::EmptyKind));
}

#[test]
fn invalid_kinds() {
    for kind in [
        "9x", "a b", "crédit", "_a", "-a", ".a", "a/b", "a%b", "a:b", " a", "a\n",
    ] {
        assert_eq!(
            JobKey::new(kind, ["x"]),
            Err(KeyError::InvalidKind {
                kind: kind.to_owned()
            }),
            "{kind:?}"
        );
    }
    for (encoded, kind) in [("9x:1", "9x"), ("a b:1", "a b"), ("crédit:1", "crédit")] {
        assert_eq!(
            JobKey::parse(encoded),
            Err(KeyError::InvalidKind {
                kind: kind.to_owned()
            })
        );
    }
}

#[test]
fn kind_too_long() {
    let kind = "a".repeat(MAX_KIND_LEN + 1);
    let expected = Err(KeyError::KindTooLong {
        len: MAX_KIND_LEN + 1,
        max: MAX_KIND_LEN,
    });
    assert_eq!(JobKey::new(&kind, ["x"]), expected);
    assert_eq!(JobKey::parse(&format!("{kind}:x")), expected);
}

#[test]
fn no_parts() {
    let expected = KeyError::NoParts {
        kind: "credit".into(),
    };
    assert_eq!(
        JobKey::new("credit", std::iter::empty::<&str>()),
        Err(expected.clone())
    );
    assert_eq!(
        JobKey::new("credit", Vec::<String>::new()),
        Err(expected.clone())
    );
    assert_eq!(JobKey::parse("credit"), Err(expected.clone()));
    assert_eq!(
        expected.to_string(),
        "job key `credit` has no business parts: derive the key from the operation, e.g. \
         `credit:order-8812`"
    );
}

#[test]
fn empty_part() {
    assert_eq!(
        JobKey::new("k", [""]),
        Err(KeyError::EmptyPart {
            kind: "k".into(),
            index: 0
        })
    );
    assert_eq!(
        JobKey::new("k", ["a", "b", ""]),
        Err(KeyError::EmptyPart {
            kind: "k".into(),
            index: 2
        })
    );
    assert_eq!(
        JobKey::parse("k::x"),
        Err(KeyError::EmptyPart {
            kind: "k".into(),
            index: 0
        })
    );
    assert_eq!(
        JobKey::parse("k:"),
        Err(KeyError::EmptyPart {
            kind: "k".into(),
            index: 0
        })
    );
    assert_eq!(
        JobKey::parse("k:x:"),
        Err(KeyError::EmptyPart {
            kind: "k".into(),
            index: 1
        })
    );
}

#[test]
fn key_too_long() {
    let part = "x".repeat(MAX_KEY_LEN - "k:".len() + 1);
    let expected = KeyError::TooLong {
        len: MAX_KEY_LEN + 1,
        max: MAX_KEY_LEN,
    };
    assert_eq!(JobKey::new("k", [part.as_str()]), Err(expected.clone()));
    assert_eq!(JobKey::parse(&format!("k:{part}")), Err(expected.clone()));
    // The limit applies to the encoded form: 200 colons take 600 bytes once escaped.
    let colons = ":".repeat(200);
    assert_eq!(
        JobKey::new("k", [colons.as_str()]),
        Err(KeyError::TooLong {
            len: 2 + 600,
            max: MAX_KEY_LEN
        })
    );
    assert!(expected.to_string().contains("hash long business parts"));
}

#[test]
fn malformed_escapes() {
    for (encoded, at) in [
        ("k:a%", 3),
        ("k:a%3", 3),
        ("k:a%zz", 3),
        ("k:a%3a", 3),
        ("k:a%2f", 3),
        ("k:a%41", 3),
        ("k:%%25", 2),
        ("k:ok:b%", 6),
        ("k:é%", 4),
        ("k:%25%", 5),
    ] {
        assert_eq!(
            JobKey::parse(encoded),
            Err(KeyError::MalformedEscape { at }),
            "{encoded:?}"
        );
    }
}

#[test]
fn error_messages_are_lowercase_and_actionable() {
    let errors = [
        KeyError::EmptyKind,
        KeyError::InvalidKind { kind: "9x".into() },
        KeyError::KindTooLong { len: 65, max: 64 },
        KeyError::NoParts { kind: "k".into() },
        KeyError::EmptyPart {
            kind: "k".into(),
            index: 0,
        },
        KeyError::NulByte,
        KeyError::TooLong { len: 600, max: 512 },
        KeyError::MalformedEscape { at: 3 },
    ];
    for error in errors {
        let message = error.to_string();
        let first = message.chars().next().unwrap();
        assert!(!first.is_uppercase(), "{message}");
        assert!(message.contains(": "), "says what to do: {message}");
    }
}

// ---------------------------------------------------------------------------------------------
// Serde
// ---------------------------------------------------------------------------------------------

#[test]
fn serde_round_trip() {
    let k = key("k", &["a:b", "100%"]);
    let json = serde_json::to_string(&k).unwrap();
    assert_eq!(json, r#""k:a%3Ab:100%25""#);
    assert_eq!(serde_json::from_str::<JobKey>(&json).unwrap(), k);
    // Owned strings (visit_string) and strings with JSON escapes take other paths.
    assert_eq!(
        serde_json::from_value::<JobKey>(serde_json::json!("k:a%3Ab:100%25")).unwrap(),
        k
    );
    assert_eq!(
        serde_json::from_str::<JobKey>(r#""\u006b:a%3Ab:100%25""#).unwrap(),
        k
    );
    let keys: Vec<JobKey> = serde_json::from_str(r#"["a:1", "b:2"]"#).unwrap();
    assert_eq!(keys, [key("a", &["1"]), key("b", &["2"])]);
}

#[test]
fn serde_rejects_invalid_keys() {
    for json in [
        r#""k:a%zz""#,
        r#""credit""#,
        r#""""#,
        r#""9x:1""#,
        r#""k::x""#,
        "42",
    ] {
        assert!(serde_json::from_str::<JobKey>(json).is_err(), "{json}");
    }
    let error = serde_json::from_str::<JobKey>(r#""credit""#).unwrap_err();
    assert!(
        error.to_string().contains("has no business parts"),
        "{error}"
    );
    let error = serde_json::from_value::<JobKey>(serde_json::json!("k:a%3a")).unwrap_err();
    assert!(error.to_string().contains("malformed escape"), "{error}");
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

fn valid_kind() -> impl Strategy<Value = String> {
    "[a-zA-Z][a-zA-Z0-9_.-]{0,12}"
}

/// Non-empty parts without NUL, heavy in separators, percent signs and escape look-alikes.
fn part() -> impl Strategy<Value = String> {
    prop_oneof![
        "(:|%|%3A|%25|%3a|3A|25|a|b|\\PC){1,8}",
        "[a:%b\\PC]{1,12}",
        "\\PC{1,12}",
    ]
}

fn parts() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(part(), 1..5)
}

/// Re-splits `parts.join(":")`, cutting at the colons selected by `cuts`.
fn resplit(parts: &[String], cuts: &[bool]) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut colon = 0;
    for c in parts.join(":").chars() {
        if c == ':' {
            let cut = cuts.get(colon).copied().unwrap_or(false);
            colon += 1;
            if cut {
                out.push(String::new());
                continue;
            }
        }
        out.last_mut().unwrap().push(c);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// new -> as_str -> parse gives the same key, and parts() gives back the input parts.
    #[test]
    fn round_trip(kind in valid_kind(), parts in parts()) {
        let k = JobKey::new(&kind, &parts);
        // Parts are valid; only the total length can fail.
        let encoded_len = reference_encode(&kind, &parts).len();
        prop_assert_eq!(k.is_ok(), encoded_len <= MAX_KEY_LEN);
        if let Ok(k) = k {
            let parsed = JobKey::parse(k.as_str()).unwrap();
            prop_assert_eq!(&parsed, &k);
            prop_assert_eq!(parsed.as_str(), k.as_str());
            prop_assert_eq!(k.kind(), kind.as_str());
            prop_assert_eq!(k.parts(), parts.clone());
            prop_assert_eq!(parsed.parts(), parts);
            prop_assert_eq!(k.as_str().len(), encoded_len);
        }
    }

    /// Different (kind, parts) never share a key; equal inputs always do.
    #[test]
    fn injective(
        (k1, p1) in (valid_kind(), parts()),
        (k2, p2) in (valid_kind(), parts()),
    ) {
        if let (Ok(a), Ok(b)) = (JobKey::new(&k1, &p1), JobKey::new(&k2, &p2)) {
            prop_assert_eq!((k1, p1) == (k2, p2), a == b, "{:?} vs {:?}", a, b);
        }
    }

    /// Moving the part boundaries over the same text always changes the key.
    #[test]
    fn injective_across_resplits(
        kind in "[ab]{1,2}",
        parts in prop::collection::vec("[a:%3A25]{1,4}", 1..4),
        cuts in prop::collection::vec(any::<bool>(), 0..16),
    ) {
        let other = resplit(&parts, &cuts);
        if let (Ok(a), Ok(b)) = (JobKey::new(&kind, &parts), JobKey::new(&kind, &other)) {
            prop_assert_eq!(parts == other, a == b, "{:?} vs {:?}", a, b);
        }
    }

    /// Same text with a different kind/part split (e.g. kind `a` + part `b` vs kind `ab`).
    #[test]
    fn small_alphabet_pairs_are_injective(
        (k1, p1) in ("[ab]{1,2}", prop::collection::vec("[ab:%]{1,3}", 1..3)),
        (k2, p2) in ("[ab]{1,2}", prop::collection::vec("[ab:%]{1,3}", 1..3)),
    ) {
        let a = JobKey::new(&k1, &p1).unwrap();
        let b = JobKey::new(&k2, &p2).unwrap();
        prop_assert_eq!((k1, p1) == (k2, p2), a == b, "{:?} vs {:?}", a, b);
    }

    /// parse never panics, and everything it accepts displays back exactly and re-encodes.
    #[test]
    fn parse_is_canonical(
        s in prop_oneof![
            any::<String>(),
            "(k|a|:|%|25|3A|3a|2|5|\\x00|é| ){0,12}",
            "[a-z]{1,3}:(%|%3A|%25|%3a|%2|:|x){0,10}",
        ]
    ) {
        if let Ok(k) = JobKey::parse(&s) {
            prop_assert_eq!(k.to_string(), s.clone());
            prop_assert_eq!(k.as_str(), s.as_str());
            prop_assert_eq!(JobKey::parse(k.as_str()).unwrap(), k.clone());
            prop_assert_eq!(JobKey::new(k.kind(), k.parts()).unwrap(), k.clone());
            prop_assert_eq!(JobKey::try_from(s.clone()).unwrap(), k);
        } else {
            prop_assert!(JobKey::try_from(s).is_err());
        }
    }

    /// new and parse apply the same rules: parsing the reference encoding of any input gives
    /// exactly what new gives, errors included.
    #[test]
    fn new_agrees_with_parse(
        kind in prop_oneof![valid_kind(), "[a-zA-Z0-9 é_.%\\x00-]{0,8}", "[a-z]{60,70}"],
        parts in prop::collection::vec(
            prop_oneof![
                4 => "[a:%\\x00]{0,4}",
                1 => "[a:]{100,300}",
            ],
            0..4,
        ),
    ) {
        let encoded = reference_encode(&kind, &parts);
        prop_assert_eq!(JobKey::new(&kind, &parts), JobKey::parse(&encoded));
    }
}
