//! What a pickle may make the restricted machine build: a memory budget proportional to
//! its size, and the containers it made, emptied when done (issue 70).

use super::{Global, Obj, PickledTensor, Val, V};

/// The memory a pickle may make the machine build, per byte of it, and for any pickle.
/// A value takes at least one opcode byte, but a memo reference (`BINGET`, 2 bytes) repeats
/// a whole value, and turning shared values into a [`Node`](super::Node) tree copies them each time: a
/// 3 KB pickle of memo fan-out reached 7 GB before a fixed cap refused it (issue 70). So
/// the values the machine builds and the tree made of them are charged against a
/// [`Budget`] proportional to the input, one for both: a DCP `.metadata` of `dcp.save`
/// (torch 2.15, 3000 tensors, 668 KB) takes 40 bytes a byte (21 for the machine's values,
/// 19 for the tree), so 64 leaves room for other writers and refuses a bomb at 64 times
/// its size.
const BUDGET_PER_BYTE: usize = 64;
const BUDGET_FLOOR: usize = 16 << 20;

/// The bytes of values a pickle may still build (see [`BUDGET_PER_BYTE`]).
pub(super) struct Budget {
    left: usize,
    input: usize,
}

impl Budget {
    /// The budget of a pickle of `input` bytes.
    pub(super) fn for_input(input: usize) -> Budget {
        Budget {
            left: input
                .saturating_mul(BUDGET_PER_BYTE)
                .saturating_add(BUDGET_FLOOR),
            input,
        }
    }

    /// Takes `bytes` from the budget; an error once it is spent.
    pub(super) fn charge(&mut self, bytes: usize) -> std::result::Result<(), String> {
        self.left = self.left.checked_sub(bytes).ok_or_else(|| {
            format!(
                "pickle of {} bytes builds more than {} MiB of values (shared values repeated): refused",
                self.input,
                (self.input.saturating_mul(BUDGET_PER_BYTE) + BUDGET_FLOOR) >> 20
            )
        })?;
        Ok(())
    }
}

/// Every container the machine made, emptied when the caller is done with the pickle's
/// value: a pickle can put a list inside itself (`]`, DUP, APPEND) or an object in its own
/// state, and such a cycle of `Rc`s would never be freed (a leak per file, found by
/// fuzzing).
#[derive(Default)]
pub(super) struct Held(pub(super) Vec<Val>);

impl Drop for Held {
    fn drop(&mut self) {
        for v in &self.0 {
            match &**v {
                V::List(l) => {
                    let items = std::mem::take(&mut *l.borrow_mut());
                    drop(items);
                }
                V::Dict(d) => {
                    let items = std::mem::take(&mut *d.borrow_mut());
                    drop(items);
                }
                V::Object(o) => {
                    let state = o.state.borrow_mut().take();
                    drop(state);
                }
                _ => {}
            }
        }
    }
}

/// What a value costs to build: its slot, and what it owns beyond it.
pub(super) fn cost(v: &V) -> usize {
    let own = match v {
        V::Str(s) => s.len(),
        V::Tuple(items) => items.len() * std::mem::size_of::<Val>(),
        V::List(items) => items.borrow().len() * std::mem::size_of::<Val>(),
        V::Dict(items) => items.borrow().len() * 2 * std::mem::size_of::<Val>(),
        V::Global(Global::Opaque(name)) => name.len(),
        V::Storage(st) => st.key.len(),
        V::Tensor(t) => std::mem::size_of::<PickledTensor>() + 8 * (t.shape.len() + t.stride.len()),
        V::Object(o) => std::mem::size_of::<Obj>() + o.class.len(),
        _ => 0,
    };
    // The Rc's counts, and the slot that holds it (a stack, list or memo entry).
    std::mem::size_of::<V>() + 2 * std::mem::size_of::<usize>() + std::mem::size_of::<Val>() + own
}
