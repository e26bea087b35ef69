//! Every integration test but `mutation.rs`, in one test binary (`cargo test --test
//! integration`; one file's tests: `cargo test --test integration hostile::`). One binary is
//! linked once instead of once a file (each links the whole library), and its tests share one
//! pool of threads instead of the binaries running one after another. `mutation.rs` stays a
//! binary of its own: it installs a counting global allocator.

mod common;

mod architecture;
mod arguments;
mod bad_input;
mod chart;
mod ci_gate;
mod ckpt;
mod compare_cli;
mod config_check;
mod config_check_ranks;
mod consequences;
mod cost;
mod crash;
mod distributed;
mod findings;
mod golden;
mod honest;
mod hostile;
mod hostile_readers;
mod html_report;
mod layout;
mod levels;
mod localize_cases;
mod localize_units;
mod loss_scale;
mod mapping_cli;
mod metrics_props;
mod micro_batch;
mod monitor;
mod msprobe;
mod nonfinite;
mod op_key_golden;
mod output_folders;
mod reference;
mod replay;
mod reports;
mod scan;
mod secrets_corpus;
mod selection;
mod shard;
mod tutorial_cli;
mod unwritten;
mod xlsx_rows;
