//! Whole `.pt` files (torch.save zips): the zip directory, `data.pkl`, the storage entry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use probe::dtype::DType;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let r = probe::tensor::pt::read_from(
        std::io::Cursor::new(data),
        data.len() as u64,
        Path::new("fuzz.pt"),
        Some(DType::F32),
    );
    match r {
        Ok(t) => {
            // What it returns must lie inside the file.
            let end = (t.numel as u64)
                .checked_mul(t.dtype.size() as u64)
                .and_then(|n| n.checked_add(t.offset));
            assert!(end.is_some_and(|e| e <= data.len() as u64), "{t:?}");
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});
