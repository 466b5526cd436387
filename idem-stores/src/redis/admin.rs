//! [`Admin`] for [`RedisStore`]: three scripts of one key each (describe, delete the record
//! seen, delete an ended claim), on the record layout of the module docs. Counting and
//! purging would `SCAN` the whole server, which idem never does to a live cache: those two
//! are [`AdminError::Unsupported`], saying what to do instead.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Fingerprint, Key, StoreError, Token};
use redis::{Script, Value};

use super::record::{self, COMPLETED, HEADER_LEN, IN_PROGRESS, MAGIC};
use super::RedisStore;
use crate::admin::{
    self, Admin, AdminError, DeleteOptions, DeleteSeen, Deletion, RecordInfo, RecordState, Stats,
};

/// `describe(key)`: nil when nothing is there, else `{value, pttl, now_ms}` (the value's
/// expiry and the server's clock, read in the same atomic step as the value).
const DESCRIBE_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v then return false end
local t = redis.call('TIME')
return {v, redis.call('PTTL', KEYS[1]), t[1] * 1000 + math.floor(t[2] / 1000)}
"#;

/// `delete_seen(key; token)`: deletes the record when it is an idem record of `token` that
/// lives (a completed one lives until its `PX`; a claim until its lease deadline).
/// Replies `1` when it deleted, `0` otherwise.
const DELETE_SEEN_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v or #v < 30 or string.sub(v, 1, 5) ~= 'idem1' or string.sub(v, 7, 14) ~= ARGV[1] then
  return 0
end
local state = string.sub(v, 6, 6)
if state == 'P' then
  local d = tonumber(string.sub(v, 31, 45))
  local t = redis.call('TIME')
  if (#v ~= 61 and #v ~= 45) or not d or d <= t[1] * 1000 + math.floor(t[2] / 1000) then return 0 end
elseif state ~= 'C' then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"#;

/// `delete_ended(key)`: deletes a claim whose lease ended (kept for the recovery window);
/// leaves anything else. Replies `0`.
const DELETE_ENDED_LUA: &str = r#"
local v = redis.call('GET', KEYS[1])
if v and (#v == 61 or #v == 45) and string.sub(v, 1, 6) == 'idem1P' then
  local d = tonumber(string.sub(v, 31, 45))
  local t = redis.call('TIME')
  if d and d <= t[1] * 1000 + math.floor(t[2] / 1000) then redis.call('DEL', KEYS[1]) end
end
return 0
"#;

static DESCRIBE: LazyLock<Script> = LazyLock::new(|| Script::new(DESCRIBE_LUA));
static DELETE_SEEN: LazyLock<Script> = LazyLock::new(|| Script::new(DELETE_SEEN_LUA));
static DELETE_ENDED: LazyLock<Script> = LazyLock::new(|| Script::new(DELETE_ENDED_LUA));

#[async_trait]
impl Admin for RedisStore {
    async fn describe(&self, key: &Key) -> Result<Option<RecordInfo>, AdminError> {
        let stored_key = self.record_key(key);
        let script = DESCRIBE.key(&stored_key);
        let reply = self.run("describe", &script).await?;
        let (value, pttl, now) = match reply {
            Value::Nil => return Ok(None),
            Value::Array(parts) => match <[Value; 3]>::try_from(parts) {
                Ok([Value::BulkString(v), Value::Int(pttl), Value::Int(now)]) => (v, pttl, now),
                _ => return Err(unexpected().into()),
            },
            _ => return Err(unexpected().into()),
        };
        if value.len() < HEADER_LEN || !value.starts_with(MAGIC) {
            return Err(record::not_a_record(&value).into());
        }
        let token = Token::from_u64(u64::from_be_bytes(
            value[6..14].try_into().expect("8 bytes"),
        ));
        let fingerprint = Fingerprint::from_slice(&value[14..30]).expect("16 bytes");
        let ms = |n: i64| Duration::from_millis(u64::try_from(n).unwrap_or(0));
        let (state, time_left, payload) = match value[5] {
            COMPLETED => {
                let payload = Bytes::copy_from_slice(&value[HEADER_LEN..]);
                (RecordState::Completed, ms(pttl), Some(payload))
            }
            IN_PROGRESS if record::is_in_progress_len(value.len()) => {
                let deadline = std::str::from_utf8(&value[30..45])
                    .ok()
                    .and_then(|d| d.parse::<i64>().ok())
                    .ok_or_else(|| record::not_a_record(&value))?;
                if deadline <= now {
                    // Ended: kept only so that the next claim can tell it recovered one.
                    return Ok(None);
                }
                (RecordState::InProgress, ms(deadline - now), None)
            }
            _ => return Err(record::not_a_record(&value).into()),
        };
        Ok(Some(RecordInfo {
            state,
            fingerprint,
            token,
            time_left,
            payload,
            stored_key,
            stored_bytes: value.len(),
        }))
    }

    async fn stats(&self) -> Result<Stats, AdminError> {
        Err(AdminError::Unsupported {
            backend: "Redis",
            operation: "stats",
            reason: "counting would SCAN every key of the server, which idem never does to a live cache; count with `redis-cli --scan --pattern 'idem:*'` (your prefix) off-peak",
        })
    }

    async fn delete_record(
        &self,
        key: &Key,
        options: DeleteOptions,
    ) -> Result<Deletion, AdminError> {
        admin::delete_record(self, key, options).await
    }

    async fn purge(&self, _dry_run: bool) -> Result<u64, AdminError> {
        Err(AdminError::Unsupported {
            backend: "Redis",
            operation: "purge-expired",
            reason: "it is not needed: every record is stored with an expiry (PX), and Redis deletes it by itself",
        })
    }

    async fn ensure_schema(&self) -> Result<Option<String>, AdminError> {
        Ok(None)
    }
}

#[async_trait]
impl DeleteSeen for RedisStore {
    async fn delete_seen(&self, key: &Key, token: Token) -> Result<bool, StoreError> {
        let mut script = DELETE_SEEN.key(self.record_key(key));
        script.arg(&record::token_bytes(token)[..]);
        Ok(matches!(self.run("delete", &script).await?, Value::Int(1)))
    }

    async fn delete_ended(&self, key: &Key) -> Result<(), StoreError> {
        let script = DELETE_ENDED.key(self.record_key(key));
        self.run("delete", &script).await.map(drop)
    }
}

fn unexpected() -> StoreError {
    StoreError::Backend {
        backend: super::BACKEND,
        source: "the describe script answered something other than nil or {value, pttl, now}"
            .into(),
    }
}
