//! `idem`: what an operator runs when a key is stuck. Shows a record, deletes it, purges
//! ended records, counts records by state, and migrates a store's table, on any store URL
//! that `idem::connect` opens; acknowledges that a Redis lost its records; shows the steps
//! of a call and resolves a step whose outcome is unknown.
//!
//! Exit codes: 0 done; 1 the store failed or could not be reached; 2 bad usage (a bad URL,
//! key, step name or flag); 3 this store cannot do that, or refused (a live claim, a step
//! that is not held); 4 no record under the key.
#![deny(missing_docs)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_core::envelope;
use idem_core::{Error, Idem, Key, Resolution, Resolved, StoreError};
use idem_http::ClientIdentity;
use idem_stores::admin::{self, Admin, AdminError, DeleteOptions, Deletion, RecordInfo};
use serde_json::{json, Value};

const EXAMPLES: &str = "\
Examples:
  idem get postgres://app@db/payments billing::charge/order-42
  idem get postgres://app@db/payments --scope payments --idempotency-key 8e03978e-40d5 --principal cus_42
  IDEM_HTTP_SECRET=... idem get redis://cache --scope payments --idempotency-key 8e03978e-40d5 \
      --credential 'Authorization: Bearer <the customer's token>' --secret-env IDEM_HTTP_SECRET
  idem get --json 'sqlite:///var/lib/app/idem.db' billing::charge/order-42 | jq .state
  idem delete rediss://:secret@cache:6380 billing::charge/order-42
  idem delete --dry-run postgres://app@db/payments billing::charge/order-43
  idem stats postgres://app@db/payments?sslmode=require
  idem purge-expired --dry-run sqlite:///var/lib/app/idem.db
  idem migrate --table idem.records postgres://admin@db/payments
  idem acknowledge-lost-records --prefix billing:idem: redis://cache:6379
  idem steps postgres://app@db/payments shop::checkout/order-42 charge reserve email
  idem resolve postgres://app@db/payments shop::checkout/order-42 charge --ran --value '\"ch_1\"'
  idem resolve postgres://app@db/payments shop::checkout/order-42 charge --not-ran

Exit codes: 0 done, 1 store failure, 2 bad usage, 3 not possible on this store or refused
(a live claim without --force, a step to resolve that is not held), 4 no record (nothing
under the key or any step named).";

/// Exit code: the store failed or could not be reached.
const FAILED: u8 = 1;
/// Exit code: a bad URL, key or flag (clap uses 2 for its own usage errors too).
const USAGE: u8 = 2;
/// Exit code: this store cannot do what was asked, or it was refused (a live claim).
const NOT_POSSIBLE: u8 = 3;
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
    /// Show the record under a key: state, fingerprint, token, time left, sizes, payload.
    /// For the HTTP layer, `--scope` and `--idempotency-key` with the client find the record
    /// of a customer's `Idempotency-Key`.
    Get {
        #[command(flatten)]
        target: Target,
        /// The key, `scope/id` (the scope as `#[idempotent]` names it, the id as given).
        #[arg(
            required_unless_present = "idempotency_key",
            conflicts_with = "idempotency_key"
        )]
        key: Option<String>,
        #[command(flatten)]
        http: HttpKey,
    },
    /// Delete the record under a key, so that the next call runs its body again. A live
    /// claim (a call still running) is refused without `--force`: deleting it lets a
    /// second run start beside the first.
    Delete {
        #[command(flatten)]
        target: Target,
        /// The key, `scope/id`.
        key: String,
        /// Delete a live claim too.
        #[arg(long)]
        force: bool,
        /// Delete nothing; show what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show the records of a call's steps (`idem::step`): each named step completed (with
    /// its value), held (its outcome unknown), running or none, and whether the key itself
    /// is held, and by which step.
    Steps {
        #[command(flatten)]
        target: Target,
        /// The call's key, `scope/id`.
        key: String,
        /// The step names, as the body names them (`charge`, `email.0`).
        #[arg(required = true)]
        steps: Vec<String>,
    },
    /// Resolve a step whose outcome is unknown, which holds its call's key: `--ran` (it
    /// took effect; later attempts get `--value` as the step's value) or `--not-ran` (the
    /// next attempt runs it). The key's next call then runs its body, which replays the
    /// completed steps and runs the rest. A step that is not held is refused (exit 3).
    Resolve {
        #[command(flatten)]
        target: Target,
        /// The call's key, `scope/id`.
        key: String,
        /// The step whose outcome is unknown.
        step: String,
        /// The step took effect.
        #[arg(long, conflicts_with = "not_ran", required_unless_present = "not_ran")]
        ran: bool,
        /// The step did not take effect: the next attempt runs it.
        #[arg(long)]
        not_ran: bool,
        /// With `--ran` (required there): the step's value as JSON, what the step would
        /// have returned (`'"ch_1"'`, `'{"id":"ch_1"}'`; `null` for a step returning `()`).
        /// A value the step's type cannot decode holds the key again at its next call.
        #[arg(long, conflicts_with = "not_ran")]
        value: Option<String>,
        /// With `--ran`: how long the step's record lives, in seconds (default: what the
        /// hold had left).
        #[arg(long, conflicts_with = "not_ran")]
        ttl: Option<u64>,
    },
    /// Delete ended records (expired results, leases that ended) from a SQL store.
    PurgeExpired {
        #[command(flatten)]
        target: Target,
        /// Delete nothing; count what would be deleted.
        #[arg(long)]
        dry_run: bool,
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
    /// Redis: acknowledge that the server lost idem's records (a restart without
    /// persistence, a flush, a failover to an empty replica), so that stores that refuse
    /// claims of keys without a record since (`LostRecords::FailClaimsUntilAcknowledged`, or
    /// the rest of a refusal window) go on. Keys completed before the loss run again.
    AcknowledgeLostRecords {
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
    #[arg(long, default_value = idem_stores::DEFAULT_REDIS_PREFIX)]
    prefix: String,
    /// Print JSON, for scripts.
    #[arg(long)]
    json: bool,
}

/// A request's key as the HTTP layer stores it: the service's scope, the customer's
/// `Idempotency-Key`, and its client, as the layer's identity tells it.
#[derive(Args)]
struct HttpKey {
    /// The HTTP layer's scope (`IdempotencyLayer::scope`).
    #[arg(long, requires = "idempotency_key")]
    scope: Option<String>,
    /// The customer's `Idempotency-Key`, as they sent it.
    #[arg(long, requires = "scope")]
    idempotency_key: Option<String>,
    /// The client is this principal (`ClientIdentity::principal`: the user id the
    /// service's authentication found).
    #[arg(long, conflicts_with_all = ["shared", "credential"])]
    principal: Option<String>,
    /// The key space is shared (`ClientIdentity::shared`, `share_anonymous`).
    #[arg(long, conflicts_with = "credential")]
    shared: bool,
    /// A credential header of the client, `Name: value` (`ClientIdentity::credentials`;
    /// repeat for several; a cookie as `Cookie: session=...`).
    #[arg(long)]
    credential: Vec<String>,
    /// The environment variable that holds the layer's secret (`ClientIdentity::keyed`);
    /// never on the command line, where other users of the machine see it.
    #[arg(long, requires = "credential", conflicts_with = "unkeyed")]
    secret_env: Option<String>,
    /// The layer digests credentials without a secret (`ClientIdentity::unkeyed`).
    #[arg(long, requires = "credential")]
    unkeyed: bool,
}

impl HttpKey {
    /// The stored key the HTTP layer keeps this customer's key under.
    fn stored_key(&self) -> Result<Key, Failure> {
        let usage = |m: String| Failure(USAGE, m);
        let (Some(scope), Some(key)) = (&self.scope, &self.idempotency_key) else {
            return Err(usage(
                "give a key (`scope/id`) or `--scope` and `--idempotency-key`".into(),
            ));
        };
        let mut request = http::Request::post("/");
        for line in &self.credential {
            let Some((name, value)) = line.split_once(':') else {
                // Not echoed: the argument may be a token with its colon forgotten.
                return Err(usage(
                    "a --credential is not `Name: value` (e.g. `Authorization: Bearer ...`)".into(),
                ));
            };
            let name = http::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                usage(format!(
                    "--credential: `{}` is not a header name",
                    name.trim()
                ))
            })?;
            let value = http::HeaderValue::from_str(value.trim()).map_err(|_| {
                usage(format!(
                    "--credential `{name}`: the value is not a valid header value"
                ))
            })?;
            request = request.header(name, value);
        }
        let request = request
            .body(())
            .map_err(|e| usage(format!("--credential: {e}")))?
            .into_parts()
            .0;
        let identity = if let Some(principal) = &self.principal {
            let principal = principal.clone();
            ClientIdentity::principal(move |_| Some(principal.clone()))
        } else if self.shared {
            ClientIdentity::shared()
        } else if self.credential.is_empty() {
            return Err(usage("name the client: `--principal`, `--shared`, or `--credential` with `--secret-env` (or `--unkeyed`)".into()));
        } else if let Some(var) = &self.secret_env {
            let secret = std::env::var_os(var)
                .ok_or_else(|| usage(format!("--secret-env: the environment has no `{var}`")))?;
            ClientIdentity::credentials().keyed(secret.as_encoded_bytes())
        } else if self.unkeyed {
            ClientIdentity::credentials().unkeyed()
        } else {
            return Err(usage(
                "--credential needs the layer's secret: `--secret-env VAR` (or `--unkeyed`)".into(),
            ));
        };
        idem_http::stored_key(scope, &identity, &request, key).map_err(|reason| {
            usage(format!(
                "no stored key for `{}`: {reason}",
                key.escape_debug()
            ))
        })
    }
}

/// What a command failed with: its message and exit code.
struct Failure(u8, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::Config { .. } | Error::InvalidKey { .. } | Error::Step { .. } => USAGE,
            _ => FAILED,
        };
        Failure(code, chain(&e))
    }
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        let hint = match &e {
            AdminError::Store(StoreError::NotSetUp { message, .. })
                if !message.contains("newer") =>
            {
                " (`idem migrate <url>` creates it, with `--table` if the service names one)"
            }
            _ => "",
        };
        let code = match e {
            AdminError::Unsupported { .. } => NOT_POSSIBLE,
            _ => FAILED,
        };
        Failure(code, chain(&e) + hint)
    }
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

/// Opens the store; creates or migrates its table only when `migrate` (an inspection must
/// not change the database).
async fn open(t: &Target, migrate: bool) -> Result<Box<dyn Admin>, Failure> {
    if t.url.starts_with("memory://") {
        return Err(Failure(
            NOT_POSSIBLE,
            "memory:// lives inside one process: no other process, this command included, can see its records".into(),
        ));
    }
    let target = admin::Target {
        table: t.table.clone(),
        prefix: t.prefix.clone(),
        migrate,
    };
    Ok(admin::open(&t.url, &target).await?)
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

/// The envelope's header, and its payload decoded when its codec is JSON.
fn describe_payload(bytes: &[u8]) -> Value {
    let (header, payload) = match envelope::header(bytes) {
        Ok(read) => read,
        Err(e) => return json!({ "error": e.to_string(), "bytes": bytes.len() }),
    };
    let codec = match header.codec {
        1 => "json",
        2 => "postcard",
        3 => "bincode",
        _ => "custom",
    };
    let decoded = if codec == "json" {
        serde_json::from_slice::<Value>(payload).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    let kind = if header.held {
        "held"
    } else if header.cached_error {
        "error"
    } else {
        "value"
    };
    json!({
        "format": header.format,
        "codec": codec,
        "codec_id": header.codec,
        "kind": kind,
        "result_version": header.version,
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

/// A record as `get` (and `delete`) shows it.
fn record_json(key: &Key, info: &RecordInfo) -> Value {
    let mut out = json!({
        "key": key.as_str(),
        "state": info.state.as_str(),
        "fingerprint": hex(info.fingerprint.as_bytes()),
        "token": info.token.to_string(),
        "stored_key": info.stored_key,
        "stored_bytes": info.stored_bytes,
    });
    let left = if info.payload.is_some() {
        "expires_in_ms"
    } else {
        "lease_left_ms"
    };
    out[left] = json!(ms(info.time_left));
    if let Some(payload) = &info.payload {
        out["payload"] = describe_payload(payload);
        if let Some(step) = envelope::held_step(payload) {
            // Not a result: the key waits for its step to be resolved.
            out["held_by_step"] = json!(step);
        }
    }
    out
}

/// What a step's record (or a call's key) holds, as `steps` shows it: `none`, `running`
/// (a claim), `held` (the outcome is unknown) or `completed` (with the step's value).
fn step_json(info: Option<&RecordInfo>) -> Value {
    let Some(info) = info else {
        return json!({ "state": "none" });
    };
    match &info.payload {
        None => json!({ "state": "running", "lease_left_ms": ms(info.time_left) }),
        Some(payload) => match envelope::held_step(payload) {
            Some(step) => {
                json!({ "state": "held", "step": step, "expires_in_ms": ms(info.time_left) })
            }
            None => {
                let described = describe_payload(payload);
                json!({ "state": "completed", "value": described["value"], "expires_in_ms": ms(info.time_left) })
            }
        },
    }
}

/// What a command answers: what to print and the exit code.
type Answer = Result<(String, u8), Failure>;

/// Runs the command; answers what to print and the exit code.
async fn run(command: Command) -> Answer {
    match command {
        Command::Get { target, key, http } => get(target, key, http).await,
        Command::Delete {
            target,
            key,
            force,
            dry_run,
        } => delete(target, key, force, dry_run).await,
        Command::Steps { target, key, steps } => show_steps(target, key, steps).await,
        Command::Resolve {
            target,
            key,
            step,
            ran,
            not_ran: _,
            value,
            ttl,
        } => resolve(target, key, step, ran, value, ttl).await,
        Command::PurgeExpired { target, dry_run } => purge_expired(target, dry_run).await,
        Command::Stats { target } => stats(target).await,
        Command::AcknowledgeLostRecords { target } => acknowledge_lost_records(target).await,
        Command::Migrate { target } => migrate(target).await,
    }
}

/// `get`: the record under a key (given, or the HTTP layer's key of a customer's).
async fn get(target: Target, key: Option<String>, http: HttpKey) -> Answer {
    let key = match key {
        Some(key) => parse_key(&key)?,
        None => http.stored_key()?,
    };
    let store = open(&target, false).await?;
    let Some(info) = store.describe(&key).await? else {
        return Err(Failure(NOT_FOUND, format!("no live record under `{key}`")));
    };
    Ok((render(&record_json(&key, &info), target.json), 0))
}

/// `delete`: the record under a key, refusing a live claim unless forced.
async fn delete(target: Target, key: String, force: bool, dry_run: bool) -> Answer {
    let key = parse_key(&key)?;
    let store = open(&target, false).await?;
    let options = DeleteOptions { force, dry_run };
    let would = if dry_run { "would be " } else { "" };
    let (out, text, code) = match store.delete_record(&key, options).await? {
        Deletion::Deleted(info) => (
            json!({ "key": key.as_str(), "deleted": true, "dry_run": dry_run, "record": record_json(&key, &info) }),
            format!("`{key}` ({}) {would}deleted", info.state.as_str()),
            0,
        ),
        Deletion::Refused(info) => (
            json!({ "key": key.as_str(), "deleted": false, "dry_run": dry_run, "refused": "live claim", "record": record_json(&key, &info) }),
            format!(
                "`{key}` is held by a live claim (token {}, lease left {} ms): a call is running, and deleting its claim lets a second run start beside it; nothing {would}deleted (`--force` deletes it anyway)",
                info.token,
                ms(info.time_left)
            ),
            NOT_POSSIBLE,
        ),
        Deletion::NotFound => (
            json!({ "key": key.as_str(), "deleted": false, "dry_run": dry_run }),
            format!("no record under `{key}`: nothing {would}deleted"),
            NOT_FOUND,
        ),
        _ => (
            json!({ "key": key.as_str(), "deleted": false, "dry_run": dry_run }),
            format!("`{key}`: the store answered in a way this build does not know"),
            FAILED,
        ),
    };
    Ok((if target.json { out.to_string() } else { text }, code))
}

/// `steps`: a call's key and the records of the steps named.
async fn show_steps(target: Target, key: String, steps: Vec<String>) -> Answer {
    let key = parse_key(&key)?;
    let records = steps
        .iter()
        .map(|name| key.step(name).map(|k| (name, k)))
        .collect::<Result<Vec<_>, _>>()?;
    let store = open(&target, false).await?;
    let call = store.describe(&key).await?;
    let mut found = call.is_some();
    let mut shown = serde_json::Map::new();
    for (name, record) in &records {
        let info = store.describe(record).await?;
        found |= info.is_some();
        shown.insert((*name).clone(), step_json(info.as_ref()));
    }
    let out = json!({
        "key": key.as_str(),
        "key_state": step_json(call.as_ref())["state"],
        "held_by": held_by(call.as_ref()),
        "steps": shown,
    });
    if !found {
        return Err(Failure(
            NOT_FOUND,
            format!("no record under `{key}` nor any of its steps named"),
        ));
    }
    Ok((render(&out, target.json), 0))
}

/// The step a call's record holds its key for, if it does.
fn held_by(call: Option<&RecordInfo>) -> Option<String> {
    call.and_then(|info| info.payload.as_deref())
        .and_then(envelope::held_step)
}

/// `resolve`: a held step resolved as ran (with its value) or not ran, by the engine's own
/// resolution on the opened store.
async fn resolve(
    target: Target,
    key: String,
    step: String,
    ran: bool,
    value: Option<String>,
    ttl: Option<u64>,
) -> Answer {
    let key = parse_key(&key)?;
    let record = key.step(&step)?;
    let resolution = resolution(ran, value.as_deref())?;
    if ttl == Some(0) {
        return Err(Failure(USAGE, "--ttl must be at least 1 second".into()));
    }
    let store = open(&target, false).await?;
    let call = store.describe(&key).await?;
    let step_record = store.describe(&record).await?;
    // What the hold had left: the step's, else the key's (a hold the step's record
    // could not get), else the engine's default.
    let hold_left = [&step_record, &call]
        .into_iter()
        .flatten()
        .find_map(|info| {
            let held = info.payload.as_deref().and_then(envelope::held_step);
            held.map(|_| info.time_left)
        });
    let ttl = match ttl {
        Some(secs) => Duration::from_secs(secs),
        None => hold_left
            .filter(|left| *left >= Duration::from_millis(1))
            .unwrap_or(idem_core::DEFAULT_TTL),
    };
    // The engine's own resolution, on the opened store: the step's record first,
    // then the key's hold, each as a service's engine writes them.
    let idem = Idem::builder().store(store).ttl(ttl).build()?;
    let resolved = idem.resolve(&key, &step, resolution).await?;
    // As `delete` does: what happened on stdout (JSON with `--json`), and the exit
    // code says whether it was done.
    let (out, text, code) = resolve_report(&key, &step, ran, resolved, &call, &step_record);
    Ok((if target.json { out.to_string() } else { text }, code))
}

/// `--ran` with its `--value`, or `--not-ran`.
fn resolution(ran: bool, value: Option<&str>) -> Result<Resolution, Failure> {
    if !ran {
        return Ok(Resolution::NotRan);
    }
    let Some(value) = value else {
        return Err(Failure(USAGE, "--ran needs --value: the step's value as JSON, what the step would have returned (e.g. '\"ch_1\"'; 'null' for a step returning ())".into()));
    };
    let value: Value = serde_json::from_str(value).map_err(|e| {
        Failure(USAGE, format!("--value is not JSON ({e}): give it as the step's value would be serialized, e.g. '\"ch_1\"' or '{{\"id\":\"ch_1\"}}'"))
    })?;
    Ok(Resolution::Ran(value))
}

/// What `resolve` prints (as JSON and as text) and its exit code, given what the
/// resolution answered and the records it found before.
fn resolve_report(
    key: &Key,
    step: &str,
    ran: bool,
    resolved: Resolved,
    call: &Option<RecordInfo>,
    step_record: &Option<RecordInfo>,
) -> (Value, String, u8) {
    let ran_text = if ran { "ran" } else { "not ran" };
    let resolved_as = if ran { "ran" } else { "not_ran" };
    match resolved {
        Resolved::Resolved => (
            json!({ "key": key.as_str(), "step": step, "resolved": resolved_as }),
            format!("step `{step}` of `{key}` is resolved as {ran_text}; the key is no longer held, and its next call runs the steps not done"),
            0,
        ),
        Resolved::AlreadyResolved => (
            json!({ "key": key.as_str(), "step": step, "resolved": null, "already_resolved": true }),
            format!("step `{step}` of `{key}` was already resolved by another resolution, whose record stands (`idem steps` shows it); the key's hold it left is lifted"),
            NOT_POSSIBLE,
        ),
        _ if call.is_none() && step_record.is_none() => (
            json!({ "key": key.as_str(), "step": step, "resolved": null }),
            format!("no record under `{key}` nor its step `{step}`: nothing to resolve"),
            NOT_FOUND,
        ),
        _ => {
            let held_by = held_by(call.as_ref());
            let why = match &held_by {
                Some(other) => format!("the key is held by step `{other}`, not `{step}`"),
                None => format!("neither the key nor step `{step}` is held"),
            };
            (
                json!({ "key": key.as_str(), "step": step, "resolved": null, "held_by": held_by }),
                format!("`{key}`: {why}; nothing changed (`idem steps` shows them)"),
                NOT_POSSIBLE,
            )
        }
    }
}

/// `purge-expired`: the ended records removed (or counted, with `--dry-run`).
async fn purge_expired(target: Target, dry_run: bool) -> Answer {
    let store = open(&target, false).await?;
    let n = store.purge(dry_run).await?;
    let out = if dry_run {
        json!({ "would_purge": n, "dry_run": true })
    } else {
        json!({ "purged": n })
    };
    Ok((render(&out, target.json), 0))
}

/// `stats`: the records counted by state.
async fn stats(target: Target) -> Answer {
    let store = open(&target, false).await?;
    let stats = store.stats().await?;
    let out = json!({
        "in_progress": stats.in_progress,
        "completed": stats.completed,
        "ended": stats.ended,
    });
    Ok((render(&out, target.json), 0))
}

/// `acknowledge-lost-records`: a Redis store's current epoch acknowledged.
async fn acknowledge_lost_records(target: Target) -> Answer {
    if !target.url.starts_with("redis") {
        return Err(Failure(
            NOT_POSSIBLE,
            "only a Redis store keeps an epoch of its records to acknowledge".into(),
        ));
    }
    // Opening reads the epoch (or writes one, when there is none): that is the one
    // acknowledged.
    let store = idem_stores::RedisStore::builder()
        .prefix(&target.prefix)
        .open(&target.url)
        .await?;
    store
        .acknowledge_lost_records()
        .await
        .map_err(|e| Failure(FAILED, chain(&e)))?;
    let what = format!(
        "the loss of the records under `{}` is acknowledged (`{}` holds the current epoch)",
        target.prefix,
        format_args!("{}epoch-acknowledged", target.prefix)
    );
    let out = json!({ "acknowledged": store.epoch_key() });
    Ok((if target.json { out.to_string() } else { what }, 0))
}

/// `migrate`: the store's table brought to this build's schema.
async fn migrate(target: Target) -> Answer {
    let store = open(&target, false).await?;
    let what = match store.ensure_schema().await? {
        Some(what) => format!("{what} is at this build's schema"),
        None => "nothing to migrate: Redis keeps no schema".into(),
    };
    let out = json!({ "migrated": what });
    Ok((if target.json { out.to_string() } else { what }, 0))
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
