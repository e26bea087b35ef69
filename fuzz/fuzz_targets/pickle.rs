//! The restricted pickle interpreter of `.pt` files (`data.pkl`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = probe::tensor::pt::parse_pickle(data) {
        assert!(!e.contains('\n'), "{e:?}");
    }
});
