//! `.npy` files: the header, and the data it declares checked against the file length.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match probe::tensor::npy::locate(data, data.len() as u64) {
        Ok(t) => {
            let end = (t.numel as u64) * (t.dtype.size() as u64) + t.offset;
            assert!(end <= data.len() as u64, "{t:?}");
        }
        Err(e) => assert!(!e.contains('\n'), "{e:?}"),
    }
});
