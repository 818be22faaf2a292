//! The Lua scripts: each lock operation is one atomic script, sent with EVALSHA
//! (redis-rs falls back to loading it on NOSCRIPT, e.g. after a server restart).

use std::sync::LazyLock;

use redis::Script;

/// KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] owner token, ARGV[2] ttl in
/// ms, ARGV[3] "1" to draw a fencing token.
/// Returns {1, fencing token (0 without fencing)} when granted, {0, holder's PTTL} when not.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// KEYS[1] lock key; ARGV[1] owner token, ARGV[2] ttl in ms. Returns 1 if extended.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// KEYS[1] lock key; ARGV[1] owner token, ARGV[2] release channel, ARGV[3] "1"
/// to wake waiters. Deletes the key only if it holds our token, then publishes
/// the release if asked. Returns 1 if released.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] == '1' then
    redis.call('PUBLISH', ARGV[2], '')
  end
  return 1
end
return 0
";

/// KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] current owner, ARGV[2]
/// next owner, ARGV[3] ttl in ms, ARGV[4] "1" to draw a fencing token.
/// Passes the lease from one owner to the next (a local handoff): returns the
/// new fencing token (0 without fencing), or -1 if the lease was not ARGV[1]'s.
const HAND_OVER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[4] == '1' then
    return redis.call('INCR', KEYS[2])
  end
  return 0
end
return -1
";

pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) extend: Script,
    pub(crate) release: Script,
    pub(crate) hand_over: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE),
    extend: Script::new(EXTEND),
    release: Script::new(RELEASE),
    hand_over: Script::new(HAND_OVER),
});

/// The sources, for `SCRIPT LOAD` at connect time.
pub(crate) const SOURCES: [&str; 4] = [ACQUIRE, EXTEND, RELEASE, HAND_OVER];
