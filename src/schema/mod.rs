//! The on-disk records of probe's formats, mirroring `schemas/`: one set of types shared
//! by the readers, the writers (`probe synth`, the reports) and the tests, so that no
//! writer can drift from what the reader accepts.
//!
//! - `compare`: the plain records of a compare that summary.json and the reports hold.
//! - [`dump`]: the probe dump format v1 (`manifest.json`, `ops.jsonl`, `stacks.jsonl`;
//!   `schemas/probe-dump-*.v1.schema.json`).
//! - [`summary`]: `summary.json` of a compare (`schemas/probe-compare-summary.v2.schema.json`);
//!   `sources`: what its findings say of where a divergence enters.
//! - `scan`: `summary.json` of a scan (`schemas/probe-scan-summary.v1.schema.json`).

pub(crate) mod compare;
pub mod dump;
pub(crate) mod scan;
mod sources;
pub mod summary;
