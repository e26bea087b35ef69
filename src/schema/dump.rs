//! Records of the probe dump format v1 (docs/format.md, `schemas/probe-dump-*.v1`).
//!
//! Fields are declared in alphabetical order: serialised records then keep the byte layout
//! the bundled dumps under `testdata/` were written with.

use serde::{Deserialize, Serialize};

/// `compiled_capture` of a manifest: what of the compiled graphs was captured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompiledCaptureRecord {
    /// Whether their backward records were captured.
    #[serde(default)]
    pub backward: bool,
    /// Whether their forward API calls were captured.
    #[serde(default)]
    pub forward: bool,
    /// How many compiled graphs had their calls captured.
    #[serde(default)]
    pub graphs: u64,
}

/// `manifest.json` at the root of a dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestRecord {
    /// Present (true) when compiled code (`torch.compile`, TorchScript) that the agent could
    /// not instrument ran while a step was captured: the operators inside it are not in the
    /// dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled: Option<bool>,
    /// Present when the agent captured the API calls inside compiled graphs (statistics
    /// computed by the graphs): how many graphs, in which directions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled_capture: Option<CompiledCaptureRecord>,
    /// Creation time (RFC 3339).
    #[serde(default)]
    pub created: String,
    /// Device the run used (`cpu`, `cuda:0`, `npu:0`).
    #[serde(default)]
    pub device: String,
    /// Always `probe-dump`.
    pub format: String,
    /// The framework (`pytorch`, or `synthetic` for `probe synth`).
    #[serde(default)]
    pub framework: String,
    /// The framework's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_version: Option<String>,
    /// Capture level (`api`, `module`, `mix`).
    #[serde(default)]
    pub level: String,
    /// What is recorded per tensor: `statistics`, `tensor` or `checksum`.
    pub mode: String,
    /// Present when the agent ran in overflow mode: only ops that produced NaN/Inf were
    /// recorded, so a missing op or step was finite, not lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<OverflowRecord>,
    /// The program that wrote the dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<String>,
    /// Format version; this probe reads 1.
    pub version: u64,
    /// How many ranks the job ran on (`torch.distributed`'s world size; 1 without it).
    /// Optional: dumps written before it, and msprobe's, are read without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u64>,
}

/// The overflow-mode settings of a dump.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverflowRecord {
    /// How many overflowing ops the agent was to record; -1 = no limit.
    pub overflow_nums: i64,
}

/// One line of `ops.jsonl`: one op call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// The call's non-tensor arguments by slot (`input.1`, `input.eps`): numbers, strings,
    /// bools and short lists (`crate::dump::args`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<serde_json::Map<String, serde_json::Value>>,
    /// `forward` or `backward`.
    pub direction: String,
    /// `api`, `module` or `parameters_grad`.
    pub kind: String,
    /// The dotted module path the call happened in.
    #[serde(default)]
    pub module: Option<String>,
    /// The op key (docs/format.md).
    pub op: String,
    /// The call was a recomputation (activation checkpointing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recompute: bool,
    /// A collective (`Distributed.*`): the global ranks of its process group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Vec<u32>>,
    /// A collective: its sequence number within the group and step (the same on every rank
    /// for the same collective).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coll_seq: Option<u64>,
    /// Execution order within the rank, strictly increasing.
    pub seq: u64,
    /// Id of the call stack in `stacks.jsonl`.
    #[serde(default)]
    pub stack: Option<u64>,
    /// The op's tensors.
    pub tensors: Vec<TensorRecord>,
}

/// One tensor of an op record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TensorRecord {
    /// A checksum of the raw bytes (`crc32:<hex>`), in checksum mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// Element type (`float32`, `bfloat16`, ...).
    pub dtype: String,
    /// The safetensors shard (next to `ops.jsonl`) holding the data, in tensor mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Byte range of the data within the shard's data section as the agent streamed it;
    /// only used to recover a shard a crash left as `<file>.stream.tmp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_offsets: Option<[u64; 2]>,
    /// Dataflow id of an output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Flattened name: op key + slot.
    pub name: String,
    /// `input`, `output` or `parameter`.
    pub role: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Dataflow id of the captured output an input came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<u64>,
    /// Statistics over all elements; null where not computable.
    pub stats: Option<StatsRecord>,
    /// The tensor read memory nothing had written since it was allocated: its bytes are
    /// leftovers, so it has no statistics, data or checksum (docs/format.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unwritten: bool,
    /// Layout (docs/format.md, "Layout"): strides in elements, where not contiguous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<Vec<usize>>,
    /// Layout: the storage offset in elements, where not 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Layout: the step's id of its storage (views of one storage share it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<u64>,
    /// Layout: the device's internal format (an NPU's), a number or a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<FormatText>,
}

/// A device's internal format as recorded, a number or a string, held as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatText(pub Box<str>);

impl Serialize for FormatText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.parse::<i64>() {
            Ok(n) => s.serialize_i64(n),
            Err(_) => s.serialize_str(&self.0),
        }
    }
}

impl<'de> Deserialize<'de> for FormatText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FormatText, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = FormatText;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E>(self, v: i64) -> Result<FormatText, E> {
                Ok(FormatText(v.to_string().into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<FormatText, E> {
                Ok(FormatText(v.to_string().into()))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<FormatText, E> {
                Ok(FormatText(s.into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The statistics of a tensor record.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct StatsRecord {
    /// Count of infinite elements.
    #[serde(default)]
    pub inf: Option<u64>,
    /// Largest element (bool: any).
    #[serde(default)]
    pub max: Stat,
    /// Mean of the elements.
    #[serde(default)]
    pub mean: Stat,
    /// Smallest element (bool: all).
    #[serde(default)]
    pub min: Stat,
    /// Count of NaN elements.
    #[serde(default)]
    pub nan: Option<u64>,
    /// L2 norm.
    #[serde(default)]
    pub norm: Stat,
}

/// One line of `stacks.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StackRecord {
    /// Python frames, outermost first.
    pub frames: Vec<String>,
    /// The id op records refer to.
    pub id: u64,
}

/// A statistic: a number, null, or a string standing for a value JSON cannot hold
/// (`"nan"`, `"inf"`, `"-inf"`). Written the same way; read without building a
/// `serde_json::Value` (there are 100,000s of them per dump).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stat(pub Option<f64>);

impl Serialize for Stat {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            None => s.serialize_none(),
            Some(v) if v.is_nan() => s.serialize_str("nan"),
            Some(v) if v.is_infinite() => s.serialize_str(if v > 0.0 { "inf" } else { "-inf" }),
            Some(v) => s.serialize_f64(v),
        }
    }
}

impl<'de> Deserialize<'de> for Stat {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Stat, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Stat;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, null, \"nan\", \"inf\" or \"-inf\"")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Stat, E> {
                Ok(Stat(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Stat, E> {
                Ok(Stat(Some(v as f64)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Stat, E> {
                Ok(Stat(Some(v as f64)))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Stat, E> {
                Ok(Stat(Some(if v { 1.0 } else { 0.0 })))
            }
            fn visit_unit<E>(self) -> Result<Stat, E> {
                Ok(Stat(None))
            }
            fn visit_none<E>(self) -> Result<Stat, E> {
                Ok(Stat(None))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Stat, E> {
                parse_stat(s).map(|v| Stat(Some(v))).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A statistic written as a string: the non-finite values JSON cannot hold, or a number.
pub(crate) fn parse_stat(s: &str) -> Result<f64, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "nan" | "-nan" => Ok(f64::NAN),
        "inf" | "+inf" | "infinity" => Ok(f64::INFINITY),
        "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
        other => other
            .parse::<f64>()
            .map_err(|_| format!("statistic {s:?} is not a number")),
    }
}
