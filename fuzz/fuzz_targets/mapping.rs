//! Mapping files: probe's TOML and msprobe's YAML (`probe compare --mapping`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use probe::compare::Mapping;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Mapping::from_toml(text, Path::new("map.toml")) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    if let Err(e) = Mapping::from_yaml(text, Path::new("map.yaml")) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
});
