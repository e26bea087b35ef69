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
#![warn(missing_docs)]

pub mod agent_kernel;
pub mod agent_stats;
pub mod app;
pub mod atomic;
pub mod compare;
pub mod config_check;
pub mod config_file;
pub mod dtype;
pub mod dump;
pub mod error;
pub mod gate;
pub mod json;
pub mod memory;
pub mod metrics;
pub mod op_key;
pub mod progress;
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
