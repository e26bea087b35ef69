//! Builds the capture agent's statistics kernel (`src/agent_stats.rs`) as a small C-ABI shared
//! library for the `probe` binary to embed (`probe agent-kernel` writes it out for the
//! agent's `ctypes`). The wheel ships one program and no extension module (maturin's
//! `bindings = "bin"`), so this is how native code reaches the Python agent.
//!
//! The file has no dependencies, so it is one `rustc` call (~1 s) with the same compiler and
//! target as the crate. Where that fails (a cross build without its linker, another OS) the
//! binary is built without the kernel, says so when asked, and the agent keeps PyTorch's
//! reductions: never a failed build for an optional speed-up.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=src/agent_stats.rs");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(probe_agent_kernel)");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let (Some(out_dir), Some(root), Ok(target)) = (
        env::var_os("OUT_DIR"),
        env::var_os("CARGO_MANIFEST_DIR"),
        env::var("TARGET"),
    ) else {
        return;
    };
    let lib = PathBuf::from(out_dir).join("agent_stats.so");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.args([
        "--crate-type=cdylib",
        "--crate-name=probe_agent_stats",
        "--edition=2021",
        "-Copt-level=3",
        "-Cpanic=abort",
        "-Cstrip=symbols",
        "--target",
        &target,
        "-o",
    ])
    .arg(&lib)
    .arg(PathBuf::from(root).join("src").join("agent_stats.rs"));
    let linker_var = format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_uppercase().replace('-', "_")
    );
    if let Ok(linker) = env::var(linker_var) {
        cmd.arg(format!("-Clinker={linker}"));
    }
    match cmd.status() {
        Ok(s) if s.success() && lib.is_file() => {
            println!("cargo::rustc-cfg=probe_agent_kernel");
        }
        other => {
            println!(
                "cargo::warning=the agent's statistics kernel was not built ({other:?}): \
                 capture on CPU uses PyTorch's reductions"
            );
        }
    }
}
