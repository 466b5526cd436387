//! The `idem` binary against real stores: SQLite always; Postgres, MySQL and Redis with
//! `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_MYSQL_URL` / `IDEM_TEST_REDIS_URL` (required under
//! `IDEM_REQUIRE_BACKENDS=1`).
//! Records are written through the engine, as a service writes them; each test uses a
//! table or prefix of its own.

use std::process::Command;
use std::time::Duration;

use idem::{store::Store, store::Token, Fingerprint, Idem, Key};
use serde_json::Value;

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    id: String,
    cents: u64,
}

/// Runs `idem args...`: exit code, stdout, stderr.
fn idem_cmd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .expect("the idem binary runs");
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// `idem args... --json`, which must succeed: its JSON.
fn json_ok(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = idem_cmd(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} printed `{out}`: {e}"))
}

use idem::testing::backend_url;

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}_{}_{nanos}", std::process::id())
}

/// One completed record, one held by a claim, one ended: `get`, `stats`, `delete`,
/// `purge-expired` on a SQL store the engine wrote to. `flags` name its table.
async fn sql_store_flow(url: &str, store: impl Store, flags: &[&str]) {
    let args = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        v.extend(flags.iter().map(|s| s.to_string()));
        v
    };
    let run = |cmd: &[&str]| {
        let a = args(cmd);
        json_ok(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let code_of = |cmd: &[&str]| {
        let a = args(cmd);
        idem_cmd(&a.iter().map(String::as_str).collect::<Vec<_>>()).0
    };

    let idem = Idem::new(store);
    let done = Key::new("billing::charge", "order-42").unwrap();
    let receipt = Receipt {
        id: "r-1".into(),
        cents: 1250,
    };
    let fp = Fingerprint::of(&"order-42");
    let _: Receipt = idem
        .call(done.clone(), fp)
        .ttl(Duration::from_secs(3600))
        .run(|| async { receipt })
        .await
        .unwrap();
    let held = Key::new("billing::charge", "order-43").unwrap();
    idem.store()
        .claim(&held, &fp, Token::random(), Duration::from_secs(600))
        .await
        .unwrap();
    let ended = Key::new("billing::charge", "order-44").unwrap();
    idem.store()
        .claim(&ended, &fp, Token::random(), Duration::from_millis(1))
        .await
        .unwrap();
    // Waits for the 1 ms lease to end on the store's clock (not an assertion: the bound
    // only stops a broken store from hanging the test).
    for _ in 0..500 {
        if idem.store().get(&ended).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    let got = run(&["get", url, "billing::charge/order-42"]);
    assert_eq!(got["state"], "completed");
    assert_eq!(got["fingerprint"].as_str().unwrap().len(), 32);
    assert_eq!(got["payload"]["codec"], "json");
    assert_eq!(got["payload"]["kind"], "value");
    assert_eq!(
        got["payload"]["value"],
        serde_json::json!({ "id": "r-1", "cents": 1250 })
    );
    let left = got["expires_in_ms"].as_u64().unwrap();
    assert!(left > 3_500_000 && left <= 3_600_000, "{left}");

    let got = run(&["get", url, "billing::charge/order-43"]);
    assert_eq!(got["state"], "in_progress");
    let lease = got["lease_left_ms"].as_u64().unwrap();
    assert!(lease > 500_000 && lease <= 600_000, "{lease}");

    // The human form names the same things, one per line.
    let (code, text, err) = idem_cmd(
        &args(&["get", url, "billing::charge/order-42"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("state: completed"), "{text}");
    assert!(
        text.contains(r#"payload.value: {"cents":1250,"id":"r-1"}"#),
        "{text}"
    );

    // A key with `%`: found under the store's own key encoding (Postgres escapes it).
    let percent = Key::new("billing::charge", "100%-off").unwrap();
    let _: u32 = idem
        .call(percent.clone(), fp)
        .ttl(Duration::from_secs(3600))
        .run(|| async { 5 })
        .await
        .unwrap();
    let got = run(&["get", url, "billing::charge/100%-off"]);
    assert_eq!(got["state"], "completed");
    let left = got["expires_in_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no expiry shown for a key with `%`: {got}"));
    assert!(left > 3_500_000 && left <= 3_600_000, "{left}");
    assert_eq!(got["payload"]["value"], 5);

    let all = serde_json::json!({ "completed": 2, "in_progress": 1, "ended": 1 });
    assert_eq!(run(&["stats", url]), all);

    // Dry runs delete nothing, and say what they would.
    let would = run(&["purge-expired", "--dry-run", url]);
    assert_eq!(
        would,
        serde_json::json!({ "would_purge": 1, "dry_run": true })
    );
    let would = run(&["delete", "--dry-run", url, "billing::charge/order-42"]);
    assert_eq!(would["deleted"], true);
    assert_eq!(would["dry_run"], true);
    assert_eq!(would["record"]["state"], "completed");
    assert_eq!(run(&["stats", url]), all, "a dry run deleted something");

    let purged = run(&["purge-expired", url]);
    assert_eq!(purged, serde_json::json!({ "purged": 1 }));

    // A live claim: a call is running. Refused without --force (a dry run too).
    for dry in [&[][..], &["--dry-run"][..]] {
        let mut cmd = vec!["delete"];
        cmd.extend(dry);
        cmd.extend([url, "billing::charge/order-43"]);
        let a = args(&cmd);
        let (code, text, err) = idem_cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 3, "{cmd:?}: {text} {err}");
        assert!(
            text.contains("live claim") && text.contains("--force"),
            "{text}"
        );
    }
    let claimed = serde_json::json!({ "completed": 2, "in_progress": 1, "ended": 0 });
    assert_eq!(run(&["stats", url]), claimed, "a refused delete deleted");
    assert_eq!(
        run(&["get", url, "billing::charge/order-43"])["state"],
        "in_progress"
    );
    let deleted = run(&["delete", "--force", url, "billing::charge/order-43"]);
    assert_eq!(deleted["deleted"], true);
    assert_eq!(deleted["record"]["state"], "in_progress");
    assert_eq!(code_of(&["delete", url, "billing::charge/order-43"]), 4);
    assert_eq!(code_of(&["get", url, "billing::charge/order-43"]), 4);
    // A completed record goes without --force.
    assert_eq!(
        run(&["delete", url, "billing::charge/100%-off"])["deleted"],
        true
    );

    let stats = run(&["stats", url]);
    assert_eq!(
        stats,
        serde_json::json!({ "completed": 1, "in_progress": 0, "ended": 0 })
    );
    // The deleted key runs again.
    let again: u32 = idem.call(held, fp).run(|| async { 7 }).await.unwrap();
    assert_eq!(again, 7);
}

#[tokio::test]
async fn sqlite_get_stats_delete_purge_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let url = format!("sqlite://{}", path.display());
    // No table yet: an inspection does not create one, and says how to.
    let (code, _, err) = idem_cmd(&["stats", &format!("{url}?mode=rwc")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("idem migrate"), "{err}");
    let migrated = json_ok(&["migrate", &format!("{url}?mode=rwc"), "--table", "ops_cli"]);
    assert_eq!(
        migrated["migrated"],
        "table `ops_cli` is at this build's schema"
    );
    let store = idem::stores::SqliteStore::builder()
        .table("ops_cli")
        .migrate(false)
        .connect(&url)
        .await
        .unwrap();
    sql_store_flow(&url, store, &["--table", "ops_cli"]).await;
}

/// A Postgres store on `table`, which `idem migrate` created.
async fn migrated_postgres(url: &str, table: &str) -> idem::stores::PostgresStore {
    json_ok(&["migrate", url, "--table", table]);
    idem::stores::PostgresStore::builder()
        .table(table)
        .migrate(false)
        .connect(url)
        .await
        .unwrap()
}

/// Leaves the server as it was: drops `table` and its schema table.
async fn drop_postgres_tables(url: &str, table: &str) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    for t in [table.to_string(), format!("{table}_schema")] {
        sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn postgres_get_stats_delete_purge_migrate() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let table = unique("idem_cli");
    let store = migrated_postgres(&url, &table).await;
    sql_store_flow(&url, store, &["--table", &table]).await;
    drop_postgres_tables(&url, &table).await;
}

#[tokio::test]
async fn mysql_get_stats_delete_purge_migrate() {
    let Some(url) = backend_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    let table = unique("idem_cli");
    json_ok(&["migrate", &url, "--table", &table]);
    let store = idem::stores::MySqlStore::builder()
        .table(&table)
        .migrate(false)
        .connect(&url)
        .await
        .unwrap();
    sql_store_flow(&url, store, &["--table", &table]).await;
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    for t in [table.clone(), format!("{table}_schema")] {
        sqlx::query(&format!("DROP TABLE IF EXISTS `{t}`"))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query(&format!("DROP PROCEDURE IF EXISTS `{table}_claim`"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn redis_lost_records_are_acknowledged_for_every_store_under_the_prefix() {
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let prefix = format!("{}:", unique("idem-cli-epoch"));
    let store = idem::stores::RedisStore::builder()
        .prefix(&prefix)
        .epoch_check_interval(Duration::ZERO)
        .on_lost_records(idem::stores::LostRecords::FailClaimsUntilAcknowledged)
        .open(&url)
        .await
        .unwrap();
    let idem = Idem::new(store.clone());
    // The shared server is not flushed: its epoch alone is lost, which looks the same.
    let mut admin = ::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: u64 = ::redis::cmd("DEL")
        .arg(store.epoch_key())
        .query_async(&mut admin)
        .await
        .unwrap();
    let key = Key::new("billing::charge", "after-loss").unwrap();
    let refused = idem
        .call(key.clone(), Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let p = ["--prefix", prefix.as_str()];
    let (code, out, err) = idem_cmd(&["acknowledge-lost-records", &url, p[0], p[1]]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("acknowledged"), "{out}");
    let ran = idem
        .call(key, Fingerprint::NONE)
        .run(|| async { 2u32 })
        .await
        .unwrap();
    assert_eq!(ran, 2);
    let (code, _, err) = idem_cmd(&["acknowledge-lost-records", "sqlite::memory:"]);
    assert_eq!(code, 3, "{err}");
}

#[tokio::test]
async fn redis_get_delete_and_what_redis_does_not_do() {
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let prefix = format!("{}:", unique("idem-cli"));
    let store = idem::stores::RedisStore::builder()
        .prefix(&prefix)
        .open(&url)
        .await
        .unwrap();
    let idem = Idem::new(store);
    let key = Key::new("billing::charge", "order-42").unwrap();
    let _: Receipt = idem
        .call(key.clone(), Fingerprint::NONE)
        .ttl(Duration::from_secs(3600))
        .run(|| async {
            Receipt {
                id: "r-1".into(),
                cents: 1250,
            }
        })
        .await
        .unwrap();
    let p = ["--prefix", prefix.as_str()];
    let got = json_ok(&["get", &url, "billing::charge/order-42", p[0], p[1]]);
    assert_eq!(got["state"], "completed");
    assert_eq!(got["payload"]["value"]["id"], "r-1");
    let left = got["expires_in_ms"].as_u64().unwrap();
    assert!(left > 3_500_000 && left <= 3_600_000, "{left}");

    let (code, _, err) = idem_cmd(&["stats", &url, p[0], p[1]]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("not supported on Redis"), "{err}");
    let (code, _, err) = idem_cmd(&["purge-expired", &url, p[0], p[1]]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("expiry"), "{err}");
    let migrated = json_ok(&["migrate", &url, p[0], p[1]]);
    assert_eq!(
        migrated["migrated"],
        "nothing to migrate: Redis keeps no schema"
    );

    // A live claim is refused without --force, a dry run deletes nothing.
    let held = Key::new("billing::charge", "order-43").unwrap();
    idem.store()
        .claim(
            &held,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let (code, text, err) = idem_cmd(&["delete", &url, "billing::charge/order-43", p[0], p[1]]);
    assert_eq!(code, 3, "{text} {err}");
    assert!(text.contains("live claim"), "{text}");
    let got = json_ok(&["get", &url, "billing::charge/order-43", p[0], p[1]]);
    assert_eq!(got["state"], "in_progress");
    let lease = got["lease_left_ms"].as_u64().unwrap();
    assert!(lease > 500_000 && lease <= 600_000, "{lease}");
    let would = json_ok(&[
        "delete",
        "--dry-run",
        &url,
        "billing::charge/order-42",
        p[0],
        p[1],
    ]);
    assert_eq!(would["deleted"], true);
    assert_eq!(
        json_ok(&["get", &url, "billing::charge/order-42", p[0], p[1]])["state"],
        "completed",
        "a dry run deleted"
    );
    assert_eq!(
        json_ok(&[
            "delete",
            "--force",
            &url,
            "billing::charge/order-43",
            p[0],
            p[1]
        ])["deleted"],
        true
    );
    assert_eq!(
        json_ok(&["delete", &url, "billing::charge/order-42", p[0], p[1]])["deleted"],
        true
    );
    let (code, _, _) = idem_cmd(&["get", &url, "billing::charge/order-42", p[0], p[1]]);
    assert_eq!(code, 4);
}

/// What the steps of a call leave, shown and resolved by the binary: a key whose first
/// attempt charged and then failed (its charge recorded, the key free), and a key held by a
/// charge whose outcome is unknown, resolved as ran with a value the next attempt gets.
/// `flags` name the store's table or prefix.
async fn steps_flow(url: &str, store: impl Store, flags: &[&str]) {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    let with = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        v.extend(flags.iter().map(|s| s.to_string()));
        v
    };
    let run = |cmd: &[&str]| {
        let a = with(cmd);
        json_ok(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let cmd = |cmd: &[&str]| {
        let a = with(cmd);
        idem_cmd(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let idem = Idem::new(store);
    let charges = AtomicU32::new(0);
    // Charges (ambiguous when `unknown`), then mails (failing when `mail_down`).
    let checkout = |id: &str, unknown: bool, mail_down: bool| {
        let key = Key::new("shop::checkout", id).unwrap();
        let charges = &charges;
        idem.call(key, Fingerprint::NONE)
            .run_fallible(move || async move {
                let charge: String = idem::steps::Step::new("charge")
                    .unknown_if(|_: &idem::Error| unknown)
                    .run(|| async {
                        let n = charges.fetch_add(1, SeqCst) + 1;
                        match unknown {
                            true => Err(idem::Error::Config {
                                message: "the gateway timed out".into(),
                                source: None,
                            }),
                            false => Ok(format!("ch_{n}")),
                        }
                    })
                    .await?;
                idem::step("email", || async {
                    match mail_down {
                        true => Err(idem::Error::Config {
                            message: "mail is down".into(),
                            source: None,
                        }),
                        false => Ok(()),
                    }
                })
                .await?;
                Ok::<_, idem::Error>(charge)
            })
    };

    // Charged, then the email failed: the charge's record stays, the key is free.
    assert!(checkout("order-42", false, true).await.is_err());
    let shown = run(&["steps", url, "shop::checkout/order-42", "charge", "email"]);
    assert_eq!(shown["key"], "shop::checkout/order-42");
    assert_eq!(shown["key_state"], "none");
    assert_eq!(shown["held_by"], Value::Null);
    assert_eq!(shown["steps"]["charge"]["state"], "completed");
    assert_eq!(shown["steps"]["charge"]["value"], "ch_1");
    assert!(shown["steps"]["charge"]["expires_in_ms"].as_u64().unwrap() > 0);
    assert_eq!(shown["steps"]["email"]["state"], "none");
    let (code, text, err) = cmd(&["steps", url, "shop::checkout/order-42", "charge", "email"]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("steps.charge.state: completed"), "{text}");
    assert!(text.contains("steps.charge.value: ch_1"), "{text}");
    assert!(text.contains("steps.email.state: none"), "{text}");
    // Nothing held there: resolving is refused, and changes nothing.
    let (code, text, err) = cmd(&[
        "resolve",
        url,
        "shop::checkout/order-42",
        "charge",
        "--not-ran",
    ]);
    assert_eq!(code, 3, "{err}");
    assert!(
        text.contains("neither the key nor step `charge` is held"),
        "{text}"
    );
    assert_eq!(checkout("order-42", false, false).await.unwrap(), "ch_1");
    assert_eq!(charges.load(SeqCst), 1, "the retry did not charge again");

    // An ambiguous charge holds the key.
    assert!(checkout("order-43", true, false).await.is_err());
    assert!(matches!(
        checkout("order-43", false, false).await,
        Err(idem::Error::OutcomeUnknown { .. })
    ));
    let shown = run(&["steps", url, "shop::checkout/order-43", "charge", "email"]);
    assert_eq!(shown["key_state"], "held");
    assert_eq!(shown["held_by"], "charge");
    assert_eq!(shown["steps"]["charge"]["state"], "held");
    assert_eq!(shown["steps"]["email"]["state"], "none");
    let got = run(&["get", url, "shop::checkout/order-43"]);
    assert_eq!(got["payload"]["kind"], "held");
    assert_eq!(got["held_by_step"], "charge");
    let (code, text, _) = cmd(&["get", url, "shop::checkout/order-43"]);
    assert_eq!(code, 0);
    assert!(text.contains("held_by_step: charge"), "{text}");

    // Resolving another step, or a key with no record, is refused; a bad value is usage.
    let (code, _, err) = cmd(&["resolve", url, "shop::checkout/order-43", "charge", "--ran"]);
    assert_eq!(code, 2, "--ran without --value was taken: {err}");
    assert!(err.contains("--ran needs --value"), "{err}");
    let v = ["--value", "null"];
    let (code, text, err) = cmd(&[
        &["resolve", url, "shop::checkout/order-43", "email", "--ran"][..],
        &v,
    ]
    .concat());
    assert_eq!(code, 3, "{err}");
    assert!(
        text.contains("held by step `charge`, not `email`"),
        "{text}"
    );
    let refused = cmd(&[
        "resolve",
        url,
        "shop::checkout/order-43",
        "email",
        "--ran",
        "--value",
        "null",
        "--json",
    ]);
    let refused: Value = serde_json::from_str(&refused.1).unwrap();
    assert_eq!(refused["resolved"], Value::Null);
    assert_eq!(refused["held_by"], "charge");
    let (code, text, err) = cmd(&[
        &["resolve", url, "shop::checkout/order-99", "charge", "--ran"][..],
        &v,
    ]
    .concat());
    assert_eq!(code, 4, "{err}");
    assert!(text.contains("nothing to resolve"), "{text}");
    let (code, _, err) = cmd(&["steps", url, "shop::checkout/order-99", "charge"]);
    assert_eq!(code, 4, "{err}");
    let bad = [
        "resolve",
        url,
        "shop::checkout/order-43",
        "charge",
        "--ran",
        "--value",
        "ch_9",
    ];
    let (code, _, err) = cmd(&bad);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--value is not JSON"), "{err}");

    // The operator learns that the charge went through as `ch_9`.
    let resolved = run(&[
        "resolve",
        url,
        "shop::checkout/order-43",
        "charge",
        "--ran",
        "--value",
        r#""ch_9""#,
    ]);
    assert_eq!(
        resolved,
        serde_json::json!({ "key": "shop::checkout/order-43", "step": "charge", "resolved": "ran" })
    );
    let shown = run(&["steps", url, "shop::checkout/order-43", "charge"]);
    assert_eq!(shown["key_state"], "none");
    assert_eq!(shown["steps"]["charge"]["value"], "ch_9");
    assert_eq!(checkout("order-43", false, false).await.unwrap(), "ch_9");
    assert_eq!(
        charges.load(SeqCst),
        2,
        "the resolved charge was not run again"
    );
    let (code, _, _) = cmd(&[
        &["resolve", url, "shop::checkout/order-43", "charge", "--ran"][..],
        &v,
    ]
    .concat());
    assert_eq!(code, 3, "resolved once, not held any more");

    // Held again, resolved as not ran: the next attempt charges.
    assert!(checkout("order-44", true, false).await.is_err());
    let (code, text, err) = cmd(&[
        "resolve",
        url,
        "shop::checkout/order-44",
        "charge",
        "--not-ran",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("resolved as not ran"), "{text}");
    assert_eq!(checkout("order-44", false, false).await.unwrap(), "ch_4");
}

#[tokio::test]
async fn sqlite_steps_and_resolve() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("idem.db").display());
    json_ok(&["migrate", &url, "--table", "ops_steps"]);
    let store = idem::stores::SqliteStore::builder()
        .table("ops_steps")
        .migrate(false)
        .connect(&url)
        .await
        .unwrap();
    steps_flow(&url, store, &["--table", "ops_steps"]).await;
}

#[tokio::test]
async fn postgres_steps_and_resolve() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let table = unique("idem_cli_steps");
    let store = migrated_postgres(&url, &table).await;
    steps_flow(&url, store, &["--table", &table]).await;
    drop_postgres_tables(&url, &table).await;
}

#[tokio::test]
async fn redis_steps_and_resolve() {
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let prefix = format!("{}:", unique("idem-cli-steps"));
    let store = idem::stores::RedisStore::builder()
        .prefix(&prefix)
        .open(&url)
        .await
        .unwrap();
    steps_flow(&url, store, &["--prefix", &prefix]).await;
}

#[test]
fn resolve_takes_ran_or_not_ran() {
    let key = "shop::checkout/o-1";
    for args in [
        &["resolve", "sqlite://x.db", key, "charge"][..],
        &[
            "resolve",
            "sqlite://x.db",
            key,
            "charge",
            "--ran",
            "--not-ran",
        ][..],
        &[
            "resolve",
            "sqlite://x.db",
            key,
            "charge",
            "--not-ran",
            "--value",
            "1",
        ][..],
        &["steps", "sqlite://x.db", key][..],
    ] {
        let (code, _, err) = idem_cmd(args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    let (code, _, err) = idem_cmd(&["steps", "sqlite://x.db", key, "no spaces"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("step `no spaces`"), "{err}");
}

#[test]
fn help_shows_an_example_and_bad_input_is_named() {
    let (code, out, _) = idem_cmd(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Examples:\n  idem get postgres://"), "{out}");

    let (code, _, err) = idem_cmd(&["get", "sqlite://x.db", "no-slash"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`no-slash` is not a key: expected `scope/id`"),
        "{err}"
    );

    let (code, _, err) = idem_cmd(&["get", "memory://", "a/b"]);
    assert_eq!(code, 3);
    assert!(err.contains("memory:// lives inside one process"), "{err}");

    let (code, _, err) = idem_cmd(&["stats", "mongodb://h/db"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown store URL scheme `mongodb`"), "{err}");
}

/// An operator finds the HTTP layer's record of a customer's `Idempotency-Key` from the
/// scope, the key and the client: a principal, or the client's credential with the layer's
/// secret (read from the environment). Another secret finds nothing.
#[tokio::test]
async fn get_finds_an_http_record_by_the_customers_key() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let (code, _, err) = idem_cmd(&["migrate", &format!("{url}?mode=rwc")]);
    assert_eq!(code, 0, "{err}");
    let store = idem::stores::SqliteStore::builder()
        .migrate(false)
        .connect(&url)
        .await
        .unwrap();
    let idem = Idem::new(store);
    let secret = "the deployment's secret";
    let request = http::Request::post("/charge")
        .header("authorization", "Bearer tok_alice")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let by_credentials = idem_http::ClientIdentity::credentials().keyed(secret);
    let by_principal = idem_http::ClientIdentity::principal(|_| Some("cus_42".to_owned()));
    for identity in [&by_credentials, &by_principal] {
        let key = idem_http::stored_key("payments", identity, &request, "8e03978e").unwrap();
        let _: u32 = idem
            .call(key, Fingerprint::of(&"body"))
            .run(|| async { 7 })
            .await
            .unwrap();
    }
    let http = ["--scope", "payments", "--idempotency-key", "8e03978e"];
    let run = |extra: &[&str], secret: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.args(["get", &url, "--json"]).args(http).args(extra);
        if let Some(secret) = secret {
            cmd.env("IDEM_HTTP_SECRET", secret);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let credential = [
        "--credential",
        "Authorization: Bearer tok_alice",
        "--secret-env",
        "IDEM_HTTP_SECRET",
    ];
    let (code, out, err) = run(&credential, Some(secret));
    assert_eq!(code, 0, "{err}");
    let found: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(found["state"], "completed");
    assert!(found["key"].as_str().unwrap().starts_with("payments/@"));
    let (code, _, _) = run(&credential, Some("another secret"));
    assert_eq!(code, 4, "another secret is another client: no record");
    let (code, _, err) = run(&credential, None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("IDEM_HTTP_SECRET"), "{err}");
    let (code, out, err) = run(&["--principal", "cus_42"], None);
    assert_eq!(code, 0, "{err}");
    let found: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(found["key"], "payments/6:cus_42:8e03978e");
    let (code, _, err) = run(&[], None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--principal"), "{err}");
}
