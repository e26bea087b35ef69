//! Config pack zips (probe's and msprobe's): the hostile-zip checks, then the pack model.
#![no_main]

use libfuzzer_sys::fuzz_target;
use probe::config_check::{archive, pack};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let r = archive::from_bytes(
        Path::new("fuzz.zip"),
        data.to_vec(),
        &archive::Limits::default(),
    )
    .and_then(|ar| pack::from_archive(&ar));
    if let Err(e) = r {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
});
