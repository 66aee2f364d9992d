//! A directory of the test's own, for its database file and what its processes write.

use std::path::PathBuf;

/// A name for `test` (a module path such as `it::faults::sigkill_mid_job`) fit for a schema or
/// a directory: lower case letters, digits and `_`, short enough for a PostgreSQL identifier
/// with a process id after it.
pub fn slug(test: &str) -> String {
    let test = test.strip_prefix("it::").unwrap_or(test);
    let mut slug: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if slug.len() > 40 {
        // Two long names sharing their first 31 characters still get names of their own.
        let hash = test.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        slug.truncate(31);
        slug = format!("{slug}_{:08x}", hash as u32);
    }
    slug
}

/// `<temp>/<prefix>-<slug of test>-<process id>`, emptied: a directory of the test's own in
/// this run.
pub fn scratch(prefix: &str, test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{}", slug(test), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's directory");
    dir
}

#[cfg(test)]
mod tests {
    use super::slug;

    #[test]
    fn long_names_keep_apart() {
        let a = slug("it::faults::a_very_long_test_name_that_goes_on_and_on::postgres");
        let b = slug("it::faults::a_very_long_test_name_that_goes_on_and_on::sqlite");
        assert_ne!(a, b);
        assert!(a.len() <= 40, "{a}");
        assert_eq!(
            slug("it::faults::sigkill_mid_job"),
            "faults__sigkill_mid_job"
        );
    }
}
