//! The Lua scripts: each lock operation is one atomic script, sent with EVALSHA
//! (redis-rs falls back to loading it on NOSCRIPT, e.g. after a server restart).

use std::sync::LazyLock;

use redis::Script;

/// Draws the next fencing token from the counter `key`. A counter that did
/// not exist (new, or lost with a server that restarted without persistence)
/// starts at the server's clock in microseconds instead of 1, so tokens keep
/// increasing across such a loss: every earlier token was drawn from a counter
/// that started at an earlier clock reading and grew by one per grant, far
/// slower than a microsecond clock. Holds while the server's clock does not go
/// back. Exact in Lua's doubles (2^53 µs is 285 years).
macro_rules! next_fence {
    () => {
        r"
local function next_fence(key)
  local n = redis.call('INCR', key)
  if n == 1 then
    local now = redis.call('TIME')
    local start = now[1] .. string.format('%06d', now[2])
    redis.call('SET', key, start)
    return tonumber(start)
  end
  return n
end
"
    };
}

/// KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] owner token, ARGV[2] ttl in
/// ms, ARGV[3] "1" to draw a fencing token.
/// Returns {1, fencing token (0 without fencing)} when granted, {0, holder's PTTL} when not.
const ACQUIRE: &str = concat!(
    next_fence!(),
    r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    return {1, next_fence(KEYS[2])}
  end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
"
);

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
const HAND_OVER: &str = concat!(
    next_fence!(),
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[4] == '1' then
    return next_fence(KEYS[2])
  end
  return 0
end
return -1
"
);

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
