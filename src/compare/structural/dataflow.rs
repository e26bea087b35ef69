//! Who produced and who read each dataflow id of one side. Regions are compared at their
//! boundary tensors, found through these links, and a region's inputs and outputs are
//! paired through them: a lookup structure of its own, built once per side and sized for
//! a million tensors.

use crate::compare::align::TensorRef;
use crate::dump::{Ops, Role};

/// Who produced and who read each dataflow id of one side: sorted lists, searched by id.
/// (Maps of an id to a vector of readers took ~100 MB a side for a million tensors.)
#[derive(Default)]
pub(super) struct Dataflow {
    /// (id, producer), by id; of an id produced twice, the later producer counts.
    producers: Vec<(u64, TensorRef)>,
    /// (id, reader), by id, each id's readers in execution order.
    readers: Vec<(u64, TensorRef)>,
}

impl Dataflow {
    pub(super) fn of(ops: &Ops) -> Dataflow {
        let (mut producers, mut readers) = (Vec::new(), Vec::new());
        for op in ops.iter() {
            for (ti, t) in op.tensors().enumerate() {
                let r = TensorRef::new(op.index(), ti);
                if let Some(id) = t.id().filter(|_| t.role() == Role::Output) {
                    producers.push((id, r));
                }
                if let Some(src) = t.src() {
                    readers.push((src, r));
                }
            }
        }
        // Stable sorts: equal ids keep execution order.
        producers.sort_by_key(|e| e.0);
        readers.sort_by_key(|e| e.0);
        Dataflow { producers, readers }
    }

    /// The op output that produced `id`.
    pub(super) fn producer(&self, id: u64) -> Option<TensorRef> {
        let end = self.producers.partition_point(|e| e.0 <= id);
        end.checked_sub(1)
            .map(|i| self.producers[i])
            .filter(|e| e.0 == id)
            .map(|e| e.1)
    }

    /// The tensors that read `id`, in execution order (None: none).
    pub(super) fn readers(&self, id: u64) -> Option<impl Iterator<Item = TensorRef> + Clone + '_> {
        let start = self.readers.partition_point(|e| e.0 < id);
        let end = self.readers.partition_point(|e| e.0 <= id);
        (start < end).then(|| self.readers[start..end].iter().map(|e| e.1))
    }
}
