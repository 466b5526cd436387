use idem::idempotent;

// The function is emitted unchanged beside the error, so rustc's own verdict on a
// C-variadic definition follows.
#[idempotent]
unsafe extern "C" fn charge(amount: u64, _rest: ...) -> u64 {
    amount
}

fn main() {}
