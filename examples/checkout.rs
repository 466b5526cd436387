//! A checkout with three side effects, each a step of one idempotent call: charge the
//! card, reserve the stock, email the receipt. A retry of the order runs only the steps
//! that did not complete, and a charge whose outcome is unknown (the gateway timed out)
//! holds the order until someone says whether it went through.
//!
//! `cargo run --example checkout`
//!
//! 1. The mail server is down: the first attempt charges and reserves, then fails; the
//!    retry sends the email and charges nothing.
//! 2. The gateway times out after taking the charge: the order is held, and a retry runs
//!    nothing until an operator resolves the charge (here by hand, as `idem resolve` does).
//! 3. The same, with a reconcile hook that asks the gateway under the step's key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use idem::{steps::Resolution, steps::Step, Fingerprint, Idem, Key, MemoryStore};
use serde::{Deserialize, Serialize};

/// The services the checkout calls, with what they did and the failures the demo turns on.
#[derive(Default)]
struct Services {
    /// Charges the gateway took, by the idempotency key the step sent.
    gateway: Mutex<HashMap<String, String>>,
    /// Charge requests sent to the gateway.
    charges: AtomicU32,
    reservations: AtomicU32,
    emails: AtomicU32,
    /// The gateway takes the charge, but its answer never arrives.
    gateway_times_out: AtomicBool,
    mail_down: AtomicBool,
}

impl Services {
    fn counts(&self) -> String {
        format!(
            "charges sent {}, reservations {}, emails {}",
            self.charges.load(SeqCst),
            self.reservations.load(SeqCst),
            self.emails.load(SeqCst)
        )
    }

    /// What the gateway's dashboard shows for a charge sent under `provider_key`.
    fn charge_under(&self, provider_key: &str) -> Option<String> {
        self.gateway.lock().unwrap().get(provider_key).cloned()
    }
}

#[derive(Debug)]
enum CheckoutError {
    /// The gateway did not answer in time: the card may have been charged.
    GatewayTimeout,
    /// The mail server refused the receipt: nothing was sent.
    MailDown,
    /// idem's own error: `OutcomeUnknown` while the order is held.
    Idem(idem::Error),
}

impl From<idem::Error> for CheckoutError {
    fn from(e: idem::Error) -> Self {
        CheckoutError::Idem(e)
    }
}

impl std::fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckoutError::GatewayTimeout => f.write_str("the gateway timed out"),
            CheckoutError::MailDown => f.write_str("the mail server is down"),
            CheckoutError::Idem(e) => write!(f, "{e}"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Confirmation {
    charge: String,
    reservation: u32,
}

fn order_key(order_id: &str) -> Key {
    Key::new("shop::checkout", order_id).expect("a valid key")
}

/// One checkout attempt of `order_id`: three steps in one idempotent call.
async fn checkout(
    idem: &Idem,
    svc: &Services,
    order_id: &str,
) -> Result<Confirmation, CheckoutError> {
    idem.call(order_key(order_id), Fingerprint::of(&order_id))
        .run_fallible(|| async {
            // A timeout leaves the charge's outcome unknown: the key is held, not released.
            let charge: String = Step::new("charge")
                .unknown_if(|e: &CheckoutError| matches!(e, CheckoutError::GatewayTimeout))
                .run(|| async {
                    // The gateway's own idempotency key: the same on every attempt.
                    let provider_key = idem::steps::step_key("charge")?;
                    svc.charges.fetch_add(1, SeqCst);
                    let id = format!("ch_{}", &provider_key[..8]);
                    svc.gateway.lock().unwrap().insert(provider_key, id.clone());
                    if svc.gateway_times_out.load(SeqCst) {
                        return Err(CheckoutError::GatewayTimeout);
                    }
                    Ok(id)
                })
                .await?;
            let reservation: u32 = idem::step("reserve", || async {
                Ok::<_, CheckoutError>(svc.reservations.fetch_add(1, SeqCst) + 1)
            })
            .await?;
            idem::step("email", || async {
                if svc.mail_down.load(SeqCst) {
                    return Err(CheckoutError::MailDown);
                }
                svc.emails.fetch_add(1, SeqCst);
                Ok(())
            })
            .await?;
            Ok(Confirmation {
                charge,
                reservation,
            })
        })
        .await
}

fn show(attempt: &str, out: &Result<Confirmation, CheckoutError>, svc: &Services) {
    let answer = match out {
        Ok(c) => format!("ok: charge {}, reservation {}", c.charge, c.reservation),
        Err(e) => format!("error: {e}"),
    };
    println!("  {attempt:<10} {answer}\n  {:<10} ({})", "", svc.counts());
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = Idem::new(MemoryStore::new());

    println!("1. a first attempt fails after the charge; the retry does not charge again");
    let svc = Services::default();
    svc.mail_down.store(true, SeqCst);
    show("attempt 1", &checkout(&idem, &svc, "o-1").await, &svc);
    svc.mail_down.store(false, SeqCst);
    let retry = checkout(&idem, &svc, "o-1").await;
    show("attempt 2", &retry, &svc);
    show("attempt 3", &checkout(&idem, &svc, "o-1").await, &svc);
    assert!(retry.is_ok());
    assert_eq!(svc.charges.load(SeqCst), 1, "charged once");
    assert_eq!(svc.reservations.load(SeqCst), 1, "reserved once");
    assert_eq!(svc.emails.load(SeqCst), 1, "mailed once");

    println!("\n2. an ambiguous charge holds the key until it is resolved");
    let svc = Services::default();
    svc.gateway_times_out.store(true, SeqCst);
    show("attempt 1", &checkout(&idem, &svc, "o-2").await, &svc);
    svc.gateway_times_out.store(false, SeqCst);
    let held = checkout(&idem, &svc, "o-2").await;
    show("attempt 2", &held, &svc);
    assert!(matches!(
        held,
        Err(CheckoutError::Idem(idem::Error::OutcomeUnknown { .. }))
    ));
    // The operator finds the charge in the gateway's dashboard and says it ran, with the
    // value the step would have returned (`idem resolve <url> shop::checkout/o-2 charge
    // --ran --value '"ch_..."'` does the same from a shell).
    let taken = svc.gateway.lock().unwrap().values().next().cloned();
    let taken = taken.expect("the gateway took the charge");
    idem.resolve(&order_key("o-2"), "charge", Resolution::ran(&taken)?)
        .await?;
    println!("  resolved   charge ran, as {taken}");
    let resolved = checkout(&idem, &svc, "o-2").await;
    show("attempt 3", &resolved, &svc);
    assert_eq!(resolved.map_err(|e| e.to_string())?.charge, taken);
    assert_eq!(
        svc.charges.load(SeqCst),
        1,
        "the resolved charge was not sent again"
    );

    println!("\n3. the same, resolved by a reconcile hook that asks the gateway");
    let svc = Arc::new(Services::default());
    let gateway = svc.clone();
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .reconcile(move |unresolved| {
            // Looks the charge up under the key the step handed on: found, it ran.
            let found = gateway.charge_under(&unresolved.step_key());
            async move {
                Some(match found {
                    Some(charge) => Resolution::ran(&charge).ok()?,
                    None => Resolution::NotRan,
                })
            }
        })
        .build()?;
    svc.gateway_times_out.store(true, SeqCst);
    show("attempt 1", &checkout(&idem, &svc, "o-3").await, &svc);
    svc.gateway_times_out.store(false, SeqCst);
    let reconciled = checkout(&idem, &svc, "o-3").await;
    show("attempt 2", &reconciled, &svc);
    assert!(reconciled.is_ok());
    assert_eq!(svc.charges.load(SeqCst), 1, "reconciled, not charged again");
    Ok(())
}
