//! `idem`: what an operator runs when a key is stuck. Shows a record, deletes it, purges
//! ended records, counts records by state, and migrates a store's table, on any store URL
//! that `idem::connect` opens.
//!
//! Exit codes: 0 done; 1 the store failed or could not be reached; 2 bad usage (a bad URL,
//! key or flag); 3 this store cannot do that; 4 no record under the key.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_core::{Error, Key, Record, Store};
use idem_stores::{MySqlStore, PostgresStore, RedisStore, SqliteStore};
use serde_json::{json, Value};

const EXAMPLES: &str = "\
Examples:
  idem get postgres://app@db/payments billing::charge/order-42
  idem get --json 'sqlite:///var/lib/app/idem.db' billing::charge/order-42 | jq .state
  idem delete rediss://:secret@cache:6380 billing::charge/order-42
  idem stats postgres://app@db/payments?sslmode=require
  idem purge-expired sqlite:///var/lib/app/idem.db
  idem migrate --table idem.records postgres://admin@db/payments

Exit codes: 0 done, 1 store failure, 2 bad usage, 3 not supported by this store, 4 no record.";

/// Exit code: the store failed or could not be reached.
const FAILED: u8 = 1;
/// Exit code: a bad URL, key or flag (clap uses 2 for its own usage errors too).
const USAGE: u8 = 2;
/// Exit code: this store cannot do what was asked.
const UNSUPPORTED: u8 = 3;
/// Exit code: no record under the key.
const NOT_FOUND: u8 = 4;

/// Inspect and repair idem's idempotency records.
#[derive(Parser)]
#[command(name = "idem", version, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the record under a key: state, fingerprint, time left, payload.
    Get {
        #[command(flatten)]
        target: Target,
        /// The key, `scope/id` (the scope as `#[idempotent]` names it, the id as given).
        key: String,
    },
    /// Delete the record under a key, so that the next call runs its body again.
    Delete {
        #[command(flatten)]
        target: Target,
        /// The key, `scope/id`.
        key: String,
    },
    /// Delete ended records (expired results, leases that ended) from a SQL store.
    PurgeExpired {
        #[command(flatten)]
        target: Target,
    },
    /// Count records by state: in_progress, completed, ended (awaiting purge).
    Stats {
        #[command(flatten)]
        target: Target,
    },
    /// Create the store's table, or bring it to this build's schema.
    Migrate {
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Args)]
struct Target {
    /// The store URL: postgres://, sqlite://, mysql://, redis://, rediss://,
    /// redis+cluster://.
    url: String,
    /// The SQL table (as the service's store names it).
    #[arg(long, default_value = "idem_records")]
    table: String,
    /// The Redis key prefix (as the service's store names it).
    #[arg(long, default_value = idem_stores::redis::DEFAULT_PREFIX)]
    prefix: String,
    /// Print JSON, for scripts.
    #[arg(long)]
    json: bool,
}

/// What a command failed with: its message and exit code.
struct Failure(u8, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::Config { .. } | Error::InvalidKey { .. } => USAGE,
            _ => FAILED,
        };
        Failure(code, chain(&e))
    }
}

impl From<idem_core::StoreError> for Failure {
    fn from(e: idem_core::StoreError) -> Self {
        let hint = match e {
            idem_core::StoreError::NotSetUp { .. } => {
                " (`idem migrate <url>` creates it, with `--table` if the service names one)"
            }
            _ => "",
        };
        Failure(FAILED, chain(&e) + hint)
    }
}

/// A failed query of this command's own, with the hint to migrate when its table is missing
/// (Postgres 42P01, MySQL 1146, SQLite's `no such table`).
fn sql_failure(e: sqlx::Error) -> Failure {
    let missing = match &e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("42P01" | "1146"))
                || db.message().contains("no such table")
        }
        _ => false,
    };
    let hint = if missing {
        " (`idem migrate <url>` creates it, with `--table` if the service names one)"
    } else {
        ""
    };
    Failure(FAILED, chain(&e) + hint)
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// The store a URL opens, kept by its concrete type for what the `Store` trait does not
/// offer (purge, stats, migrate, time left of a completed record).
enum Opened {
    Postgres(PostgresStore),
    Sqlite(SqliteStore),
    MySql(MySqlStore),
    Redis(RedisStore),
}

fn scheme(url: &str) -> &str {
    url.split_once("://").map_or("", |(s, _)| s)
}

/// Opens the store; creates or migrates its table only when `migrate` (an inspection must
/// not change the database).
async fn open(t: &Target, migrate: bool) -> Result<Opened, Failure> {
    let url = t.url.as_str();
    Ok(match scheme(url) {
        "postgres" | "postgresql" => Opened::Postgres(
            PostgresStore::builder()
                .table(&t.table)
                .migrate(migrate)
                .connect(url)
                .await?,
        ),
        "sqlite" => Opened::Sqlite(
            SqliteStore::builder()
                .table(&t.table)
                .migrate(migrate)
                .connect(url)
                .await?,
        ),
        "mysql" | "mariadb" => Opened::MySql(
            MySqlStore::builder()
                .table(&t.table)
                .migrate(migrate)
                .connect(url)
                .await?,
        ),
        "redis" | "rediss" | "redis+unix" | "redis+cluster" | "rediss+cluster" => {
            Opened::Redis(RedisStore::builder().prefix(&t.prefix).open(url).await?)
        }
        "memory" => {
            return Err(Failure(
                UNSUPPORTED,
                "memory:// lives inside one process: no other process, this command included, can see its records".into(),
            ))
        }
        other => {
            return Err(Failure(
                USAGE,
                format!("unknown store URL scheme `{other}`: expected postgres, sqlite, mysql, redis, rediss or redis+cluster"),
            ))
        }
    })
}

impl Opened {
    fn store(&self) -> &dyn Store {
        match self {
            Opened::Postgres(s) => s,
            Opened::Sqlite(s) => s,
            Opened::MySql(s) => s,
            Opened::Redis(s) => s,
        }
    }
}

/// `scope/id` as a key: split at the first `/` (a scope has none).
fn parse_key(s: &str) -> Result<Key, Failure> {
    let Some((scope, id)) = s.split_once('/') else {
        return Err(Failure(
            USAGE,
            format!("`{s}` is not a key: expected `scope/id`, e.g. `billing::charge/order-42`"),
        ));
    };
    Ok(Key::new(scope, id)?)
}

/// A table name quoted for the dialect, part by part (`schema.table` on Postgres); the
/// store's builder has already checked that each part is an identifier.
fn quoted(table: &str, q: char) -> String {
    table
        .split('.')
        .map(|part| format!("{q}{part}{q}"))
        .collect::<Vec<_>>()
        .join(".")
}

const SQLITE_NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
const MYSQL_NOW_MS: &str =
    "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)";

/// How long the record under `key` still lives, on the store's own clock.
async fn time_left(opened: &Opened, url: &str, key: &Key) -> Result<Option<Duration>, Failure> {
    let ms: Option<i64> = match opened {
        Opened::Postgres(s) => {
            let sql = format!(
                "SELECT (extract(epoch FROM ends_at - now()) * 1000)::int8 FROM {} WHERE key = $1",
                quoted(&s.table(), '"')
            );
            sqlx::query_scalar(&sql)
                .bind(key.as_str())
                .fetch_optional(s.pool())
                .await
                .map_err(sql_failure)?
        }
        Opened::Sqlite(s) => {
            let sql = format!(
                "SELECT ends_at - {SQLITE_NOW_MS} FROM {} WHERE key = ?1",
                quoted(&s.table(), '"')
            );
            sqlx::query_scalar(&sql)
                .bind(key.as_str())
                .fetch_optional(s.pool())
                .await
                .map_err(sql_failure)?
        }
        Opened::MySql(s) => {
            let sql = format!(
                "SELECT CAST(ends_at - {MYSQL_NOW_MS} AS SIGNED) FROM {} WHERE `key` = ?",
                quoted(&s.table(), '`')
            );
            sqlx::query_scalar(&sql)
                .bind(key.as_str())
                .fetch_optional(s.pool())
                .await
                .map_err(sql_failure)?
        }
        Opened::Redis(s) => {
            if scheme(url).ends_with("+cluster") {
                // A cluster needs its own client to ask a node; the state is shown anyway.
                return Ok(None);
            }
            let client = redis::Client::open(url).map_err(|e| Failure(USAGE, chain(&e)))?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| Failure(FAILED, chain(&e)))?;
            let pttl: i64 = redis::cmd("PTTL")
                .arg(s.record_key(key))
                .query_async(&mut conn)
                .await
                .map_err(|e| Failure(FAILED, chain(&e)))?;
            // -1: no expiry, -2: no key.
            (pttl >= 0).then_some(pttl)
        }
    };
    Ok(ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
}

/// Counts by state, on the store's own clock.
async fn counts(opened: &Opened) -> Result<Vec<(String, i64)>, Failure> {
    let state = |now: &str, completed: &str| {
        format!(
            "CASE WHEN ends_at <= {now} THEN 'ended' WHEN {completed} THEN 'completed' ELSE 'in_progress' END"
        )
    };
    let err = sql_failure;
    match opened {
        Opened::Postgres(s) => {
            let sql = format!(
                "SELECT {} AS state, count(*)::int8 FROM {} GROUP BY 1",
                state("now()", "completed"),
                quoted(&s.table(), '"')
            );
            sqlx::query_as(&sql).fetch_all(s.pool()).await.map_err(err)
        }
        Opened::Sqlite(s) => {
            let sql = format!(
                "SELECT {} AS state, count(*) FROM {} GROUP BY 1",
                state(SQLITE_NOW_MS, "completed <> 0"),
                quoted(&s.table(), '"')
            );
            sqlx::query_as(&sql).fetch_all(s.pool()).await.map_err(err)
        }
        Opened::MySql(s) => {
            let sql = format!(
                "SELECT CAST({} AS CHAR) AS state, CAST(count(*) AS SIGNED) FROM {} GROUP BY 1",
                state(MYSQL_NOW_MS, "completed"),
                quoted(&s.table(), '`')
            );
            sqlx::query_as(&sql).fetch_all(s.pool()).await.map_err(err)
        }
        Opened::Redis(_) => Err(Failure(
            UNSUPPORTED,
            "stats is not supported on Redis: counting would SCAN every key of the server, which idem never does to a live cache; count with `redis-cli --scan --pattern 'idem:*'` (your prefix) off-peak".into(),
        )),
    }
}

/// The envelope's header, and its payload decoded when its codec is JSON.
fn describe_payload(bytes: &[u8]) -> Value {
    // magic "idem", format, codec id, kind, result version (u64 LE), payload.
    if bytes.len() < 15 || &bytes[..4] != b"idem" {
        return json!({ "error": "not an idem record envelope", "bytes": bytes.len() });
    }
    let codec = match bytes[5] {
        1 => "json",
        2 => "postcard",
        3 => "bincode",
        _ => "custom",
    };
    let kind = if bytes[6] == 1 { "error" } else { "value" };
    let version = u64::from_le_bytes(bytes[7..15].try_into().expect("8 bytes"));
    let payload = &bytes[15..];
    let decoded = if codec == "json" {
        serde_json::from_slice::<Value>(payload).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    json!({
        "format": bytes[4],
        "codec": codec,
        "codec_id": bytes[5],
        "kind": kind,
        "result_version": version,
        "bytes": payload.len(),
        "value": decoded,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs the command; answers what to print and the exit code.
async fn run(command: Command) -> Result<(String, u8), Failure> {
    match command {
        Command::Get { target, key } => {
            let key = parse_key(&key)?;
            let opened = open(&target, false).await?;
            let Some(record) = opened.store().get(&key).await? else {
                return Err(Failure(NOT_FOUND, format!("no live record under `{key}`")));
            };
            let out = match record {
                Record::InProgress {
                    fingerprint,
                    token,
                    lease_remaining,
                } => json!({
                    "key": key.as_str(),
                    "state": "in_progress",
                    "fingerprint": hex(fingerprint.as_bytes()),
                    "token": token.to_string(),
                    "lease_left_ms": ms(lease_remaining),
                }),
                Record::Completed {
                    fingerprint,
                    payload,
                } => {
                    let left = time_left(&opened, &target.url, &key).await?;
                    json!({
                        "key": key.as_str(),
                        "state": "completed",
                        "fingerprint": hex(fingerprint.as_bytes()),
                        "expires_in_ms": left.map(ms),
                        "payload": describe_payload(&payload),
                    })
                }
                _ => json!({ "key": key.as_str(), "state": "unknown" }),
            };
            Ok((render(&out, target.json), 0))
        }
        Command::Delete { target, key } => {
            let key = parse_key(&key)?;
            let opened = open(&target, false).await?;
            let deleted = opened.store().delete(&key).await?;
            let out = json!({ "key": key.as_str(), "deleted": deleted });
            let code = if deleted { 0 } else { NOT_FOUND };
            if target.json {
                Ok((out.to_string(), code))
            } else if deleted {
                Ok((format!("deleted `{key}`"), 0))
            } else {
                Ok((
                    format!("no record under `{key}`: nothing deleted"),
                    NOT_FOUND,
                ))
            }
        }
        Command::PurgeExpired { target } => {
            let opened = open(&target, false).await?;
            let purged = match &opened {
                Opened::Postgres(s) => s.purge_expired(1000).await?,
                Opened::Sqlite(s) => s.purge_expired(1000).await?,
                Opened::MySql(s) => s.purge_expired(1000).await?,
                Opened::Redis(_) => {
                    return Err(Failure(
                        UNSUPPORTED,
                        "purge-expired is not needed on Redis: every record is stored with an expiry (PX), and Redis deletes it by itself".into(),
                    ))
                }
            };
            let out = json!({ "purged": purged });
            Ok((render(&out, target.json), 0))
        }
        Command::Stats { target } => {
            let opened = open(&target, false).await?;
            let mut by_state = serde_json::Map::new();
            for state in ["in_progress", "completed", "ended"] {
                by_state.insert(state.into(), json!(0));
            }
            for (state, n) in counts(&opened).await? {
                by_state.insert(state, json!(n));
            }
            Ok((render(&Value::Object(by_state), target.json), 0))
        }
        Command::Migrate { target } => {
            let opened = open(&target, true).await?;
            let what = match &opened {
                Opened::Postgres(s) => format!("table `{}` is at this build's schema", s.table()),
                Opened::Sqlite(s) => format!("table `{}` is at this build's schema", s.table()),
                Opened::MySql(s) => format!("table `{}` is at this build's schema", s.table()),
                Opened::Redis(_) => "nothing to migrate: Redis keeps no schema".into(),
            };
            let out = json!({ "migrated": what });
            Ok((if target.json { out.to_string() } else { what }, 0))
        }
    }
}

/// `--json`: one JSON object; otherwise one `name: value` line per field.
fn render(v: &Value, as_json: bool) -> String {
    if as_json {
        return v.to_string();
    }
    let mut lines = Vec::new();
    fn walk(prefix: &str, v: &Value, lines: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    // A decoded payload prints as JSON on its line; other objects nest.
                    match v {
                        Value::Object(_) if k != "value" => walk(&name, v, lines),
                        _ => lines.push(format!("{name}: {}", plain(v))),
                    }
                }
            }
            other => lines.push(format!("{prefix}: {}", plain(other))),
        }
    }
    walk("", v, &mut lines);
    lines.join("\n")
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: cannot start the runtime: {e}");
            return ExitCode::from(FAILED);
        }
    };
    match rt.block_on(run(cli.command)) {
        Ok((out, code)) => {
            println!("{out}");
            ExitCode::from(code)
        }
        Err(Failure(code, message)) => {
            eprintln!("idem: {message}");
            ExitCode::from(code)
        }
    }
}
