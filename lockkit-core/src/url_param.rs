//! Helpers for backends that read options from URL query parameters.

use std::time::Duration;

/// The longest timeout a URL parameter may set.
pub const MAX_TIMEOUT_PARAM: Duration = Duration::from_secs(3600);

/// Parses a timeout given as a URL parameter (`500ms`, `2s`, `1m`): positive
/// and at most one hour. The error is a reason for
/// [`LockError::invalid_url`](crate::LockError::invalid_url).
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::timeout_param;
/// assert_eq!(timeout_param("connect_timeout", "250ms"), Ok(Duration::from_millis(250)));
/// assert!(timeout_param("connect_timeout", "0s").is_err());
/// assert!(timeout_param("connect_timeout", "soon").is_err());
/// ```
pub fn timeout_param(key: &str, value: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(value)
        .map_err(|e| format!("{key}={value:?} is not a duration like 500ms or 2s: {e}"))?;
    if parsed.is_zero() || parsed > MAX_TIMEOUT_PARAM {
        return Err(format!(
            "{key}={value:?} must be positive and at most one hour"
        ));
    }
    Ok(parsed)
}

/// Parses a comma-separated list of `host[:port]` (IPv6 hosts in brackets),
/// as in `redlock://h1:p1,h2:p2` or `zk://h1:p1,h2:p2/root`. Hosts must be
/// distinct: one server listed twice would count twice in a quorum. The error
/// is a reason for [`LockError::invalid_url`](crate::LockError::invalid_url).
///
/// ```
/// use lockkit_core::host_list;
/// assert_eq!(
///     host_list("a:1,b,[::1]:3", 6379),
///     Ok(vec![("a".to_owned(), 1), ("b".to_owned(), 6379), ("[::1]".to_owned(), 3)])
/// );
/// assert!(host_list("a:1,a:1", 6379).is_err());
/// assert!(host_list("a:0", 6379).is_err());
/// ```
pub fn host_list(hosts: &str, default_port: u16) -> Result<Vec<(String, u16)>, String> {
    let mut seen = std::collections::HashSet::new();
    let mut list = Vec::new();
    for item in hosts.split(',') {
        let (host, port) = host_port(item.trim(), default_port)?;
        if !seen.insert((host.to_ascii_lowercase(), port)) {
            return Err(format!(
                "{host}:{port} is listed twice; the servers must be distinct"
            ));
        }
        list.push((host, port));
    }
    Ok(list)
}

/// Splits `host[:port]` (IPv6 in brackets) into host and port.
fn host_port(item: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = item.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in {item:?}"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("bad port in {item:?}"))?,
            ),
        };
        (format!("[{host}]"), port)
    } else {
        match item.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (item.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(format!("missing host in {item:?}"));
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("bad port {p:?} in {item:?}")),
            Ok(port) => port,
        },
    };
    Ok((host, port))
}

/// The parts of a URL with a list of hosts, such as
/// `redlock://user:pw@h1:p1,h2:p2/2?x=1` or `zk://h1:p1,h2:p2/root`, which the
/// `url` crate cannot parse (its authority holds one host). All parts borrow
/// from the input and are not decoded yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiHostUrl<'a> {
    /// `user:password` before the `@`, if any.
    pub userinfo: Option<&'a str>,
    /// The comma-separated hosts (see [`host_list`]).
    pub hosts: &'a str,
    /// Everything from the first `/` after the hosts (may be empty).
    pub path: &'a str,
    /// Everything after the `?` (may be empty).
    pub query: &'a str,
}

impl<'a> MultiHostUrl<'a> {
    /// Splits `raw`, whose scheme must be `scheme` (case-insensitive). The error
    /// is a reason for [`LockError::invalid_url`](crate::LockError::invalid_url).
    ///
    /// ```
    /// use lockkit_core::MultiHostUrl;
    /// let url = MultiHostUrl::parse("zk://u:p@a:1,b:2/root?x=1", "zk").unwrap();
    /// assert_eq!(url.userinfo, Some("u:p"));
    /// assert_eq!((url.hosts, url.path, url.query), ("a:1,b:2", "/root", "x=1"));
    /// assert!(MultiHostUrl::parse("redis://a", "zk").is_err());
    /// ```
    pub fn parse(raw: &'a str, scheme: &str) -> Result<Self, String> {
        let rest = match raw.split_once("://") {
            Some((given, rest)) if given.eq_ignore_ascii_case(scheme) => rest,
            _ => return Err(format!("expected {scheme}://host1:port1,host2:port2,…")),
        };
        if rest.contains('#') {
            return Err("a fragment is not allowed".into());
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        Ok(MultiHostUrl {
            userinfo,
            hosts,
            path,
            query,
        })
    }
}
