//! Layout evidence at an op (docs/compare.md, "Layout evidence"): how the two runs' tensors
//! of one op lay in memory, where both dumps say (docs/format.md, "Layout"), told where it
//! differs in a way a kernel can see: one side a non-contiguous view where the other is
//! contiguous, other strides for the same shape, another storage offset, a tensor sharing
//! its storage with another of the op on one side only, another device format.
//!
//! What does not count: strides of dimensions of size 1 (a contiguous tensor may carry any
//! there; `is_contiguous` ignores them too), strides of tensors of other shapes, a format
//! recorded on one side only (the other ran on a device without one).

use crate::dump::LayoutRef;

/// One paired tensor of an op, as the layout evidence reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sides<'a> {
    /// How reports name it (its slot, `input.0`, where the op is one call on each side).
    pub label: &'a str,
    /// The benchmark's shape and layout (None: not recorded).
    pub bench: (&'a [usize], Option<LayoutRef<'a>>),
    /// The comparison run's.
    pub cmp: (&'a [usize], Option<LayoutRef<'a>>),
}

/// The most tensors of one op whose storages are compared pairwise (an op over hundreds of
/// tensors, a multi-tensor optimizer step, is read as its first ones).
const ALIASING_MAX: usize = 64;

/// The layout differences of an op's paired tensors, one sentence each, in slot order:
/// each tensor's own, then storages shared on one side only.
pub(crate) fn differences(tensors: &[Sides]) -> Vec<String> {
    let mut out: Vec<String> = tensors.iter().filter_map(own).collect();
    let known: Vec<(&str, u64, u64)> = tensors
        .iter()
        .take(ALIASING_MAX)
        .filter_map(|t| Some((t.label, t.bench.1?.storage?, t.cmp.1?.storage?)))
        .collect();
    for (j, &(name, b, c)) in known.iter().enumerate() {
        // The first earlier tensor it shares its storage with on one side only.
        let other = known[..j]
            .iter()
            .find(|&&(_, b2, c2)| (b2 == b) != (c2 == c));
        if let Some(&(first, b2, _)) = other {
            let side = if b2 == b { "bench" } else { "cmp" };
            let not = if b2 == b { "cmp" } else { "bench" };
            out.push(format!(
                "{side} {name} shares its storage with {first} (a view of it, or written in \
                 place) where {not}'s does not"
            ));
        }
    }
    out
}

/// What differs in one tensor's own layout, if anything.
fn own(t: &Sides) -> Option<String> {
    let ((bs, b), (cs, c)) = (t.bench, t.cmp);
    let (b, c) = (b?, c?);
    let name = t.label;
    match (b.stride, c.stride) {
        (None, Some(s)) => {
            return Some(format!(
                "cmp {name} is a non-contiguous view (stride {}) where bench is contiguous",
                list(s)
            ))
        }
        (Some(s), None) => {
            return Some(format!(
                "bench {name} is a non-contiguous view (stride {}) where cmp is contiguous",
                list(s)
            ))
        }
        (Some(x), Some(y)) if bs == cs && !same_strides(bs, x, y) => {
            return Some(format!(
                "cmp {name} has stride {} where bench has {} (both non-contiguous views)",
                list(y),
                list(x)
            ))
        }
        _ => {}
    }
    if b.offset != c.offset {
        return Some(format!(
            "cmp {name} starts at storage offset {} where bench starts at {}",
            c.offset, b.offset
        ));
    }
    match (b.format, c.format) {
        (Some(x), Some(y)) if x != y => Some(format!(
            "cmp {name} is in device format {y} where bench is in {x}"
        )),
        _ => None,
    }
}

/// Whether two strides of one shape are the same over its dimensions of size > 1.
fn same_strides(shape: &[usize], x: &[usize], y: &[usize]) -> bool {
    shape
        .iter()
        .zip(x.iter().zip(y))
        .all(|(&d, (a, b))| d <= 1 || a == b)
}

fn list(s: &[usize]) -> String {
    let parts: Vec<String> = s.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(stride: Option<&[usize]>, offset: u64, storage: u64) -> Option<LayoutRef<'_>> {
        Some(LayoutRef {
            stride,
            offset,
            storage: Some(storage),
            format: None,
        })
    }

    #[test]
    fn a_view_read_where_the_other_side_is_contiguous_is_told() {
        let shape = [4usize, 4];
        let t = Sides {
            label: "input.0",
            bench: (&shape, l(None, 0, 0)),
            cmp: (&shape, l(Some(&[1, 4]), 0, 0)),
        };
        assert_eq!(
            differences(&[t]),
            ["cmp input.0 is a non-contiguous view (stride [1, 4]) where bench is contiguous"]
        );
    }

    #[test]
    fn what_no_kernel_sees_is_not_told() {
        // Strides of size-1 dimensions, a layout one side does not record, equal ones.
        let shape = [4usize, 1, 3];
        let t = Sides {
            label: "input.0",
            bench: (&shape, l(Some(&[3, 7, 12]), 0, 0)),
            cmp: (&shape, l(Some(&[3, 1, 12]), 0, 0)),
        };
        let unknown = Sides {
            label: "input.1",
            bench: (&shape, None),
            cmp: (&shape, l(Some(&[1, 1, 4]), 0, 1)),
        };
        assert!(differences(&[t, unknown]).is_empty());
    }

    #[test]
    fn strides_offsets_aliasing_and_formats_are_told() {
        let shape = [4usize, 4];
        let formatted = |f, storage| {
            l(None, 0, storage).map(|x| LayoutRef {
                format: Some(f),
                ..x
            })
        };
        let ts = [
            Sides {
                label: "input.0",
                bench: (&shape, l(Some(&[1, 4]), 0, 0)),
                cmp: (&shape, l(Some(&[1, 8]), 0, 0)),
            },
            Sides {
                label: "input.1",
                bench: (&shape, l(None, 0, 1)),
                cmp: (&shape, l(None, 16, 1)),
            },
            Sides {
                label: "output.0",
                bench: (&shape, formatted("2", 2)),
                cmp: (&shape, formatted("29", 1)),
            },
        ];
        assert_eq!(
            differences(&ts),
            [
                "cmp input.0 has stride [1, 8] where bench has [1, 4] (both non-contiguous views)",
                "cmp input.1 starts at storage offset 16 where bench starts at 0",
                "cmp output.0 is in device format 29 where bench is in 2",
                "cmp output.0 shares its storage with input.1 (a view of it, or written in \
                 place) where bench's does not",
            ]
        );
    }
}
