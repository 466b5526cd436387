//! The Lua scripts: one per store step, each writing exactly one key (`KEYS[1]`).
//!
//! Redis runs a script atomically, so each step is one indivisible read-check-write; and
//! since no script on a cluster names a second key, each is valid in Redis Cluster whatever
//! slot the record hashes to. (On a standalone server the claim also reads the epoch key,
//! `KEYS[2]`.) Time comes from the server (`TIME`, `PX`), never from the client.
//!
//! The record layout these scripts read and write is described in the module docs of
//! [`crate::redis`] and decoded on the Rust side in `record.rs`; the offsets below are
//! 1-based Lua string positions of the same layout.
//!
//! Replies (told apart by their Redis type, so that no reply needs a tag):
//! - a bulk string is a whole stored value: a completed record on the replay path, or a
//!   value that is not an idem record at all (the client reports it as corrupt);
//! - an array `{record, lease_ms_left}` is a live in-progress record;
//! - an integer is a status (see each script).

use std::sync::LazyLock;

use redis::Script;

/// Lua shared by the scripts that need the server's clock or the holder check.
///
/// `held(v, token)` answers `1` when `v` is an in-progress record held by `token` whose
/// lease has not ended, `0` (fenced) when it is anything else that idem wrote or nothing,
/// and `-1` when `v` is not an idem record.
macro_rules! prelude {
    () => {
        r#"
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
-- The lease deadline of an in-progress record (61 bytes, or 45 if written before fences);
-- nil for anything else.
local function deadline(v)
  if (#v ~= 61 and #v ~= 45) or string.sub(v, 1, 6) ~= 'idem1P' then return nil end
  return tonumber(string.sub(v, 31, 45))
end
local function held(v, token)
  if not v then return 0 end
  local d = deadline(v)
  if d then
    if string.sub(v, 7, 14) == token and d > now_ms() then return 1 end
    return 0
  end
  if #v >= 30 and string.sub(v, 1, 6) == 'idem1C' then return 0 end
  return -1
end
"#
    };
}

/// `touch(key)`: sets the key's expiry to what it already is. It changes nothing, but it
/// is a write, replicated like any other, and it comes after every earlier write of the key
/// in the replication stream. A step that must be acknowledged by replicas (the store's
/// `wait_for_replicas`) but found nothing to write (a replay, a resent claim or complete)
/// touches the record, so that the `WAIT` that follows on the same connection measures the
/// record's own replication, not whatever this connection last wrote (nothing, after a
/// reconnect: `WAIT` would then answer at once). Redis 7.0 moves a connection's offset on
/// every command, read-only ones too, which covers this already; the touch does not rely
/// on that.
macro_rules! touch {
    () => {
        r#"
local function touch(k)
  local ms = redis.call('PTTL', k)
  if ms > 0 then redis.call('PEXPIRE', k, ms) end
end
"#
    };
}

/// `claim(key[, epoch_key]; request[, durable])`, where `request` is one argument: token (8
/// bytes), fingerprint (16), lease and recovery window in ms (15 ASCII digits each), and
/// after these 54 bytes the epoch the store knows when it gives `epoch_key`. One argument
/// rather than four, because Redis builds the `ARGV` table on every call, the replay too:
/// packed, the replay took 15-20% less server time in `INFO commandstats` (3.7-4.2 us
/// against 4.1-4.9 us per call, interleaved runs on the development machine, where a plain
/// `GET` took 0.4-0.5 us).
///
/// The replay path is first and minimal: one `GET`, one byte compared, the value returned.
/// A fresh key or an ended lease becomes `idem1P | token | fingerprint | deadline | fence`,
/// kept for the lease plus the recovery window so that a later claim can tell it took over
/// an ended lease. The fence is `max(previous + 1, TIME in microseconds)`, the previous one
/// being the ended lease's (0 for a fresh key, or a record written before fences). A live
/// claim held by the request's own token is this claim resent (its reply was lost, or the
/// client retried): it answers acquired again, with its fence, and writes nothing.
/// Before it writes a claim, the script reads the epoch key when it has one (a standalone
/// server: on a cluster the epoch lives in another slot): missing, or another value than
/// the request's, the server lost its records since the store last looked, and the script
/// answers `0` and writes nothing, so that no claim acquires a key whose result may have
/// been lost. An epoch it cannot read (another type, an ACL) is left to the store's
/// periodic check. A replay, a resent claim and another's live claim never read it.
///
/// Replies: the stored value (completed, or not an idem record), `{record, ms_left}` for
/// another's live claim, `{recovered, fence}`, two integers, for a claim acquired
/// (`recovered` 1 when it took over an ended lease, 0 when fresh or resent), or the integer
/// `0` for an epoch missing or changed. With a second argument (`durable`, any value), a
/// replay and a resent claim touch the record (see `touch!`); without it the replay path is
/// as above.
///
/// Fences are Lua numbers (doubles), exact below 2^53: microseconds reach that in 2255.
const CLAIM_LUA: &str = concat!(
    touch!(),
    r#"
local v = redis.call('GET', KEYS[1])
local now, t
local previous = 0
if v then
  if string.byte(v, 6) == 67 then
    if ARGV[2] then touch(KEYS[1]) end
    return v
  end
  if (#v ~= 61 and #v ~= 45) or string.sub(v, 1, 6) ~= 'idem1P' then return v end
  local until_ms = tonumber(string.sub(v, 31, 45))
  if not until_ms then return v end
  if #v == 61 then
    previous = tonumber(string.sub(v, 46, 61))
    if not previous then return v end
  end
  t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
  if until_ms > now then
    if string.sub(v, 7, 14) == string.sub(ARGV[1], 1, 8) then
      if ARGV[2] then touch(KEYS[1]) end
      return {0, previous}
    end
    return {v, until_ms - now}
  end
else
  t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local a = ARGV[1]
if #a > 54 then
  local e = redis.pcall('GET', KEYS[2])
  if type(e) ~= 'table' and e ~= string.sub(a, 55) then return 0 end
end
local fence = math.max(previous + 1, t[1] * 1000000 + t[2])
local lease = tonumber(string.sub(a, 25, 39))
redis.call('SET', KEYS[1], 'idem1P' .. string.sub(a, 1, 24) .. string.format('%015d', now + lease)
  .. string.format('%016d', fence), 'PX', lease + tonumber(string.sub(a, 40, 54)))
if v then return {1, fence} end
return {0, fence}
"#
);

/// `complete(key; token, payload, ttl_ms[, durable])`: the held record becomes
/// `idem1C | token | fingerprint | payload` for `ttl_ms`. A record that `token` already
/// completed is this complete resent: `1`, and the record is left as it is (touched, with
/// `durable`, for the `WAIT` after it). Replies `1`,
/// `0` (fenced) or `-1` (not an idem record).
const COMPLETE_LUA: &str = concat!(
    prelude!(),
    touch!(),
    r#"
local v = redis.call('GET', KEYS[1])
if v and #v >= 30 and string.sub(v, 1, 6) == 'idem1C' and string.sub(v, 7, 14) == ARGV[1] then
  if ARGV[4] then touch(KEYS[1]) end
  return 1
end
local h = held(v, ARGV[1])
if h ~= 1 then return h end
redis.call('SET', KEYS[1], 'idem1C' .. string.sub(v, 7, 30) .. ARGV[2], 'PX', ARGV[3])
return 1
"#
);

/// `release(key; token)`: deletes the held record. Nothing under the key is a release
/// resent after the first deleted it: `1`. Otherwise replies like `complete`.
const RELEASE_LUA: &str = concat!(
    prelude!(),
    r#"
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
local h = held(v, ARGV[1])
if h ~= 1 then return h end
redis.call('DEL', KEYS[1])
return 1
"#
);

/// `extend(key; token, lease_ms, recovery_ms)`: moves the held record's deadline to
/// `lease_ms` from now, and keeps its fence (what follows the deadline). Replies like
/// `complete`.
const EXTEND_LUA: &str = concat!(
    prelude!(),
    r#"
local v = redis.call('GET', KEYS[1])
local h = held(v, ARGV[1])
if h ~= 1 then return h end
local lease = tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.sub(v, 1, 30) .. string.format('%015d', now_ms() + lease)
  .. string.sub(v, 46), 'PX', lease + tonumber(ARGV[3]))
return 1
"#
);

/// `get(key)`: nil when nothing lives there (an ended lease counts as nothing), the stored
/// value when it is completed (or not an idem record), `{record, ms_left}` when held.
const GET_LUA: &str = concat!(
    prelude!(),
    r#"
local v = redis.call('GET', KEYS[1])
if not v then return false end
local d = deadline(v)
if d then
  local left = d - now_ms()
  if left > 0 then return {v, left} end
  return false
end
return v
"#
);

/// `delete(key)`: deletes whatever lives under the key, even a value of another Redis
/// type. Replies `1` when something live was there, `0` otherwise (an ended lease is not
/// live).
const DELETE_LUA: &str = concat!(
    prelude!(),
    r#"
local v = redis.pcall('GET', KEYS[1])
local live = 1
if not v then
  live = 0
elseif type(v) == 'string' and (deadline(v) or math.huge) <= now_ms() then
  live = 0
end
redis.call('DEL', KEYS[1])
return live
"#
);

/// `replace(key; expected, ttl_ms, payload[, durable])`: when the record is a completed
/// one whose payload (what follows its 30-byte header) is exactly `expected`, it becomes the
/// same header and `payload` for `ttl_ms` (token and fingerprint kept), or with a `ttl_ms`
/// of `0` is deleted: `1`. Anything else (no record, an in-progress claim, ended or not,
/// another payload) is left as it is: `0`, the record touched with `durable` (see
/// `touch!`). A value that is not an idem record: `-1`. A record that expired is gone
/// (`PX`), so a completed record found is live.
const REPLACE_LUA: &str = concat!(
    prelude!(),
    touch!(),
    r#"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local completed = #v >= 30 and string.sub(v, 1, 6) == 'idem1C'
if completed and string.sub(v, 31) == ARGV[1] then
  if ARGV[2] == '0' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], string.sub(v, 1, 30) .. ARGV[3], 'PX', ARGV[2])
  end
  return 1
end
if not completed and not deadline(v) then return -1 end
if ARGV[4] then touch(KEYS[1]) end
return 0
"#
);

pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE_LUA));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
pub(crate) static GET: LazyLock<Script> = LazyLock::new(|| Script::new(GET_LUA));
pub(crate) static DELETE: LazyLock<Script> = LazyLock::new(|| Script::new(DELETE_LUA));
pub(crate) static REPLACE: LazyLock<Script> = LazyLock::new(|| Script::new(REPLACE_LUA));

/// Every script, for loading them all at connect time (so that the first call of each step
/// is one `EVALSHA`, not `EVALSHA`, `NOSCRIPT`, `SCRIPT LOAD`, `EVALSHA`).
pub(crate) fn all() -> [&'static Script; 7] {
    [
        &CLAIM, &COMPLETE, &RELEASE, &EXTEND, &GET, &DELETE, &REPLACE,
    ]
}
