//! Showing database URLs in messages without their passwords.

/// The URL with any password replaced by `***`, so errors, logs and startup
/// banners never leak it.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url as redact;

    #[test]
    fn passwords_are_hidden_and_everything_else_kept() {
        assert_eq!(
            redact("postgres://u:secret@db:5432/x?sslmode=disable"),
            "postgres://u:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(redact("postgres://u@db/x"), "postgres://u@db/x");
        assert_eq!(redact("sqlite://drover.db"), "sqlite://drover.db");
    }
}
