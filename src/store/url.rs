//! Database URLs: shown in messages without their passwords, and drover's
//! own PostgreSQL parameter, `pool_mode`, read (and taken out) before the
//! driver sees the URL.

/// How a PostgreSQL URL reaches the server, from its `pool_mode` parameter.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PoolMode {
    /// `session` (the default): a direct connection, or a pooler that gives
    /// each client one server for its whole connection. Everything works.
    #[default]
    Session,
    /// `transaction`: a pooler (PgBouncer's `pool_mode = transaction`) that
    /// may give each transaction another server: no named prepared
    /// statements, no statement outside a transaction, no session state, no
    /// `LISTEN`.
    Transaction,
}

/// Takes `pool_mode=…` out of `url`'s query: the URL without it (for the
/// driver, which would ignore it with a warning) and the mode. An unknown
/// mode is refused with the reason, never ignored.
#[cfg(feature = "postgres")]
pub(crate) fn pool_mode(url: &str) -> Result<(String, PoolMode), String> {
    let (url, values) = take_param(url, "pool_mode");
    let mut mode = PoolMode::default();
    for value in values {
        mode = match value {
            "session" => PoolMode::Session,
            "transaction" => PoolMode::Transaction,
            "statement" => {
                return Err("pool_mode=statement cannot run drover's transactions; \
                            use a pool in transaction (or session) mode"
                    .into());
            }
            other => {
                return Err(format!(
                    "pool_mode must be `session` (the default: direct, or a pooler \
                     in session mode) or `transaction` (PgBouncer's transaction \
                     pooling), not {other:?}"
                ));
            }
        };
    }
    Ok((url, mode))
}

/// Takes every `name=…` out of the query of `url` (or of a path and query):
/// what is left, without a `?` when nothing is, and the values in the order
/// they came. How drover reads the URL parameters of its own that the driver
/// must not see.
#[cfg(feature = "postgres")]
pub(crate) fn take_param<'a>(url: &'a str, name: &str) -> (String, Vec<&'a str>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let mut values = Vec::new();
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((key, value)) if key == name => values.push(value),
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, values)
}

/// The URL with any password replaced by `***`, so errors, logs and startup
/// banners never leak it: the one in the user part (`USER:PASSWORD@`) and a
/// `password=` parameter of the query, which the PostgreSQL driver reads as
/// libpq does (its name percent-decoded, so `pass%77ord=` too).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (user, tail) = match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => (format!("{user}:***"), &rest[at..]),
            None => (rest[..at].to_owned(), &rest[at..]),
        },
        None => (String::new(), rest),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if form_decoded(name) == b"password" => {
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{user}{tail}")
}

/// The bytes `text` stands for in a form-encoded query
/// (`application/x-www-form-urlencoded`, as URL parsers and the server read
/// a query): `%XX` the byte XX, `+` a space, anything else (a `%` without two
/// hex digits too) itself.
pub(crate) fn form_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let hex = |at: usize| bytes.get(at).and_then(|&b| char::from(b).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                // Two hex digits: at most 0xFF.
                out.push(u8::try_from(high * 16 + low).unwrap_or(u8::MAX));
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url as redact;

    #[cfg(feature = "postgres")]
    #[test]
    fn pool_mode_is_taken_out_and_unknown_modes_are_refused() {
        use super::{PoolMode, pool_mode};
        let url = "postgres://u@h:6432/db";
        assert_eq!(pool_mode(url), Ok((url.to_owned(), PoolMode::Session)));
        assert_eq!(
            pool_mode("postgres://u@h/db?sslmode=disable&pool_mode=transaction&x=1"),
            Ok((
                "postgres://u@h/db?sslmode=disable&x=1".to_owned(),
                PoolMode::Transaction
            ))
        );
        assert_eq!(
            pool_mode("postgres://u@h/db?pool_mode=session"),
            Ok(("postgres://u@h/db".to_owned(), PoolMode::Session))
        );
        let err = pool_mode("postgres://u@h/db?pool_mode=transactions").expect_err("refused");
        assert!(err.contains("`transaction`"), "{err}");
        assert!(pool_mode("postgres://u@h/db?pool_mode=statement").is_err());
    }

    #[test]
    fn passwords_are_hidden_and_everything_else_kept() {
        assert_eq!(
            redact("postgres://u:secret@db:5432/x?sslmode=disable"),
            "postgres://u:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(redact("postgres://u@db/x"), "postgres://u@db/x");
        assert_eq!(redact("sqlite://drover.db"), "sqlite://drover.db");
        assert_eq!(
            redact("sqlite:///var/lib/d.db?mode=rwc"),
            "sqlite:///var/lib/d.db?mode=rwc"
        );
        assert_eq!(redact("postgres://u:p?w@db/x"), "postgres://u:***@db/x");
    }

    #[test]
    fn a_password_in_the_query_is_hidden() {
        assert_eq!(
            redact("postgres://u@db/x?password=secret"),
            "postgres://u@db/x?password=***"
        );
        assert_eq!(
            redact("postgres://u:a@db/x?sslmode=disable&pass%77ord=b&application_name=c"),
            "postgres://u:***@db/x?sslmode=disable&pass%77ord=***&application_name=c"
        );
        assert_eq!(
            redact("postgres://db?password=secret"),
            "postgres://db?password=***"
        );
        assert_eq!(
            redact("postgres://u@db/x?passwords=1&password"),
            "postgres://u@db/x?passwords=1&password"
        );
    }
}
