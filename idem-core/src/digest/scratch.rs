//! What digests reuse from one call to the next on a thread: the keyed blake3 hashers, the
//! buffers an encoding is written into, and the room struct fields are moved through to
//! be put in name order; and when that memory is let go. None of it changes a byte of the
//! encoding (`encoding.rs`): a digest computed with fresh buffers is the same.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::thread::LocalKey;

use serde::Serialize;

use super::encoding::{self, FINGERPRINT_CONTEXT, KEY_CONTEXT};
use super::name_order::Spare;

/// A blake3 hasher keyed by a context string: derived once per process (deriving the key
/// costs more than hashing a request), then copied once per thread into `local` and reset
/// before each digest (a reset writes a few hundred bytes; a fresh copy of the hasher,
/// about two thousand).
pub(super) struct Keyed {
    context: &'static str,
    base: OnceLock<blake3::Hasher>,
    local: &'static LocalKey<RefCell<Option<blake3::Hasher>>>,
}

thread_local! {
    static KEY_HASHER: RefCell<Option<blake3::Hasher>> = const { RefCell::new(None) };
    static FINGERPRINT_HASHER: RefCell<Option<blake3::Hasher>> = const { RefCell::new(None) };
}

/// The hasher of key ids.
pub(super) static KEY: Keyed = Keyed::new(KEY_CONTEXT, &KEY_HASHER);
/// The hasher of fingerprints.
pub(super) static FINGERPRINT: Keyed = Keyed::new(FINGERPRINT_CONTEXT, &FINGERPRINT_HASHER);

impl Keyed {
    const fn new(
        context: &'static str,
        local: &'static LocalKey<RefCell<Option<blake3::Hasher>>>,
    ) -> Self {
        Keyed {
            context,
            base: OnceLock::new(),
            local,
        }
    }

    fn base(&self) -> &blake3::Hasher {
        self.base
            .get_or_init(|| blake3::Hasher::new_derive_key(self.context))
    }

    /// The blake3 hash of `bytes` under this context.
    pub(super) fn hash(&self, bytes: &[u8]) -> [u8; 32] {
        let kept = self.local.try_with(|cell| {
            let mut hasher = cell.try_borrow_mut().ok()?;
            let hasher = hasher.get_or_insert_with(|| self.base().clone());
            hasher.reset();
            hasher.update(bytes);
            Some(*hasher.finalize().as_bytes())
        });
        kept.ok().flatten().unwrap_or_else(|| {
            let mut hasher = self.base().clone();
            hasher.update(bytes);
            *hasher.finalize().as_bytes()
        })
    }
}

thread_local! {
    /// The buffers digests are written into.
    pub(super) static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { out: Vec::new(), moved: Spare::new() })
    };
    /// The second value's buffers of a comparison.
    pub(super) static OTHER_SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { out: Vec::new(), moved: Spare::new() })
    };
}

/// Runs `f` on the canonical encoding of `value`, written into the given buffers of this
/// thread (fresh ones if they are in use: a `Serialize` impl that digests another value
/// while it is being digested gets buffers of its own). A digest then allocates nothing for
/// a value that fits the buffers already grown.
pub(super) fn in_scratch<T: Serialize + ?Sized, O, F: FnOnce(&[u8]) -> O>(
    scratch: &'static LocalKey<RefCell<Scratch>>,
    value: &T,
    f: F,
) -> Result<O, String> {
    /// Buffers that grew past this are not kept, so one huge value does not pin its memory.
    const KEEP: usize = 64 * 1024;
    let encode = |scratch: &mut Scratch, f: &mut Option<F>| {
        scratch.out.clear();
        scratch.moved.clear();
        let res = encoding::encode(value, &mut scratch.out, &mut scratch.moved)
            .map(|()| (f.take().expect("called once"))(&scratch.out));
        if scratch.out.capacity() > KEEP || scratch.moved.holds_more_than(KEEP) {
            *scratch = Scratch::default();
        }
        res
    };
    let mut f = Some(f);
    let shared = scratch.try_with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => Some(encode(&mut scratch, &mut f)),
        Err(_) => None,
    });
    match shared {
        Ok(Some(res)) => res,
        _ => encode(&mut Scratch::default(), &mut f),
    }
}

/// The encoding being written, and room to move struct fields into name order.
#[derive(Default)]
pub(super) struct Scratch {
    out: Vec<u8>,
    moved: Spare,
}
