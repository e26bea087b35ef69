//! probe: precision debugging for deep-learning training.
//!
//! The data flows through the modules in this order:
//! [`dump`] (find and read dumps of either side) → [`compare`] (match tensors, compute
//! [`metrics`] in parallel, judge each with [`tolerance`]) → [`localize`] (name the first
//! divergent operator) → [`report`] (xlsx, parquet, JSON, terminal).
//! [`synth`] writes deterministic synthetic dump pairs for tests, demos and benchmarks.

pub mod atomic;
pub mod compare;
pub mod config_check;
pub mod dtype;
pub mod dump;
pub mod error;
pub mod localize;
pub mod metrics;
pub mod report;
pub mod synth;
pub mod tensor;
pub mod tolerance;

pub use error::{ProbeError, Result};
