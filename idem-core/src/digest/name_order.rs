//! The room a struct's fields are moved through to be put in name order, kept with the
//! scratch buffer (`scratch.rs`) so that it allocates nothing once grown.

use smallvec::SmallVec;

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
    pub(super) const fn new() -> Self {
        Spare {
            bytes: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Empties the room, keeping its memory.
    pub(super) fn clear(&mut self) {
        self.fields.clear();
        self.bytes.clear();
    }

    /// Whether the room holds more than `limit` bytes of memory in either of its lists.
    pub(super) fn holds_more_than(&self, limit: usize) -> bool {
        let fields = self.fields.capacity() * std::mem::size_of::<(&str, usize)>();
        self.bytes.capacity() > limit || fields > limit
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
