//! URLs as errors, logs and output show them: with their secrets replaced by `***`.

/// A database or broker URL with its secrets replaced by `***`, for errors, logs and output.
///
/// Hidden: the password of `user:password@`; a credential given alone before `@` (a NATS
/// token, `nats://TOKEN@host`), except for PostgreSQL and AMQP URLs, where that is a user
/// name; and the values of query parameters that carry secrets (`password`, `token`,
/// `secret`, `sslpassword`, and the like, in any case).
///
/// ```
/// use jobguard_core::url::redact;
///
/// assert_eq!(redact("amqp://app:s3cret@mq:5672/%2f"), "amqp://app:***@mq:5672/%2f");
/// assert_eq!(redact("nats://s3cret@nats:4222"), "nats://***@nats:4222");
/// assert_eq!(
///     redact("postgres://app@db/jobs?sslmode=require&password=s3cret"),
///     "postgres://app@db/jobs?sslmode=require&password=***"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut shown = redact_userinfo(base);
    if let Some(query) = query {
        shown.push('?');
        shown.push_str(&redact_query(query));
    }
    shown
}

/// Schemes whose URLs name a user alone before `@`: not a secret.
const USER_NAME_SCHEMES: [&str; 4] = ["postgres", "postgresql", "amqp", "amqps"];

/// Query parameters whose values are secrets.
const SECRET_PARAMETERS: [&str; 11] = [
    "password",
    "passwd",
    "pass",
    "pwd",
    "sslpassword",
    "token",
    "auth_token",
    "access_token",
    "secret",
    "api_key",
    "apikey",
];

fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The authority ends at the path; a password may hold an unescaped `@`, the host never.
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let userinfo = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None if USER_NAME_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) => {
            userinfo.to_owned()
        }
        None => "***".to_owned(),
    };
    format!("{scheme}://{userinfo}@{host}{path}")
}

fn redact_query(query: &str) -> String {
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let mut shown: Vec<String> = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((name, _)) if SECRET_PARAMETERS.contains(&name.to_ascii_lowercase().as_str()) => {
                shown.push(format!("{name}=***"));
            }
            _ => shown.push(pair.to_owned()),
        }
    }
    let mut shown = shown.join("&");
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn hides_passwords() {
        assert_eq!(
            redact("amqp://u:secret@h:5672/%2f"),
            "amqp://u:***@h:5672/%2f"
        );
        assert_eq!(redact("redis://:secret@h:6379"), "redis://:***@h:6379");
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        // An unescaped `@` in the password does not leave its tail in view.
        assert_eq!(
            redact("postgres://u:se@cret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
    }

    #[test]
    fn hides_tokens_given_alone() {
        assert_eq!(redact("nats://s3cr3t@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("tls://s3cr3t@h:4222"), "tls://***@h:4222");
        assert_eq!(redact("redis://s3cr3t@h:6379/0"), "redis://***@h:6379/0");
        // A PostgreSQL or AMQP user alone is a user name, shown.
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("amqp://guest@h:5672"), "amqp://guest@h:5672");
    }

    #[test]
    fn hides_secret_query_parameters() {
        assert_eq!(
            redact("postgres://u@h/db?password=s3cr3t&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(
            redact("nats://h:4222?Token=s3cr3t"),
            "nats://h:4222?Token=***"
        );
        assert_eq!(
            redact("postgres://h/db?sslmode=require&sslpassword=s3cr3t#x"),
            "postgres://h/db?sslmode=require&sslpassword=***#x"
        );
        assert_eq!(
            redact("postgres://u:p@h/db?password=s3cr3t"),
            "postgres://u:***@h/db?password=***"
        );
    }

    #[test]
    fn leaves_urls_without_secrets_alone() {
        for url in [
            "nats://h:4222",
            "postgres://h/db?sslmode=require",
            "sqlite:jobs.db",
            "sqlite://jobs.db?mode=rwc",
            "redis://h:6379/0",
        ] {
            assert_eq!(redact(url), url);
        }
        for url in [
            "nats://s3cr3t@h:4222",
            "redis://:s3cr3t@h",
            "postgres://u:s3cr3t@h/db",
            "postgres://h/db?password=s3cr3t",
            "nats://h?token=s3cr3t",
        ] {
            assert!(!redact(url).contains("s3cr3t"), "{url}");
        }
    }
}
