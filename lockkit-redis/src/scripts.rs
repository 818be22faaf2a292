//! The Lua scripts: each lock operation is one atomic script, sent with EVALSHA
//! (redis-rs falls back to loading it on NOSCRIPT, e.g. after a server restart).

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// A `TIME` reply `t` in microseconds: a Lua expression.
macro_rules! time_us {
    () => {
        "(tonumber(t[1]) * 1000000 + tonumber(t[2]))"
    };
}

/// A `TIME` reply `t` in milliseconds: a Lua expression.
macro_rules! time_ms {
    () => {
        "(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))"
    };
}

/// The server's clock: `now_us()` in microseconds, `now_ms()` in
/// milliseconds. The hot scripts read it inline (see [`sole_fence_body!`]).
macro_rules! clock {
    () => {
        concat!(
            "local function now_us()\n  local t = redis.call('TIME')\n  return ",
            time_us!(),
            "\nend\nlocal function now_ms()\n  local t = redis.call('TIME')\n  return ",
            time_ms!(),
            "\nend\n"
        )
    };
}

/// Fencing counters: one per lock name (writers and readers) and one per
/// semaphore, each living only as long as it is needed, so that released
/// names leave nothing behind.
///
/// A counter never goes back, even across its own removal: a counter that
/// does not exist (new, removed after a release, expired, or lost with a
/// server that restarted without persistence) starts at the server's clock
/// in microseconds, not at 1, and a counter is only removed once the clock
/// has passed its value, also when the server's clock went back meanwhile
/// (the fault suite's `clock-jump`). Not across a restart without
/// persistence *and* a clock set back: a new counter starts at the clock.
/// Exact in Lua's doubles (2^53 µs is 285 years).
///
/// * Shared holdings (readers, permits) draw with `next_fence(key, ttl)`:
///   `INCR`, starting at the clock when the counter is new. The counter
///   expires with the longest lease drawn from it (`next_fence` never
///   shortens its life; `keep_alive` extends it with the lease), and never
///   before the clock has passed its value; the last holding to go retires
///   it (`retire_fence` makes it expire just after its value, at once when
///   the clock has passed it).
/// * A holding nobody shares (a writer: no live reader is left when it is
///   granted, and none joins while it holds) draws with
///   `next_sole_fence(key, ttl)`, two commands (`TIME` and `SET … GET`,
///   Redis 6.2 or later): the token is the clock itself, or one more than
///   the counter's value if that is not below the clock (only if the clock
///   went back: every draw is a script of its own, which takes longer than
///   the clock's microsecond, and `INCR` draws start at the clock). The
///   counter then holds the writer's token, which the clock has passed by
///   the time the writer releases, so the release deletes the counter
///   outright, in the same `DEL` as the lock key: a later draw starts
///   above it. If the clock went back since the draw, the release leaves
///   the counter to expire just after the clock passes it.
macro_rules! sole_fence {
    () => {
        concat!(
            "local function next_sole_fence(key, ttl)\n",
            sole_fence_body!(),
            "end\n"
        )
    };
}

/// The draw of [`sole_fence_body!`], with the server's `TIME` read
/// already, into `t`: it leaves the token in the local `n`.
macro_rules! sole_fence_draw {
    () => {
        concat!(
            "
  local n = ",
            time_us!(),
            r"
  local last = redis.call('SET', key, string.format('%d', n), 'PX', ttl, 'GET')
  last = last and tonumber(last)
  if last and last >= n then
    n = last + 1
    redis.call('SET', key, string.format('%d', n), 'PX', ttl)
  end
"
        )
    };
}

/// The body of `next_sole_fence(key, ttl)` (see [`sole_fence!`]), to be
/// written out where `key` and `ttl` are set: a script's main chunk
/// creates a closure for every local function it defines, each time it
/// runs, so the hot scripts ([`ACQUIRE`], [`RELEASE`]) define none.
macro_rules! sole_fence_body {
    () => {
        concat!(
            "\n  local t = redis.call('TIME')",
            sole_fence_draw!(),
            "  return n\n"
        )
    };
}

/// The counters of shared holdings (see [`sole_fence!`]'s note). Needs
/// `clock!`.
macro_rules! fences {
    () => {
        r"
local function past_fence_ms(n)
  return math.floor(n / 1000) + 2
end
local function next_fence(key, ttl)
  local n = redis.call('INCR', key)
  local now = now_us()
  if n == 1 then
    n = now
    redis.call('SET', key, string.format('%d', n), 'PX', ttl)
    return n
  end
  local ms = math.floor(now / 1000)
  local at = math.max(ms + tonumber(ttl), past_fence_ms(n))
  local left = redis.call('PTTL', key)
  if left < 0 or left < at - ms then
    redis.call('PEXPIREAT', key, at)
  end
  return n
end
local function retire_fence(key)
  local n = tonumber(redis.call('GET', key))
  if n then
    redis.call('PEXPIREAT', key, past_fence_ms(n))
  end
end
"
    };
}

/// Keeping a sorted set of leases (or a counter) alive as long as its
/// longest lease (so that an abandoned set expires).
macro_rules! lease_sets {
    () => {
        r"
local function keep_alive(key, ttl)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
"
    };
}

/// Renewing one lease: `extend_lock` of a lock key (if it holds `owner`,
/// it and the fence counter last `ttl` ms more), `extend_member` of a
/// member of a sorted set (if `owner`'s lease is live at `now`, it ends
/// `ttl` ms after it, and the set and the counter last as long). Each
/// returns 1 if extended, 0 if the lease is not `owner`'s. Needs
/// `lease_sets!`.
///
/// While a writer holds, its fence counter's life is the writer's alone
/// (its acquire set it with the lock's TTL, and nobody else draws from
/// it), so `extend_lock` sets it as it sets the lock key: three commands a
/// renewal, where `keep_alive` would make it four.
macro_rules! renewals {
    () => {
        r"
local function extend_lock(key, fence, owner, ttl)
  if redis.call('GET', key) == owner then
    redis.call('PEXPIRE', fence, ttl)
    return redis.call('PEXPIRE', key, ttl)
  end
  return 0
end
local function extend_member(set, fence, owner, ttl, now)
  local score = redis.call('ZSCORE', set, owner)
  if score and tonumber(score) > now then
    redis.call('ZADD', set, 'XX', now + ttl, owner)
    keep_alive(set, ttl)
    keep_alive(fence, ttl)
    return 1
  end
  return 0
end
"
    };
}

/// Adding `owner`'s lease to a sorted set of leases (readers, permits),
/// ending `ttl` ms after `now`, and the grant's answer (with a token drawn
/// from `fence_key` when `fencing` is "1"). Needs `clock!`, `fences!` and
/// `lease_sets!`.
macro_rules! join_set {
    () => {
        r"
local function join(set, owner, now, ttl, fence_key, fencing)
  redis.call('ZADD', set, now + ttl, owner)
  keep_alive(set, ttl)
  if fencing == '1' then
    return next_fence(fence_key, ttl)
  end
  return 0
end
"
    };
}

/// The record of a waiter's turn, beside its place in the line (see
/// [`ACQUIRE`]): in the hash `$turns`, under `$waiter`, `$mark` (Lua that
/// prefixes it, or nothing), the time it is fresh until (three quarters of
/// a place's life `$life`, in ms, past its place `$place`, in µs), then
/// `$tail` (`<stamp>|<ttl>|<fencing flag>|<owner>`); the hash lives as long
/// as a place. Each argument is Lua.
macro_rules! record_turn {
    ($turns:literal, $waiter:literal, $place:literal, $life:literal, $mark:literal, $tail:literal) => {
        concat!(
            "    redis.call('HSET', ",
            $turns,
            ", ",
            $waiter,
            ", ",
            $mark,
            "string.format('%d', tonumber(",
            $place,
            ") + tonumber(",
            $life,
            ") * 750) .. '|' .. ",
            $tail,
            ")\n    redis.call('PEXPIRE', ",
            $turns,
            ", ",
            $life,
            ")\n"
        )
    };
}

/// `take_lock()`: the exclusive attempt of [`ACQUIRE`], over its keys and
/// arguments.
macro_rules! take_lock {
    () => {
        concat!("local function take_lock()\n", take_lock_body!(), "end\n")
    };
}

/// The start of every exclusive attempt of a fair lock: while live
/// readers hold (or a waiting writer's record or a waiting line exists:
/// `others`, one `EXISTS`), the refusal of [`readers_refusal!`]. KEYS[3]
/// readers, KEYS[4] waiting writer, `others_keys` the keys counted in
/// `others`.
macro_rules! readers_first {
    ($others_keys:literal) => {
        concat!(
            "
local others = redis.call('EXISTS', ",
            $others_keys,
            ")",
            readers_refusal!(""),
        )
    };
}

/// If `others` (see [`readers_first!`]) and live readers hold: `undo` (Lua
/// that takes back what the attempt did so far), then a refusal that says
/// how long the first reader still holds, recording the caller as the
/// waiting writer when ARGV[4] is "1".
macro_rules! readers_refusal {
    ($undo:literal) => {
        concat!(
            r"
if others > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  local now = ",
            time_ms!(),
            r"
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[1] then
",
            $undo,
            r"
    local wait = tonumber(first[2]) - now
    if ARGV[4] == '1' then
      redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
      wait = math.min(wait, math.floor(tonumber(ARGV[2]) / 2))
    end
    return -3 - wait
  end
end
"
        )
    };
}

/// The end of a granted exclusive attempt: the answer, with a fencing
/// token (see [`sole_fence_body!`]) when ARGV[3] is "1". KEYS[2] the fence
/// counter, ARGV[2] the ttl in ms.
macro_rules! granted {
    () => {
        concat!(
            r"
  if ARGV[3] == '1' then
    local key, ttl = KEYS[2], ARGV[2]
",
            sole_fence_body!(),
            r"
  end
  return 0
"
        )
    };
}

/// The body of `take_lock()`, the exclusive attempt of a fair lock (see
/// [`sole_fence_body!`]).
macro_rules! take_lock_body {
    () => {
        concat!(
            readers_first!("KEYS[3], KEYS[4]"),
            r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if others > 0 then
    redis.call('DEL', KEYS[4])
  end
",
            granted!(),
            r"
end
return -3 - redis.call('PTTL', KEYS[1])
"
        )
    };
}

/// What a lock key holds while it is reserved for the next waiter of the
/// line (see [`ACQUIRE`]): this byte and the waiter's id, a value no owner
/// token (a UUID, with its holder identity after `\x1f`) can have.
pub(crate) const TURN_MARK: char = '\x1e';

/// KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] readers, KEYS[4] waiting
/// writer, KEYS[5] the waiting line (waiter ids by arrival, server time in
/// µs); ARGV[1] owner token, ARGV[2] ttl in ms, ARGV[3] "1" to draw a
/// fencing token, ARGV[4] "1" for an attempt that waits, ARGV[5] the
/// caller's waiter id (one per connection: its tasks queue among
/// themselves first; "" for a client that does not queue in lines),
/// ARGV[6] how long a place in the line lasts without being asked for
/// again (ms), ARGV[7] (optional, may be "") where a new place goes in the
/// line (µs since the Unix epoch by the client's clock, see
/// [`Waiting::Since`]; by default the server's clock on arrival), ARGV[8]
/// (optional, with KEYS[6] the line's turns, a hash of waiter ids) the
/// caller's stamp, for a waiter whose turn grants it the lease (see
/// [`Waiting::Turn`]).
///
/// The lock is granted if it is free and no live reader holds (`SET NX`
/// first: a lock key that exists keeps readers out, so a refused attempt
/// asks nothing of them; one granted while readers hold is taken back at
/// once, with the readers' refusal, see [`readers_refusal!`]), if it is
/// reserved for the caller
/// (`\x1e` and its waiter id: [`RELEASE`] reserves it for the head of the
/// line, for a moment, and wakes that waiter alone), or if it is the
/// caller's already (its turn came, and the release made the lease this
/// owner's: it is counted from now, with a new token); the caller then
/// leaves the line. (A caller in no line, ARGV[5] "", has neither: its
/// refusal reads only the holder's `PTTL`.) A waiting attempt that is refused joins the line (a
/// waiter already in it keeps its place) and is told to ask again within
/// half a place, so that its place stays live; with ARGV[8], it also
/// records the lease its turn is to give it (`<fresh until>|<stamp>|<ttl>|
/// <fencing flag>|<owner>`, under its waiter id in KEYS[6], which lasts as
/// long as the line), fresh for three quarters of a place from now
/// (server time, µs, whatever ARGV[7] placed it by): a live waiter asks
/// again sooner. A waiter that vanished is taken
/// out of the line when its turn comes, and holds the lock up for one
/// reservation; or, if its record is still fresh (it vanished in the
/// second and a half before its turn), for the lease it asked for, as a
/// holder that vanished would.
///
/// Returns one integer, not a table (a table reply costs the server a Lua
/// table and the client an array to parse, on every acquire): when
/// granted, the fencing token (0 without fencing; a token is at least 1),
/// else `-3 - w`, w being how long until a retry may succeed in ms (-1:
/// never by itself; -2: the holding went meanwhile, retry at once), so that
/// every refusal is negative. See `crate::instance::grant_answer`.
const ACQUIRE: &str = concat!(
    r"
local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local others = 0
if granted then
  others = redis.call('EXISTS', KEYS[3], KEYS[4], KEYS[5])
",
    readers_refusal!("    redis.call('DEL', KEYS[1])"),
    r"
elseif ARGV[5] ~= '' then
  local held = redis.call('GET', KEYS[1])
  if held == '\30' .. ARGV[5] or held == ARGV[1] then
    granted = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    others = 1
  end
end
if granted then
  if others > 0 then
    redis.call('DEL', KEYS[4])
    redis.call('ZREM', KEYS[5], ARGV[5])
    if ARGV[8] then
      redis.call('HDEL', KEYS[6], ARGV[5])
    end
  end
",
    granted!(),
    r"
end
local wait = redis.call('PTTL', KEYS[1])
if ARGV[4] == '1' and ARGV[5] ~= '' then
  local place = ARGV[7]
  local now = nil
  if not place or place == '' then
    local t = redis.call('TIME')
    now = ",
    time_us!(),
    r"
    place = now
  end
  redis.call('ZADD', KEYS[5], 'NX', place, ARGV[5])
  redis.call('PEXPIRE', KEYS[5], ARGV[6])
  if ARGV[8] then
    if not now then
      local t = redis.call('TIME')
      now = ",
    time_us!(),
    r"
    end
",
    record_turn!(
        "KEYS[6]",
        "ARGV[5]",
        "now",
        "ARGV[6]",
        "",
        "ARGV[8] .. '|' .. ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[1]"
    ),
    r"
  end
  local half = math.floor(tonumber(ARGV[6]) / 2)
  if wait == -1 or wait > half then
    wait = half
  end
end
return -3 - wait
"
);

/// As [`ACQUIRE`] without its line, in the order the waiters queued:
/// KEYS[5] the queue (a sorted set of waiter ids by arrival, server time
/// in µs), KEYS[6] the
/// queue's deadlines (waiter ids by the end of their place, in ms); ARGV[5]
/// the caller's waiter id, ARGV[6] how long a place lasts without being
/// asked for again (ms). Waiters whose place ran out leave the queue
/// first. Only the head of the queue (or anyone, when it is empty) may
/// take the lock; granted, it leaves the queue. With ARGV[4] = "1" (an
/// acquire that waits) a caller that was refused joins the queue, or keeps
/// its place there for ARGV[6] more, and is told to ask again within half
/// of that.
const ACQUIRE_FAIR: &str = concat!(
    clock!(),
    take_lock!(),
    r"
local now = now_ms()
local gone = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now)
if #gone > 0 then
  redis.call('ZREM', KEYS[5], unpack(gone))
  redis.call('ZREM', KEYS[6], unpack(gone))
end
local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
local result
if head == nil or head == ARGV[5] then
  result = take_lock()
  if result >= 0 then
    if head then
      redis.call('ZREM', KEYS[5], ARGV[5])
      redis.call('ZREM', KEYS[6], ARGV[5])
    end
    return result
  end
else
  result = -3 - redis.call('PTTL', KEYS[1])
end
if ARGV[4] ~= '1' then
  return result
end
local place = tonumber(ARGV[6])
if not redis.call('ZSCORE', KEYS[5], ARGV[5]) then
  redis.call('ZADD', KEYS[5], now_us(), ARGV[5])
end
redis.call('ZADD', KEYS[6], now + place, ARGV[5])
redis.call('PEXPIRE', KEYS[5], place)
redis.call('PEXPIRE', KEYS[6], place)
local half = math.floor(place / 2)
local wait = -3 - result
if wait < 0 or wait > half then
  wait = half
end
return -3 - wait
"
);

/// KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] readers, KEYS[4] waiting
/// writer; ARGV[1] owner token, ARGV[2] ttl in ms, ARGV[3] "1" to draw a
/// fencing token. A shared holding, unless a writer holds or waits.
/// Returns as [`ACQUIRE`].
const ACQUIRE_SHARED: &str = concat!(
    clock!(),
    fences!(),
    lease_sets!(),
    join_set!(),
    r"
local held = redis.call('PTTL', KEYS[1])
if held ~= -2 then
  return -3 - held
end
local waiting = redis.call('PTTL', KEYS[4])
if waiting ~= -2 then
  return -3 - waiting
end
local now = now_ms()
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
return join(KEYS[3], ARGV[1], now, ttl, KEYS[2], ARGV[3])
"
);

/// KEYS[1] permits, KEYS[2] fence counter; ARGV[1] owner token, ARGV[2] ttl
/// in ms, ARGV[3] "1" to draw a fencing token, ARGV[4] the number of
/// permits. Expired permits are reclaimed first. Returns as [`ACQUIRE`].
const ACQUIRE_PERMIT: &str = concat!(
    clock!(),
    fences!(),
    lease_sets!(),
    join_set!(),
    r"
local now = now_ms()
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return -3 - (tonumber(first[2]) - now)
end
return join(KEYS[1], ARGV[1], now, ttl, KEYS[2], ARGV[3])
"
);

/// KEYS[1] a sorted set of leases (readers, permits), KEYS[2] its fence
/// counter; ARGV[1] owner token, ARGV[2] ttl in ms. Returns 1 if the owner's
/// lease was live and now ends ttl from now.
const EXTEND_MEMBER: &str = concat!(
    clock!(),
    lease_sets!(),
    renewals!(),
    r"
return extend_member(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), now_ms())
"
);

/// KEYS[1] a sorted set of leases, KEYS[2] its fence counter, KEYS[3] the
/// lock key of a reader set (for a semaphore, KEYS[1] again); ARGV[1] owner
/// token, ARGV[2] release channel, ARGV[3] "1" if the set's holdings draw
/// fencing tokens. Removes the owner's lease and wakes waiters; the last
/// holding to go retires the counter (if they draw tokens: else it was not
/// drawn from). Returns 1 if the lease was live.
const RELEASE_MEMBER: &str = concat!(
    clock!(),
    fences!(),
    r"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('PUBLISH', ARGV[2], '')
  if ARGV[3] == '1' and redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
    retire_fence(KEYS[2])
  end
  if tonumber(score) > now_ms() then
    return 1
  end
end
return 0
"
);

/// KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] sorted set of leases,
/// KEYS[4] for a fair lock its queue's deadlines (see [`ACQUIRE_FAIR`]),
/// for another lock its waiting line (see [`ACQUIRE`]); ARGV[2] "queue" or
/// "line" to count the waiters there (a fair lock's with a live place, or
/// every client in the line); ARGV[1] "1" if KEYS[1] is a lock key to
/// check (not for a semaphore; a lock key reserved for the next waiter,
/// see [`RELEASE`], is no holding).
/// Returns {holders, remaining ms of the longest lease (-1: no expiry), last
/// fencing token (-1: none), the stored value of one holding (the writer's,
/// or the longest lease's member; "" when free), the waiters counted (-1:
/// not counted)}.
const STATUS: &str = concat!(
    clock!(),
    r"
local fence = tonumber(redis.call('GET', KEYS[2])) or -1
local queued = -1
if ARGV[2] == 'queue' then
  queued = redis.call('ZCOUNT', KEYS[4], '(' .. now_ms(), '+inf')
elseif ARGV[2] == 'line' then
  queued = redis.call('ZCARD', KEYS[4])
end
if ARGV[1] == '1' then
  local held = redis.call('GET', KEYS[1])
  if held and string.byte(held, 1) ~= 30 then
    return {1, redis.call('PTTL', KEYS[1]), fence, held, queued}
  end
end
local now = now_ms()
local n = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
if n > 0 then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  return {n, tonumber(last[2]) - now, fence, last[1], queued}
end
return {0, 0, fence, '', queued}
"
);

/// KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] owner token, ARGV[2]
/// ttl in ms. Returns 1 if extended.
const EXTEND: &str = concat!(
    lease_sets!(),
    renewals!(),
    r"
return extend_lock(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]))
"
);

/// Many renewals in one call (see `crate::renewals`): for the i-th,
/// KEYS[2i-1] its lock key or sorted set, KEYS[2i] its fence counter;
/// ARGV[3i-2] "x" for a lock key or "m" for a member of a sorted set,
/// ARGV[3i-1] owner token, ARGV[3i] ttl in ms. Returns one 1 (extended) or
/// 0 per renewal, in order: each as `EXTEND` or `EXTEND_MEMBER` would.
const EXTEND_MANY: &str = concat!(
    clock!(),
    lease_sets!(),
    renewals!(),
    r"
local now = nil
local extended = {}
for i = 1, #KEYS / 2 do
  local key, fence = KEYS[2 * i - 1], KEYS[2 * i]
  local owner, ttl = ARGV[3 * i - 1], tonumber(ARGV[3 * i])
  if ARGV[3 * i - 2] == 'x' then
    extended[i] = extend_lock(key, fence, owner, ttl)
  else
    now = now or now_ms()
    extended[i] = extend_member(key, fence, owner, ttl, now)
  end
end
return extended
"
);

/// `release_lock()`: the release of a fair lock as a function, over its
/// keys and arguments.
macro_rules! release_lock {
    () => {
        concat!(
            "local function release_lock()\n",
            release_lock_body!(),
            "end\n"
        )
    };
}

/// The body of `release_lock()`: KEYS[1] lock key, KEYS[2] waiting
/// writer, KEYS[3] fence counter; ARGV[1] owner token, ARGV[2] release
/// channel, ARGV[3] "1" to wake waiters, ARGV[5] "1" if the holding drew
/// a fencing token. As [`RELEASE`] without its line: the release is
/// published on the lock's channel. Returns 1 if released.
macro_rules! release_lock_body {
    () => {
        concat!(
            r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local n = ARGV[5] == '1' and tonumber(redis.call('GET', KEYS[3]))
  if not n then
    redis.call('DEL', KEYS[1])
  else
    local t = redis.call('TIME')
    if n >= ",
            time_us!(),
            r" then
      redis.call('DEL', KEYS[1])
      redis.call('PEXPIREAT', KEYS[3], math.floor(n / 1000) + 2)
    else
      redis.call('DEL', KEYS[1], KEYS[3])
    end
  end
  if ARGV[3] == '1' then
    redis.call('PUBLISH', ARGV[2], '')
  end
  return 1
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[2], '')
end
return 0
"
        )
    };
}

/// The end of a [`RELEASE`] that handed the lock to the head of the line
/// (granted or reserved): with ARGV[9] (the record of the releasing
/// client's next turn, `<stamp>|<ttl>|<fencing flag>|<owner>`, see
/// [`ACQUIRE`]), the releasing client takes the last place in the line at
/// once, as a refused attempt that waits would (ARGV[8] how long a place
/// lasts, its record fresh for three quarters of that), its record marked
/// `k` (a kept place: its turn goes to the next in line when nobody
/// listens on its turn channel), and the answer is 2 more. With ARGV[10]
/// (Redlock: µs since the Unix epoch by the client's clock, as
/// [`Waiting::TurnSince`]) the place is there, not at the server's clock,
/// so that it is the same on every instance (its record's freshness is
/// still counted by the server's clock).
macro_rules! keep_place {
    () => {
        concat!(
            r"
      if ARGV[9] and released == 1 and head ~= ARGV[4] then
        t = t or redis.call('TIME')
        local now = ",
            time_us!(),
            r"
        redis.call('ZADD', KEYS[4], 'NX', ARGV[10] or string.format('%d', now), ARGV[4])
        redis.call('PEXPIRE', KEYS[4], ARGV[8])
",
            record_turn!("KEYS[5]", "ARGV[4]", "now", "ARGV[8]", "'k' .. ", "ARGV[9]"),
            r"
        return released + 2
      end
"
        )
    };
}

/// What [`RELEASE`] does with the fence counter of a holding that drew a
/// token (`released` 1, ARGV[6] "1"), unless the next holder draws from it
/// at once: `fence` is true when the counter can go (the server's clock
/// has passed its value); one the clock has not passed, after the clock
/// went back, is left to expire once it has.
macro_rules! releasers_fence {
    () => {
        concat!(
            r"
local fence = false
local n = released == 1 and ARGV[6] == '1' and tonumber(redis.call('GET', KEYS[3]))
if n then
  local t = redis.call('TIME')
  if n >= ",
            time_us!(),
            r" then
    redis.call('PEXPIREAT', KEYS[3], math.floor(n / 1000) + 2)
  else
    fence = true
  end
end
"
        )
    };
}

/// KEYS[1] lock key, KEYS[2] waiting writer, KEYS[3] fence counter, KEYS[4]
/// the waiting line (see [`ACQUIRE`]), KEYS[5] (optional) the line's turns;
/// ARGV[1] owner token, ARGV[2]
/// release channel, ARGV[3] "1" to wake waiters, "0" not to (a rollback,
/// see [`Release`]), ARGV[4] the caller's waiter id, ARGV[5]
/// how long a reservation lasts (ms), ARGV[6] "1" if the holding drew a
/// fencing token.
///
/// If the key holds our token, the holding ends. If it drew a fencing
/// token, the fence counter goes (its value is our token, drawn by
/// `next_sole_fence`: no reader can hold while a writer does, as a reader
/// joins only while the lock key is absent and a writer is granted only
/// once no live reader is left; a counter the server's clock has not yet
/// passed, after the clock went back, is left to expire once it has). A
/// holding without a token (Redlock, Redis Cluster, replicas without
/// `WAIT`) leaves the counter alone: it was not drawn from, and the
/// release spares the `GET` and the `TIME` it would take. Then, when asked to wake waiters,
/// the head of the line leaves it and the lock is reserved for it for
/// ARGV[5] ms, and only it is woken, on its own channel
/// (`<release channel>:<waiter id>`). A head whose turn is recorded in
/// KEYS[5] (the line's turns, see [`ACQUIRE`]; optional), while its record
/// is fresh, is granted the lease it recorded instead, with a fencing token
/// drawn for it if it asked
/// (its waiting-writer record goes, as a grant's does), and the message on
/// its channel says so: `<its stamp>|<token, 0 without>|<owner>`, so that
/// it holds without asking again. Its record becomes `g<owner>`: the
/// lease came from its turn, and a rollback of that owner's attempt
/// (Redlock: an attempt that won no quorum, whose rollback can reach this
/// instance after the turn was granted) leaves it alone. With nobody in line the key goes and
/// the release is published on the lock's channel (readers, and waiters
/// of clients without a line, listen there). A handoff thus wakes one
/// client and costs the same whatever the number of waiters, and a holder
/// that releases and asks again at once queues behind them.
///
/// A holder's release that hands the lock to the head of the line can
/// also keep the releasing client's place (ARGV[7] "", ARGV[8] how long a
/// place lasts, ARGV[9], optionally ARGV[10], see [`keep_place!`]): the client
/// goes to the end of the line in the same step, with the record of its
/// next turn, as if it had asked again at once, and a next acquisition
/// that comes soon waits for that turn without asking (see
/// `crate::places`). The turn of such a kept place goes to the next in
/// line instead when no client listens on its turn channel any more (the
/// `PUBLISH` reached nobody: the client went away, or gave the place up).
///
/// A rollback (ARGV[3] "0": Redlock undoing a grant that won no quorum)
/// deletes the key and wakes nobody, unless the lease came from the
/// caller's turn (its record `g<owner>`, see above: the release that
/// granted it told the caller, which counts it). With ARGV[7], a waiting caller's
/// place (µs, see [`Release::Back`]), and ARGV[8], how long a place lasts
/// without being asked for again (ms), it puts the caller back in the line
/// at that place, and the lock is reserved for the head of the line as a
/// release would reserve it (the head woken, unless it is the caller,
/// which asks again on its own), rather than left free: the grant often
/// came from a reservation for the caller, which another instance, whose
/// release came later, refused, and a key left free would go to whichever
/// waiter asked first, splitting the votes again (where every instance's
/// grant is needed, as with one instance held by a client that died,
/// waiters could go on splitting them for many rounds).
///
/// If the key is reserved for the caller (an acquire that gave up after
/// its turn came), the turn passes to the next waiter the same way; a
/// rollback (ARGV[3] not "1") leaves it the caller's. Otherwise the
/// caller's record as a waiting writer goes, if it is there (waking the
/// readers it kept waiting), and, unless this is a rollback (whose caller
/// still waits), its place in the line, unless the place's recorded turn
/// is another owner's (a later acquisition of the same client took the
/// place over). Returns 1 if released, 3 if released with the place kept,
/// else 0.
const RELEASE: &str = concat!(
    r"
local held = redis.call('GET', KEYS[1])
local released = 0
if held == ARGV[1] then
  if ARGV[3] ~= '1' and KEYS[5] and redis.call('HGET', KEYS[5], ARGV[4]) == 'g' .. ARGV[1] then
    return 0
  end
  released = 1
elseif held == '\30' .. ARGV[4] then
  if ARGV[3] ~= '1' then
    return 0
  end
  redis.call('ZREM', KEYS[4], ARGV[4])
else
  if ARGV[3] == '1' then
    local record = KEYS[5] and redis.call('HGET', KEYS[5], ARGV[4])
    if not record or record == 'g' .. ARGV[1] or string.sub(record, -1 - #ARGV[1]) == '|' .. ARGV[1] then
      redis.call('ZREM', KEYS[4], ARGV[4])
      if record then
        redis.call('HDEL', KEYS[5], ARGV[4])
      end
    end
  end
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
    redis.call('PUBLISH', ARGV[2], '')
  end
  return 0
end
local head = nil
if ARGV[3] == '1' then
  head = redis.call('ZPOPMIN', KEYS[4])[1]
elseif ARGV[7] then
  redis.call('ZADD', KEYS[4], 'NX', ARGV[7], ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[8])
  head = redis.call('ZPOPMIN', KEYS[4])[1]
end
local t = nil
while head do
  local turn = KEYS[5] and redis.call('HGET', KEYS[5], head)
  local kept, fresh, since, ttl, fencing, owner
  if turn then
    kept, fresh, since, ttl, fencing, owner = string.match(turn, '^(k?)(%d+)|(%d+)|(%d+)|(%d)|(.*)$')
    t = redis.call('TIME')
  end
  kept = kept or ''
  if fresh and tonumber(fresh) >= ",
    time_us!(),
    r" then
    local token = 0
    if fencing == '1' then
      local key = KEYS[3]
",
    sole_fence_draw!(),
    r"
      token = n
    else
",
    releasers_fence!(),
    r"
      if fence then
        redis.call('DEL', KEYS[3])
      end
    end
    local told = redis.call('PUBLISH', ARGV[2] .. ':' .. head, since .. '|' .. string.format('%d', token) .. '|' .. owner)
    if told > 0 or kept == '' then
      redis.call('SET', KEYS[1], owner, 'PX', ttl)
      redis.call('HSET', KEYS[5], head, 'g' .. owner)
      redis.call('DEL', KEYS[2])
",
    keep_place!(),
    r"
      return released
    end
  else
",
    releasers_fence!(),
    r"
    if turn then
      redis.call('HDEL', KEYS[5], head)
      turn = nil
    end
    local told = 1
    if kept ~= '' then
      told = redis.call('PUBLISH', ARGV[2] .. ':' .. head, '')
    end
    if told > 0 then
      redis.call('SET', KEYS[1], '\30' .. head, 'PX', ARGV[5])
      if fence then
        redis.call('DEL', KEYS[3])
      end
      if kept == '' and (ARGV[3] == '1' or head ~= ARGV[4]) then
        redis.call('PUBLISH', ARGV[2] .. ':' .. head, '')
      end
",
    keep_place!(),
    r"
      return released
    end
  end
  if turn then
    redis.call('HDEL', KEYS[5], head)
  end
  head = redis.call('ZPOPMIN', KEYS[4])[1]
end
",
    releasers_fence!(),
    r"
if fence then
  redis.call('DEL', KEYS[1], KEYS[3])
else
  redis.call('DEL', KEYS[1])
end
if ARGV[3] == '1' then
  redis.call('PUBLISH', ARGV[2], '')
end
return released
"
);

/// The release of a fair lock (as [`RELEASE`] without its line), and the
/// caller's place in the queue of [`ACQUIRE_FAIR`] goes (an acquire that
/// gave up leaves the queue): KEYS[4] the queue,
/// KEYS[5] its deadlines, ARGV[4] the waiter id, ARGV[5] "1" if the
/// holding drew a fencing token. A release (published when
/// asked) or a place given up wakes the head of the queue on its own
/// channel, `<release channel>:<waiter id>`, and no other waiter.
const RELEASE_FAIR: &str = concat!(
    release_lock!(),
    r"
local left = redis.call('ZREM', KEYS[4], ARGV[4])
redis.call('ZREM', KEYS[5], ARGV[4])
local released = release_lock()
if (released == 1 and ARGV[3] == '1') or left == 1 then
  local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  if head then
    redis.call('PUBLISH', ARGV[2] .. ':' .. head, '')
  end
end
return released
"
);

/// KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] current owner, ARGV[2]
/// next owner, ARGV[3] ttl in ms, ARGV[4] "1" to draw a fencing token.
/// Passes the lease from one owner to the next (a local handoff): returns the
/// new fencing token (0 without fencing), or -1 if the lease was not ARGV[1]'s.
const HAND_OVER: &str = concat!(
    sole_fence!(),
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[4] == '1' then
    return next_sole_fence(KEYS[2], ARGV[3])
  end
  return 0
end
return -1
"
);

pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) acquire_fair: Script,
    pub(crate) acquire_shared: Script,
    pub(crate) acquire_permit: Script,
    pub(crate) extend: Script,
    pub(crate) extend_member: Script,
    pub(crate) extend_many: Script,
    pub(crate) hand_over: Script,
    pub(crate) status: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(ACQUIRE),
    acquire_fair: Script::new(ACQUIRE_FAIR),
    acquire_shared: Script::new(ACQUIRE_SHARED),
    acquire_permit: Script::new(ACQUIRE_PERMIT),
    extend: Script::new(EXTEND),
    extend_member: Script::new(EXTEND_MEMBER),
    extend_many: Script::new(EXTEND_MANY),
    hand_over: Script::new(HAND_OVER),
    status: Script::new(STATUS),
});

/// The sources of [`SCRIPTS`], for `SCRIPT LOAD` at connect time (with
/// those of the deployment's [`Releases`]).
pub(crate) const SOURCES: [&str; 9] = [
    ACQUIRE,
    ACQUIRE_FAIR,
    ACQUIRE_SHARED,
    ACQUIRE_PERMIT,
    EXTEND,
    EXTEND_MEMBER,
    EXTEND_MANY,
    HAND_OVER,
    STATUS,
];

/// What the release of an exclusive holding does besides ending it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Passes the turn to the first client in the lock's line (see
    /// [`Keys::line`](crate::Keys::line)), or with nobody in line
    /// publishes the release: what a holder's release does.
    Wake,
    /// As `Wake`, and a first client in line that recorded the lease its
    /// turn is to give it ([`Waiting::Turn`]) gets that lease at once, and
    /// is told so: what a holder's release does on one server.
    Grant,
    /// Wakes nobody, and leaves this client's place in the line and a
    /// turn reserved for it as they are: the rollback of a grant that won
    /// no quorum (Redlock), whose client still waits.
    Quiet,
    /// As `Quiet`, and puts this client back in the line at this place
    /// (microseconds since the Unix epoch, as [`Waiting::Since`]), then
    /// reserves the lock for the head of the line (waking it if it is
    /// another client): the rollback of a waiting attempt's grant. The
    /// grant took the client out of this instance's line; back in at the
    /// place the other instances have it, the lines stay alike, and the
    /// instances go on reserving the lock for the same waiter.
    Back(u64),
}

impl Release {
    /// The release scripts' argument (ARGV[3]: "1" to wake waiters).
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Release::Wake | Release::Grant => "1",
            Release::Quiet | Release::Back(_) => "0",
        }
    }
}

/// Whether a writer's attempt waits, and where a refused waiting writer's
/// place in the lock's waiting line (see [`Keys::line`](crate::Keys::line)) is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// One try: no record as the waiting writer, no place in the line.
    No,
    /// A waiting attempt, placed in the line by the server's clock when it
    /// arrives.
    ByArrival,
    /// A waiting attempt placed in the line by this time (microseconds since
    /// the Unix epoch, by the client's clock), sent alike to every instance:
    /// Redlock's instances then agree on the head of the line, so that a
    /// release on each of them reserves the lock for the same waiter.
    Since(u64),
    /// A waiting attempt placed in the line by arrival, whose turn grants
    /// it the lease it asked for: the release of the holding before it
    /// makes the lease this owner's ([`Release::Grant`]) and says so on the
    /// waiter's turn channel, so that the waiter holds without asking
    /// again. Its record goes with its place in the line
    /// ([`Keys::turns`](crate::Keys::turns)).
    Turn,
    /// As [`Since`](Self::Since) and [`Turn`](Self::Turn) at once:
    /// placed in the line by `place` (alike on every Redlock instance),
    /// and granted the lease on its turn, its record stamped `stamp` (a
    /// [`turn_stamp`](crate::turn_stamp), taken before the attempt is
    /// sent, the same on every instance), which the turn's message
    /// carries back.
    TurnSince {
        /// Microseconds since the Unix epoch, by the client's clock.
        place: u64,
        /// The attempt's stamp.
        stamp: u64,
    },
}

impl Waiting {
    /// Whether the attempt waits.
    pub fn waits(self) -> bool {
        self != Waiting::No
    }
}

/// How a release is announced to the waiters of other clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Publish {
    /// `PUBLISH`: in Redis Cluster every node gets every message (the
    /// cluster bus broadcasts it), so its cost grows with the cluster.
    Global,
    /// `SPUBLISH` (Redis 7): only the nodes of the shard that owns the
    /// channel's slot, which is the lock key's (`{<lock key>}:released`).
    Sharded,
}

/// The scripts that announce a release, in the form of one [`Publish`].
pub(crate) struct Releases {
    pub(crate) publish: Publish,
    pub(crate) release: Script,
    pub(crate) release_fair: Script,
    pub(crate) release_member: Script,
    /// Their sources, for `SCRIPT LOAD`.
    pub(crate) sources: [String; 3],
}

impl Releases {
    fn of_form(publish: Publish) -> Releases {
        let form = |source: &str| match publish {
            Publish::Global => source.to_owned(),
            Publish::Sharded => source.replace("redis.call('PUBLISH', ", "redis.call('SPUBLISH', "),
        };
        let sources = [form(RELEASE), form(RELEASE_FAIR), form(RELEASE_MEMBER)];
        Releases {
            publish,
            release: Script::new(&sources[0]),
            release_fair: Script::new(&sources[1]),
            release_member: Script::new(&sources[2]),
            sources,
        }
    }

    /// The release scripts that announce with `publish`.
    pub(crate) fn of(publish: Publish) -> &'static Releases {
        static GLOBAL: LazyLock<Releases> = LazyLock::new(|| Releases::of_form(Publish::Global));
        static SHARDED: LazyLock<Releases> = LazyLock::new(|| Releases::of_form(Publish::Sharded));
        match publish {
            Publish::Global => &GLOBAL,
            Publish::Sharded => &SHARDED,
        }
    }
}

/// One call of a script, written straight into one `EVALSHA` command: the
/// keys (their count before them) when the call is made, then the
/// arguments. redis-rs's `ScriptInvocation` allocates each key and argument
/// apart and copies them into a command when invoked: about ten allocations
/// more for each acquire and release.
pub(crate) struct Call {
    script: &'static Script,
    cmd: Cmd,
}

impl Call {
    /// `script` over `keys` (`KEYS[1]`, `KEYS[2]`, …, in order).
    pub(crate) fn new<'k>(
        script: &'static Script,
        keys: impl IntoIterator<Item = &'k str, IntoIter: Clone>,
    ) -> Self {
        let keys = keys.into_iter();
        let count = keys.clone().count();
        // Room for the usual call (the command, the hash, the key count,
        // up to six keys and six arguments), so that the buffers do not
        // grow while it is written.
        let mut cmd = Cmd::with_capacity(16, 384);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(count);
        for key in keys {
            cmd.arg(key);
        }
        Self { script, cmd }
    }

    /// Adds the next argument (`ARGV[1]`, `ARGV[2]`, …).
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// The `EVALSHA` command, for a pipeline.
    pub(crate) fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    /// Loads the script (`SCRIPT LOAD`), as after a `NOSCRIPT` answer.
    pub(crate) async fn load(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<String> {
        self.script.load_async(conn).await
    }

    /// Runs the call, loading the script first if the server does not have
    /// it (a restart, a failover to a replica that never saw it).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(error) if is_no_script(&error) => {
                self.load(conn).await?;
                self.cmd.query_async(conn).await
            }
            result => result,
        }
    }
}

/// Whether the server answered `NOSCRIPT`: it does not have the script.
pub(crate) fn is_no_script(error: &redis::RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_releases_announce_with_spublish_only() {
        let (global, sharded) = (
            Releases::of(Publish::Global),
            Releases::of(Publish::Sharded),
        );
        for (g, s) in global.sources.iter().zip(&sharded.sources) {
            let publishes = g.matches("redis.call('PUBLISH', ").count();
            assert!(publishes > 0, "{g}");
            assert_eq!(s.matches("redis.call('SPUBLISH', ").count(), publishes);
            assert!(!s.contains("'PUBLISH'"), "{s}");
        }
        assert_ne!(global.release.get_hash(), sharded.release.get_hash());
    }
}
