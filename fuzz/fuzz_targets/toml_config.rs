//! TOML configs: compare's tolerance file and config-check's rules file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = probe::compare::tolerance::Tolerances::from_toml(text, Path::new("tol.toml")) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    if let Err(e) = probe::config_check::rules::Rules::from_toml(text, Path::new("rules.toml")) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
});
