//! Multi-host URLs in libpq's form: `postgres://USER@H1:P1,H2:P2/DB?target_session_attrs=…`,
//! split into one single-host URL per host (which the driver understands) and
//! the kind of server a connection must reach to be kept.

use crate::store::url::take_param;

/// libpq's `target_session_attrs`, restricted to what a drover can use: every
/// drover connection writes, so `read-only`, `standby` and `prefer-standby`
/// are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// `any`: the first host that answers (libpq's default, and drover's with
    /// one host: a proxy, a virtual IP or a DNS name that follows the primary).
    Any,
    /// `read-write`: a server whose sessions can write (`transaction_read_only`
    /// is off): not a standby, not a primary made read-only. drover's default
    /// with several hosts.
    ReadWrite,
    /// `primary`: a server not in recovery (not a standby).
    Primary,
}

impl Target {
    /// The parameter's value, as written in a URL.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::Primary => "primary",
        }
    }

    /// The kinds of server to look for, best first: `primary` prefers a
    /// primary whose sessions can write, and takes a read-only one only when
    /// no host can write. libpq would keep the first primary it reaches, but
    /// drover writes: an old primary made read-only while its standby was
    /// promoted refused every write, and the store, reconnecting after each
    /// refusal, chose it again for ever.
    pub(crate) fn passes(self) -> &'static [Self] {
        match self {
            Self::Any => &[Self::Any],
            Self::ReadWrite => &[Self::ReadWrite],
            Self::Primary => &[Self::ReadWrite, Self::Primary],
        }
    }

    /// Whether a server in this state fits.
    pub(crate) fn fits(self, in_recovery: bool, read_only: bool) -> bool {
        match self {
            Self::Any => true,
            Self::ReadWrite => !in_recovery && !read_only,
            Self::Primary => !in_recovery,
        }
    }
}

/// A URL split per host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hosts {
    /// Each host as `HOST:PORT` (for logs) with its single-host URL, in the
    /// order they are tried.
    pub(crate) hosts: Vec<(String, String)>,
    /// What a connection must reach.
    pub(crate) target: Target,
}

/// Splits `url` (already without `pool_mode`) per host and takes out
/// `target_session_attrs`. A URL with one host and no `target_session_attrs`
/// comes back unchanged. Errors name the part that is wrong.
pub(crate) fn split(url: &str) -> Result<Hosts, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "a PostgreSQL URL starts with postgres://".to_owned())?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, host_list) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let (tail, target) = take_target(tail)?;
    let names: Vec<&str> = host_list.split(',').collect();
    let count = names.len();
    let target = target.unwrap_or(if count > 1 {
        Target::ReadWrite
    } else {
        Target::Any
    });
    if count == 1 {
        let url = format!("{scheme}://{authority}{tail}");
        return Ok(Hosts {
            hosts: vec![(shown(host_list), url)],
            target,
        });
    }
    let mut hosts = Vec::with_capacity(count);
    for (i, name) in names.into_iter().enumerate() {
        let (host, port) =
            host_port(name).map_err(|why| format!("host {} of {count} ({name:?}) {why}", i + 1))?;
        let host_port = format!("{host}:{port}");
        hosts.push((
            host_port.clone(),
            format!("{scheme}://{user}{host_port}{tail}"),
        ));
    }
    Ok(Hosts { hosts, target })
}

/// `HOST:PORT` for logs, the default port added.
fn shown(host: &str) -> String {
    match host_port(host) {
        Ok((host, port)) => format!("{host}:{port}"),
        Err(_) => host.to_owned(),
    }
}

/// One `HOST[:PORT]` or `[V6][:PORT]` of a host list.
fn host_port(name: &str) -> Result<(&str, u16), String> {
    let (host, port) = if let Some(v6) = name.strip_prefix('[') {
        let end = v6
            .find(']')
            .ok_or_else(|| "has no `]` after its IPv6 address".to_owned())?;
        let after = &v6[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(format!("has {after:?} after its IPv6 address")),
        };
        (&name[..end + 2], port)
    } else {
        match name.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (name, None),
        }
    };
    if host.is_empty() {
        return Err("has no host name".into());
    }
    let port = match port {
        None => 5432,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("has an invalid port {port:?} (1 to 65535)")),
        },
    };
    Ok((host, port))
}

/// Takes `target_session_attrs` out of the path-and-query `tail`.
fn take_target(tail: &str) -> Result<(String, Option<Target>), String> {
    let (tail, values) = take_param(tail, "target_session_attrs");
    let mut target = None;
    for value in values {
        target = Some(parse_target(value)?);
    }
    Ok((tail, target))
}

fn parse_target(value: &str) -> Result<Target, String> {
    match value {
        "any" => Ok(Target::Any),
        "read-write" => Ok(Target::ReadWrite),
        "primary" => Ok(Target::Primary),
        "read-only" | "standby" | "prefer-standby" => Err(format!(
            "target_session_attrs={value} would reach a server drover cannot write to; \
             use read-write (the default with several hosts), primary or any"
        )),
        other => Err(format!(
            "target_session_attrs must be read-write, primary or any, not {other:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(hosts: &Hosts) -> Vec<&str> {
        hosts.hosts.iter().map(|(_, url)| url.as_str()).collect()
    }

    #[test]
    fn primary_prefers_a_primary_that_writes_and_takes_a_read_only_one_last() {
        let passes = Target::Primary.passes();
        assert_eq!(passes, [Target::ReadWrite, Target::Primary]);
        // A read-only old primary fits only the last pass; a standby none.
        let read_only_primary = (false, true);
        let fits = |(recovery, read_only)| passes.iter().position(|t| t.fits(recovery, read_only));
        assert_eq!(fits(read_only_primary), Some(1));
        assert_eq!(fits((false, false)), Some(0));
        assert_eq!(fits((true, true)), None);
        assert_eq!(Target::ReadWrite.passes(), [Target::ReadWrite]);
        assert_eq!(Target::Any.passes(), [Target::Any]);
    }

    #[test]
    fn one_host_comes_back_unchanged_and_takes_any() {
        let url = "postgres://u:pw@db:6543/x?sslmode=disable";
        let hosts = split(url).expect("parses");
        assert_eq!(urls(&hosts), [url]);
        assert_eq!(hosts.hosts[0].0, "db:6543");
        assert_eq!(hosts.target, Target::Any);
        let hosts = split("postgres://db/x").expect("parses");
        assert_eq!(hosts.hosts[0].0, "db:5432");
    }

    #[test]
    fn several_hosts_split_in_order_and_default_to_read_write() {
        let hosts =
            split("postgres://u:pw@h1:5433,[::1]:5434,h3/db?sslmode=disable").expect("parses");
        assert_eq!(
            urls(&hosts),
            [
                "postgres://u:pw@h1:5433/db?sslmode=disable",
                "postgres://u:pw@[::1]:5434/db?sslmode=disable",
                "postgres://u:pw@h3:5432/db?sslmode=disable",
            ]
        );
        assert_eq!(hosts.hosts[1].0, "[::1]:5434");
        assert_eq!(hosts.target, Target::ReadWrite);
    }

    #[test]
    fn target_session_attrs_is_taken_out_and_read() {
        let hosts = split("postgres://h1,h2/db?target_session_attrs=primary&x=1").expect("parses");
        assert_eq!(hosts.target, Target::Primary);
        assert_eq!(
            urls(&hosts),
            ["postgres://h1:5432/db?x=1", "postgres://h2:5432/db?x=1"]
        );
        let hosts = split("postgres://h1/db?target_session_attrs=read-write").expect("parses");
        assert_eq!(
            (urls(&hosts), hosts.target),
            (vec!["postgres://h1/db"], Target::ReadWrite)
        );
        assert_eq!(
            split("postgres://h1,h2/db?target_session_attrs=any").map(|h| h.target),
            Ok(Target::Any)
        );
    }

    #[test]
    fn errors_name_the_part_that_is_wrong() {
        let err = split("postgres://u@h1:5432,h2:54x2/db").expect_err("bad port");
        assert!(
            err.contains("host 2 of 2 (\"h2:54x2\")") && err.contains("\"54x2\""),
            "{err}"
        );
        let err = split("postgres://u@h1,,h3/db").expect_err("empty host");
        assert!(
            err.contains("host 2 of 3") && err.contains("no host name"),
            "{err}"
        );
        let err = split("postgres://h1,h2:0/db").expect_err("port 0");
        assert!(err.contains("invalid port \"0\""), "{err}");
        let err = split("postgres://h1,[::1/db").expect_err("open bracket");
        assert!(err.contains("`]`"), "{err}");
        let err = split("postgres://h1,h2/db?target_session_attrs=standby").expect_err("standby");
        assert!(err.contains("cannot write"), "{err}");
        let err = split("postgres://h1,h2/db?target_session_attrs=rw").expect_err("unknown");
        assert!(err.contains("\"rw\""), "{err}");
        assert!(split("h1,h2/db").is_err());
    }

    #[test]
    fn targets_fit_the_servers_they_name() {
        assert!(Target::ReadWrite.fits(false, false));
        assert!(!Target::ReadWrite.fits(false, true));
        assert!(!Target::ReadWrite.fits(true, true));
        assert!(Target::Primary.fits(false, true));
        assert!(!Target::Primary.fits(true, true));
        assert!(Target::Any.fits(true, true));
    }
}
