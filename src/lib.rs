//! probe: precision debugging for deep-learning training.
//!
//! The data flows through the modules in this order (docs/architecture.md):
//! [`dump`] (find and read op logs of either format) → [`compare`] (plan units, align
//! tensors, measure with [`metrics`] and [`tensor`] bytes, judge, analyze) → [`verdict`]
//! (the run-wide summary) → [`report`] (xlsx, parquet, JSON, terminal) → [`gate`] (exit
//! code). [`app`] strings them together for the command line; [`config_check`] compares
//! config packs; [`synth`] writes deterministic synthetic dumps for tests, demos and
//! benchmarks. [`schema`] holds the on-disk record types shared by readers and writers;
//! [`progress`] draws progress bars on stderr for the long stages.
//!
//! # What the library exports
//!
//! The items are `pub(crate)` unless something outside the crate needs them: the `probe`
//! binary (`main.rs`: the commands of [`app`], the gate's exit codes), the integration
//! tests and fuzz targets (the readers' entry points on bytes, the record types tests build
//! dumps from, the compare stages a test drives unit by unit), and a program that embeds
//! probe: [`compare::run`] and [`verdict::summarize`] over two dump folders, the
//! [`Summary`] they give, the report writers ([`report::writers`]) and [`config_check`]'s
//! packs. The modules stay public so those paths hold; what a module keeps to the crate is
//! its own business and may change without notice.
#![warn(missing_docs)]

pub mod agent_kernel;
pub mod agent_stats;
pub mod app;
pub mod atomic;
pub mod baseline;
pub mod ckpt;
pub mod compare;
pub mod config_check;
pub mod config_file;
pub mod cost;
pub mod dtype;
pub mod dump;
pub mod error;
pub mod gate;
pub mod json;
pub mod memory;
pub mod metrics;
pub mod monitor;
pub mod op_key;
pub mod progress;
pub mod recapture;
pub mod replay;
pub mod report;
pub mod scan;
pub mod schema;
pub mod synth;
pub mod tensor;
pub mod verdict;
pub mod vocab;

pub use compare::{CompareRun, Options, Sides, UnitSummary};
pub use error::{ProbeError, Result};
pub use gate::FailOn;
pub use schema::summary::Summary;
