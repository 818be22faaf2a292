//! Helpers for backends that take their settings from a URL: query
//! parameters, timeouts, host lists, and keeping secrets out of messages.

use std::time::Duration;

/// The longest timeout a URL parameter may set.
pub const MAX_TIMEOUT_PARAM: Duration = Duration::from_secs(3600);

/// Parses a timeout given as a URL parameter (`500ms`, `2s`, `1m`): positive
/// and at most one hour. The error is a reason for
/// [`LockError::invalid_url`](crate::LockError::invalid_url).
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::backend::timeout_param;
/// assert_eq!(timeout_param("connect_timeout", "250ms"), Ok(Duration::from_millis(250)));
/// assert!(timeout_param("connect_timeout", "0s").is_err());
/// assert!(timeout_param("connect_timeout", "soon").is_err());
/// ```
pub fn timeout_param(key: &str, value: &str) -> Result<Duration, String> {
    let parsed = humantime::parse_duration(value)
        .map_err(|e| format!("{key}={value:?} is not a duration like 500ms or 2s: {e}"))?;
    if !timeout_in_range(parsed) {
        return Err(format!(
            "{key}={value:?} must be positive and at most one hour"
        ));
    }
    Ok(parsed)
}

/// Parses a switch given in a URL's query (`fair=true`, `migrate=0`):
/// `true`, `1` or `yes`, `false`, `0` or `no`; the message otherwise names
/// `key`.
///
/// ```
/// use lockkit_core::backend::bool_param;
/// assert_eq!(bool_param("fair", "yes"), Ok(true));
/// assert_eq!(bool_param("fair", "0"), Ok(false));
/// assert!(bool_param("fair", "maybe").unwrap_err().contains("fair=\"maybe\""));
/// ```
pub fn bool_param(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        other => Err(format!("{key}={other:?} must be true or false")),
    }
}

/// Checks a timeout set in a builder: positive and at most one hour, like
/// [`timeout_param`]; `InvalidOptions` names `what`.
///
/// ```
/// use std::time::Duration;
/// use lockkit_core::backend::check_timeout;
/// assert!(check_timeout("command_timeout", Duration::from_secs(2)).is_ok());
/// assert!(check_timeout("command_timeout", Duration::ZERO).is_err());
/// ```
pub fn check_timeout(what: &str, value: Duration) -> crate::Result<()> {
    if timeout_in_range(value) {
        Ok(())
    } else {
        Err(crate::LockError::invalid_options(format!(
            "{what} {value:?} must be positive and at most one hour"
        )))
    }
}

fn timeout_in_range(value: Duration) -> bool {
    !value.is_zero() && value <= MAX_TIMEOUT_PARAM
}

/// Parses a comma-separated list of `host[:port]` (IPv6 hosts in brackets),
/// as in `redlock://h1:p1,h2:p2` or `zk://h1:p1,h2:p2/root`. Hosts must be
/// distinct: one server listed twice would count twice in a quorum. The error
/// is a reason for [`LockError::invalid_url`](crate::LockError::invalid_url).
///
/// ```
/// use lockkit_core::backend::host_list;
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
    /// use lockkit_core::backend::MultiHostUrl;
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

impl MultiHostUrl<'_> {
    /// The `user:password` of the userinfo, percent-decoded; `None` without
    /// a userinfo. The error (a reason for
    /// [`LockError::invalid_url`](crate::LockError::invalid_url)) never
    /// contains the password.
    ///
    /// ```
    /// use lockkit_core::backend::MultiHostUrl;
    /// let url = MultiHostUrl::parse("zk://app:p%40ss@h", "zk").unwrap();
    /// assert_eq!(url.credentials().unwrap(), Some(("app".into(), "p@ss".into())));
    /// assert!(MultiHostUrl::parse("zk://pw@h", "zk").unwrap().credentials().is_err());
    /// ```
    pub fn credentials(&self) -> Result<Option<(String, String)>, String> {
        let Some(userinfo) = self.userinfo else {
            return Ok(None);
        };
        let (user, password) = userinfo
            .split_once(':')
            .ok_or("credentials must be user:password")?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| {
                    "the credentials are not valid UTF-8 after percent-decoding".to_owned()
                })
        };
        let (user, password) = (decode(user)?, decode(password)?);
        if user.is_empty() {
            return Err("the user name is empty".into());
        }
        Ok(Some((user, password)))
    }
}

/// Returns `url` with its secrets replaced by `***`: the password of the
/// userinfo, and the value of every query parameter whose name contains
/// `password` or `secret` (e.g. `sentinel_password`, `password`).
///
/// Works on strings that are not valid URLs too (e.g. `redlock://a:p@h1,h2`), so an
/// error about a malformed URL still hides its secret.
///
/// ```
/// use lockkit_core::backend::redact_url;
/// assert_eq!(
///     redact_url("redis://app:s3cret@127.0.0.1:6379/0"),
///     "redis://app:***@127.0.0.1:6379/0"
/// );
/// assert_eq!(
///     redact_url("redis+sentinel://h/m?sentinel_password=pw&x=1"),
///     "redis+sentinel://h/m?sentinel_password=***&x=1"
/// );
/// assert_eq!(redact_url("redis://127.0.0.1"), "redis://127.0.0.1");
/// ```
pub fn redact_url(url: &str) -> String {
    let redacted = redact_userinfo(url);
    let Some((before, query)) = redacted.split_once('?') else {
        return redacted;
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let query = query
        .split('&')
        .map(|pair| {
            let key = pair.split_once('=').map_or(pair, |(key, _)| key);
            let decoded: String = url::form_urlencoded::parse(key.as_bytes())
                .map(|(k, _)| k.to_ascii_lowercase())
                .collect();
            if pair.contains('=') && (decoded.contains("password") || decoded.contains("secret")) {
                format!("{key}=***")
            } else {
                pair.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("&");
    match fragment {
        Some(fragment) => format!("{before}?{query}#{fragment}"),
        None => format!("{before}?{query}"),
    }
}

/// `url` with the userinfo's password replaced by `***`.
fn redact_userinfo(url: &str) -> String {
    // Where the authority starts: after "://"; in malformed input after "//" or
    // after the first ':' (so that "redis//u:pw@h" and "u:pw@h" are covered too).
    let rest_start = if let Some(i) = url.find("://") {
        i + 3
    } else if let Some(i) = url.find("//") {
        i + 2
    } else if let Some(i) = url.find(':') {
        i + 1
    } else {
        0
    };
    let rest = &url[rest_start..];
    // The authority ends at the first '/', '?' or '#'; the userinfo at the last '@' before it.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let user = match userinfo.find(':') {
        Some(colon) => &userinfo[..colon],
        // A lone userinfo without ':' is a password for some clients (`redis://secret@host`).
        None => "",
    };
    format!(
        "{}{}:***{}",
        &url[..rest_start],
        user,
        &rest[at..] // starts with '@'
    )
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords() {
        for (input, expected) in [
            ("redis://:pw@h:1", "redis://:***@h:1"),
            ("redis://u:pw@h:1/2?x=1", "redis://u:***@h:1/2?x=1"),
            ("redis://pw@h", "redis://:***@h"),
            (
                "redlock://u:p@a:1,b:2/?prefix=x",
                "redlock://u:***@a:1,b:2/?prefix=x",
            ),
            ("redis://u:p@ss@h", "redis://u:***@h"),
            ("redis://h:1/?q=a@b", "redis://h:1/?q=a@b"),
            ("memory://", "memory://"),
            ("not a url", "not a url"),
            ("redis//:pw@h", "redis//:***@h"),
            ("redis:u:pw@h", "redis:u:***@h"),
            ("pw@h", ":***@h"),
            ("sqlite::memory:", "sqlite::memory:"),
            (
                "postgres://h/db?PassWord=x&mode=row",
                "postgres://h/db?PassWord=***&mode=row",
            ),
            (
                "redis+sentinel://:p@h/m?sentinel_password=q#frag",
                "redis+sentinel://:***@h/m?sentinel_password=***#frag",
            ),
            ("redis://h/?password", "redis://h/?password"),
        ] {
            assert_eq!(redact_url(input), expected, "{input}");
        }
    }
}
