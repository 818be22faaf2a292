//! Keeping passwords out of messages.

/// Returns `url` with the password (if any) replaced by `***`.
///
/// Works on strings that are not valid URLs too (e.g. `redlock://a:p@h1,h2`), so an
/// error about a malformed URL still hides its secret.
///
/// ```
/// assert_eq!(
///     lockkit_core::redact_url("redis://app:s3cret@127.0.0.1:6379/0"),
///     "redis://app:***@127.0.0.1:6379/0"
/// );
/// assert_eq!(lockkit_core::redact_url("redis://127.0.0.1"), "redis://127.0.0.1");
/// ```
pub fn redact_url(url: &str) -> String {
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
mod tests {
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
        ] {
            assert_eq!(redact_url(input), expected, "{input}");
        }
    }
}
