//! What digests reuse from one call to the next on a thread: the keyed blake3 hashers, the
//! buffers an encoding is written into, and the room struct fields are moved through to
//! be put in name order; and when that memory is let go. None of it changes a byte of the
//! encoding (`encoding.rs`): a digest computed with fresh buffers is the same.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::thread::LocalKey;

use serde::Serialize;
use smallvec::SmallVec;

use super::encoding::{self, FINGERPRINT_CONTEXT, KEY_CONTEXT};

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
        scratch.moved.fields.clear();
        scratch.moved.bytes.clear();
        let res = encoding::encode(value, &mut scratch.out, &mut scratch.moved)
            .map(|()| (f.take().expect("called once"))(&scratch.out));
        let moved = &scratch.moved;
        let fields = moved.fields.capacity() * std::mem::size_of::<(&str, usize)>();
        if scratch.out.capacity() > KEEP || moved.bytes.capacity() > KEEP || fields > KEEP {
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

/// What putting struct fields in name order needs, kept with the scratch buffer so that it
/// allocates nothing once grown, and so that the encoder's types stay a few pointers wide.
///
/// The encoder writes a struct's fields in the order its `Serialize` gives them, noting
/// where each starts ([`Spare::field_starts`]); at the struct's end they are moved out of
/// the output and back in the order of their names ([`Spare::put_in_name_order`]).
#[derive(Default)]
pub(super) struct Spare {
    /// Where a struct's fields are moved while they are put in name order.
    bytes: Vec<u8>,
    /// The fields of the structs being written, innermost last: each one's name and where
    /// its encoding starts in the output.
    fields: Vec<(&'static str, usize)>,
}

impl Spare {
    const fn new() -> Self {
        Spare {
            bytes: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// A struct of about `len` fields begins; the answer is where its fields start in the
    /// list (an enclosing struct's are below), for `put_in_name_order` and `close`.
    pub(super) fn open(&mut self, len: usize) -> usize {
        // A hand-written `Serialize` may announce any length: reserve for a usual struct.
        self.fields.reserve(len.min(64));
        self.fields.len()
    }

    /// The field `name` of the innermost struct starts at `at` in the output.
    pub(super) fn field_starts(&mut self, name: &'static str, at: usize) {
        self.fields.push((name, at));
    }

    /// Moves the fields of the struct opened at `first`, the last bytes of `out`, into the
    /// order of their names. Stable: should a hand-written `Serialize` repeat a name, its
    /// order stays.
    pub(super) fn put_in_name_order(&mut self, out: &mut Vec<u8>, first: usize) {
        let starts = &self.fields[first..];
        if starts.windows(2).all(|w| w[0].0 <= w[1].0) {
            return;
        }
        let body = starts[0].1;
        let mut order: SmallVec<[usize; 16]> = (0..starts.len()).collect();
        order.sort_by(|&a, &b| starts[a].0.cmp(starts[b].0));
        // `bytes` may hold an enclosing struct's fields, being moved: append after them.
        let base = self.bytes.len();
        self.bytes.extend_from_slice(&out[body..]);
        let end = out.len();
        out.truncate(body);
        for i in order {
            let from = starts[i].1 - body + base;
            let to = starts.get(i + 1).map_or(end, |next| next.1) - body + base;
            out.extend_from_slice(&self.bytes[from..to]);
        }
        self.bytes.truncate(base);
    }

    /// The struct opened at `first` is done (ended or abandoned): its fields leave the list.
    pub(super) fn close(&mut self, first: usize) {
        self.fields.truncate(first);
    }
}
