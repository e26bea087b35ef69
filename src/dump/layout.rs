//! How a tensor lay in memory when it was captured (docs/format.md, "Layout"): the probe
//! agent's optional `stride`, `offset`, `storage` and `format` fields of a tensor record.
//! A record without any of them (an older dump, msprobe's, a meta tensor) has no layout:
//! nothing is known, which is not the same as contiguous.

/// A tensor's layout, owned (the form [`crate::dump::TensorRec`] holds).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// Strides in elements, where the tensor is not contiguous (`is_contiguous`); None:
    /// contiguous.
    pub stride: Option<Vec<usize>>,
    /// Storage offset in elements.
    pub offset: u64,
    /// The step's id of its storage: views of one storage share it within a rank's step.
    pub storage: Option<u64>,
    /// The device's internal format (an NPU's `torch_npu.get_npu_format`), as text.
    pub format: Option<Box<str>>,
}

/// A tensor's layout, borrowed (what the op store hands out and takes in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayoutRef<'a> {
    /// Strides in elements where not contiguous ([`Layout::stride`]).
    pub stride: Option<&'a [usize]>,
    /// Storage offset in elements.
    pub offset: u64,
    /// The step's id of its storage.
    pub storage: Option<u64>,
    /// The device's internal format, as text.
    pub format: Option<&'a str>,
}

impl Layout {
    /// The borrowed form.
    pub fn as_ref(&self) -> LayoutRef<'_> {
        LayoutRef {
            stride: self.stride.as_deref(),
            offset: self.offset,
            storage: self.storage,
            format: self.format.as_deref(),
        }
    }
}

impl LayoutRef<'_> {
    /// The owned form.
    pub fn to_owned(self) -> Layout {
        Layout {
            stride: self.stride.map(<[usize]>::to_vec),
            offset: self.offset,
            storage: self.storage,
            format: self.format.map(Into::into),
        }
    }

    /// Whether it is contiguous (no strides recorded: `is_contiguous` held).
    pub fn contiguous(self) -> bool {
        self.stride.is_none()
    }
}

/// The layout a record's optional fields give, None when it has none of them; an error
/// when they contradict its shape (strides for another number of dimensions) or the store
/// (a storage id past `u32`: the agent numbers a step's storages from 0).
pub(crate) fn of_record<'a>(
    shape: &[usize],
    stride: Option<&'a [usize]>,
    offset: Option<u64>,
    storage: Option<u64>,
    format: Option<&'a str>,
) -> Result<Option<LayoutRef<'a>>, String> {
    if let Some(s) = stride {
        if s.len() != shape.len() {
            return Err(format!(
                "stride of {} dimensions for a shape of {}",
                s.len(),
                shape.len()
            ));
        }
    }
    if let Some(s) = storage.filter(|&s| s >= u64::from(u32::MAX)) {
        return Err(format!("storage id {s} past {}", u32::MAX - 1));
    }
    let any = stride.is_some() || offset.is_some() || storage.is_some() || format.is_some();
    Ok(any.then_some(LayoutRef {
        stride,
        offset: offset.unwrap_or(0),
        storage,
        format,
    }))
}
