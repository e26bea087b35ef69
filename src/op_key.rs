//! The op-key grammar, parsed in one place.
//!
//! Both dump formats name ops the way msprobe does (docs/format.md):
//! - API call: `{ApiType}.{api}.{call}.{forward|backward}`, e.g. `Functional.gelu.3.forward`;
//! - module call: `{Module|Cell}.{path}.{Class}.{forward|backward}.{call}`;
//! - parameter gradients: `Module.{path}.{Class}.parameters_grad[.{n}]`.
//!
//! A tensor's name is its op key followed by a slot (`.input.0`, `.output.1.2`,
//! `.parameters.weight`, `.input.ceil_mode`). Matching, renumbering backward calls, pairing a
//! backward call with its forward call and every report read these parts from an [`OpKey`]
//! rather than splitting strings again.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::LazyLock;

/// Forward or backward.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// A forward call (the optimizer's ops are forward calls too).
    #[default]
    Forward,
    /// A backward call, or a parameter gradient.
    Backward,
}

impl Direction {
    /// The name used in keys and reports.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        }
    }

    /// Parses `forward` / `backward`.
    pub fn parse(s: &str) -> Option<Direction> {
        match s {
            "forward" => Some(Direction::Forward),
            "backward" => Some(Direction::Backward),
            _ => None,
        }
    }
}

/// What kind of call an op record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A call of a framework API (`torch.*`, `F.*`, tensor methods, NPU ops, ...).
    #[default]
    Api,
    /// A call of an `nn.Module` (or MindSpore `Cell`).
    Module,
    /// The gradients of a module's parameters.
    ParametersGrad,
}

impl OpKind {
    /// The name used in the probe dump format.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Api => "api",
            OpKind::Module => "module",
            OpKind::ParametersGrad => "parameters_grad",
        }
    }

    /// Parses `api` / `module` / `parameters_grad`.
    pub fn parse(s: &str) -> Option<OpKind> {
        match s {
            "api" => Some(OpKind::Api),
            "module" => Some(OpKind::Module),
            "parameters_grad" => Some(OpKind::ParametersGrad),
            _ => None,
        }
    }
}

/// The role of a tensor in its op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// An argument (positional or keyword). For a backward call: the gradient of the
    /// forward call's output.
    Input,
    /// A result. For a backward call: the gradient of the forward call's input.
    Output,
    /// A module parameter (forward) or a parameter gradient (backward).
    Parameter,
}

impl Role {
    /// The name used in the probe dump format and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Output => "output",
            Role::Parameter => "parameter",
        }
    }

    /// Parses `input` / `output` / `parameter`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "input" => Some(Role::Input),
            "output" => Some(Role::Output),
            "parameter" => Some(Role::Parameter),
            _ => None,
        }
    }
}

/// Where the call counter and the direction sit in a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Form {
    /// `Type.api.CALL.direction`
    Api,
    /// `Module.path.Class.direction.CALL`
    Module,
    /// `...parameters_grad[.n]`
    ParametersGrad,
    /// Anything else: kept as written.
    Other,
}

/// What parsing a key finds, apart from its text: held beside the text by an owned key and
/// by the compact op store, which hands out borrowed keys ([`KeyRef`]) without parsing or
/// allocating again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyParts {
    pub(crate) form: Form,
    pub(crate) direction: Direction,
    /// Whether the key has a call counter, and the counter (16 bytes in all, where an
    /// `Option<u64>` alone takes 16: every op of a store holds one).
    has_call: bool,
    call: u64,
    /// Length of the part before the call counter and the direction
    /// (`Functional.gelu`, `Module.fc.Linear`); a key is a line of a file read with a
    /// 64 MiB cap, so it fits (a longer one would keep its first 4 GiB as base).
    pub(crate) base_len: u32,
}

impl KeyParts {
    /// The parts as 6 bits (form, direction, whether there is a call counter) and the
    /// counter and base length: how the op store packs them.
    pub(crate) fn pack(&self) -> (u16, u64, u32) {
        let form = match self.form {
            Form::Api => 0,
            Form::Module => 1,
            Form::ParametersGrad => 2,
            Form::Other => 3,
        };
        let dir = u16::from(self.direction == Direction::Backward);
        let bits = form | dir << 2 | u16::from(self.has_call) << 3;
        (bits, self.call, self.base_len)
    }

    /// The parts [`KeyParts::pack`] packed.
    pub(crate) fn unpack(bits: u16, call: u64, base_len: u32) -> KeyParts {
        let form = match bits & 3 {
            0 => Form::Api,
            1 => Form::Module,
            2 => Form::ParametersGrad,
            _ => Form::Other,
        };
        let direction = if bits & 4 != 0 {
            Direction::Backward
        } else {
            Direction::Forward
        };
        KeyParts {
            form,
            direction,
            has_call: bits & 8 != 0,
            call,
            base_len,
        }
    }

    /// Parses a key's text. Never fails: a key outside the grammar is kept as written,
    /// with the direction read from its last `forward`/`backward` part (forward if none).
    /// Walks the key's bytes once and allocates nothing.
    pub fn of(raw: &str) -> KeyParts {
        // The last three dot-separated parts, and where each starts.
        let mut tail: [(usize, &str); 3] = [(0, ""); 3];
        let mut n = 0usize;
        let mut end = raw.len();
        for (i, _) in raw
            .match_indices('.')
            .rev()
            .chain(std::iter::once((usize::MAX, "")))
        {
            let start = if i == usize::MAX { 0 } else { i + 1 };
            if n < 3 {
                tail[n] = (start, &raw[start..end]);
            }
            n += 1;
            end = i;
            if n >= 4 {
                break;
            }
        }
        let prefix = raw.split('.').next().unwrap_or("");
        // Where a part `parameters_grad` starts (a whole dot-separated part).
        let grad = raw
            .split('.')
            .scan(0usize, |at, part| {
                let start = *at;
                *at += part.len() + 1;
                Some((start, part))
            })
            .find(|&(_, part)| part == "parameters_grad");
        let (last, second) = (tail[0], tail[1]);
        let base_of = |part_start: usize| part_start.saturating_sub(1);
        let (form, base_len, call, direction) = if let Some((i, _)) = grad {
            let rest = &raw[(i + "parameters_grad".len())..];
            let call = rest
                .strip_prefix('.')
                .and_then(|r| r.split('.').next())
                .and_then(|c| c.parse().ok());
            (
                Form::ParametersGrad,
                i.saturating_sub(1),
                call,
                Direction::Backward,
            )
        } else if matches!(prefix, "Module" | "Cell")
            && n >= 4
            && is_call(last.1)
            && Direction::parse(second.1).is_some()
        {
            let d = Direction::parse(second.1).unwrap_or_default();
            (Form::Module, base_of(second.0), last.1.parse().ok(), d)
        } else if n >= 4 && is_call(second.1) && Direction::parse(last.1).is_some() {
            let d = Direction::parse(last.1).unwrap_or_default();
            (Form::Api, base_of(second.0), second.1.parse().ok(), d)
        } else {
            let d = raw
                .rsplit('.')
                .find_map(Direction::parse)
                .unwrap_or_default();
            (Form::Other, raw.len(), None, d)
        };
        KeyParts {
            form,
            direction,
            has_call: call.is_some(),
            call: call.unwrap_or(0),
            base_len: u32::try_from(base_len).unwrap_or(u32::MAX),
        }
    }

    /// The call counter, when the key has one.
    pub fn call(&self) -> Option<u64> {
        self.has_call.then_some(self.call)
    }
}

/// A parsed op key over its text `S`: owned ([`OpKey`], what records and rows hold) or
/// borrowed from a compact op store (`KeyRef`). [`Key::as_str`] gives the key exactly as
/// written; equality and hashing go by that text (everything else follows from it).
#[derive(Debug, Clone, Copy)]
pub struct Key<S> {
    raw: S,
    parts: KeyParts,
}

/// An owned op key. Compact (40 bytes): every row holds one.
pub type OpKey = Key<Box<str>>;

/// An op key borrowed from the store it was read into (no allocation).
pub(crate) type KeyRef<'a> = Key<&'a str>;

/// The module path of a module record's key (`Module.a.b.Class.forward.0`, msprobe's
/// `Cell.` too: `a.b`); None for other keys.
pub fn module_path(key: &str) -> Option<&str> {
    module_class(key).map(|(path, _)| path)
}

/// A module record's key split into its module path and class (`Module.a.b.Class.forward.0`,
/// a parameter-gradient record's `Module.a.b.Class.parameters_grad`, msprobe's `Cell.` too:
/// `("a.b", "Class")`); None for other keys.
pub(crate) fn module_class(key: &str) -> Option<(&str, &str)> {
    let rest = key
        .strip_prefix("Module.")
        .or_else(|| key.strip_prefix("Cell."))?;
    let head = match rest.strip_suffix(".parameters_grad") {
        Some(head) => head,
        None => {
            let (head, call) = rest.rsplit_once('.')?;
            let (head, direction) = head.rsplit_once('.')?;
            if !is_call(call) || Direction::parse(direction).is_none() {
                return None;
            }
            head
        }
    };
    let (path, class) = head.rsplit_once('.')?;
    Some((path, class))
}

/// An API name without an op key's call counter and direction:
/// `Functional.gelu.3.forward` → `Functional.gelu`; anything else unchanged.
pub(crate) fn api_name(op: &str) -> &str {
    let Some((rest, dir)) = op.rsplit_once('.') else {
        return op;
    };
    if dir != "forward" && dir != "backward" {
        return op;
    }
    match rest.rsplit_once('.') {
        Some((api, call)) if !call.is_empty() && call.bytes().all(|b| b.is_ascii_digit()) => api,
        _ => op,
    }
}

/// The slot of a forward tensor's gradient in its backward call: a forward input's gradient
/// is the backward call's output in the same position, a forward output's its input
/// (`input.1` → `output.1`); None for other slots (parameters, keyword arguments' names).
pub(crate) fn gradient_slot(slot: &str) -> Option<String> {
    if let Some(i) = slot.strip_prefix("input.") {
        Some(format!("output.{i}"))
    } else {
        slot.strip_prefix("output.").map(|i| format!("input.{i}"))
    }
}

fn is_call(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

impl OpKey {
    /// Parses a key. Never fails: a key outside the grammar is kept as written, with the
    /// direction read from its last `forward`/`backward` part (forward if none).
    pub fn parse(key: &str) -> OpKey {
        OpKey::from_string(key.to_string())
    }

    /// [`OpKey::parse`] of an owned key (no copy).
    pub(crate) fn from_string(raw: String) -> OpKey {
        let parts = KeyParts::of(&raw);
        Key {
            raw: raw.into_boxed_str(),
            parts,
        }
    }
}

impl<'a> KeyRef<'a> {
    /// A key whose text was parsed into `parts` before (the op store's).
    pub(crate) fn from_parts(raw: &'a str, parts: KeyParts) -> KeyRef<'a> {
        Key { raw, parts }
    }

    /// An owned copy.
    pub(crate) fn to_owned(self) -> OpKey {
        Key {
            raw: self.raw.into(),
            parts: self.parts,
        }
    }

    /// The key as written, for as long as its store lives.
    pub(crate) fn text(self) -> &'a str {
        self.raw
    }

    /// [`Key::base`], for as long as its store lives.
    pub(crate) fn base_text(self) -> &'a str {
        let end = (self.parts.base_len as usize).min(self.raw.len());
        self.raw.get(..end).unwrap_or(self.raw)
    }
}

impl<S: AsRef<str>> Key<S> {
    /// The key as written.
    pub fn as_str(&self) -> &str {
        self.raw.as_ref()
    }

    /// Forward or backward, as the key says.
    pub fn direction(&self) -> Direction {
        self.parts.direction
    }

    /// API, module or parameter-gradient record, as the key says.
    pub fn kind(&self) -> OpKind {
        match self.parts.form {
            Form::ParametersGrad => OpKind::ParametersGrad,
            Form::Module => OpKind::Module,
            Form::Api | Form::Other => {
                if matches!(self.prefix(), "Module" | "Cell") {
                    OpKind::Module
                } else {
                    OpKind::Api
                }
            }
        }
    }

    /// The first part: the API type (`Functional`, `Torch`, `NPU`, ...) or `Module`.
    pub fn prefix(&self) -> &str {
        self.as_str().split('.').next().unwrap_or("")
    }

    /// The key without call counter and direction: `Functional.gelu`, `Module.fc.Linear`.
    pub fn base(&self) -> &str {
        let raw = self.as_str();
        let end = (self.parts.base_len as usize).min(raw.len());
        raw.get(..end).unwrap_or(raw)
    }

    /// The base's last part: an API's own name (`log` of `Torch.log`, `__truediv__` of
    /// `Tensor.__truediv__`), a module record's class.
    pub(crate) fn leaf(&self) -> &str {
        let base = self.base();
        base.rsplit('.').next().unwrap_or(base)
    }

    /// The per-process call counter, when the key has one.
    pub fn call(&self) -> Option<u64> {
        self.parts.call()
    }

    /// The same call with another counter (`Functional.gelu.3.backward` → `.0.backward`).
    /// None for keys without a counter.
    pub fn with_call(&self, call: u64) -> Option<String> {
        let base = self.base();
        let d = self.parts.direction.name();
        match self.parts.form {
            Form::Api => Some(format!("{base}.{call}.{d}")),
            Form::Module => Some(format!("{base}.{d}.{call}")),
            Form::ParametersGrad | Form::Other => None,
        }
    }

    /// The forward call a backward call belongs to (same counter, as msprobe numbers them):
    /// `Functional.gelu.3.backward` → `Functional.gelu.3.forward`,
    /// `Module.fc.Linear.backward.2` → `Module.fc.Linear.forward.2`.
    pub fn forward_twin(&self) -> Option<String> {
        if self.parts.direction != Direction::Backward {
            return None;
        }
        let (base, call) = (self.base(), self.parts.call()?);
        match self.parts.form {
            Form::Api => Some(format!("{base}.{call}.forward")),
            Form::Module => Some(format!("{base}.forward.{call}")),
            Form::ParametersGrad | Form::Other => None,
        }
    }

    /// Whether the counter of this key can be renumbered (API and module calls).
    pub fn has_call(&self) -> bool {
        matches!(self.parts.form, Form::Api | Form::Module) && self.parts.call().is_some()
    }

    /// The slot of a tensor of this op (`input.0`, `output.1`), when `tensor` starts with
    /// this key.
    pub fn slot<'t>(&self, tensor: &'t str) -> Option<&'t str> {
        tensor.strip_prefix(self.as_str())?.strip_prefix('.')
    }
}

impl<S: AsRef<str>, T: AsRef<str>> PartialEq<Key<T>> for Key<S> {
    fn eq(&self, other: &Key<T>) -> bool {
        self.as_str() == other.as_str()
    }
}

impl<S: AsRef<str>> Eq for Key<S> {}

impl<S: AsRef<str>> std::hash::Hash for Key<S> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

/// Whether an op draws random numbers: then different outputs from agreeing inputs are a
/// different random draw (seeds, generator state), not a faulty kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Randomness {
    /// Deterministic (as far as its name tells).
    None,
    /// Always draws: dropout, `rand*`, `bernoulli`, `normal_`, ...
    Always,
    /// Draws only when its dropout is active (fused attention with `dropout_p > 0` or
    /// `keep_prob < 1`); what the runs recorded of it is read where the op is judged
    /// (`args::draw_switch`).
    WhenDropoutActive,
}

/// The lists of ops that draw random numbers, `python/probe/random_ops.json`: one file that
/// compare (here) and replay (`python/probe/replay/spec.py`) both read, so the two cannot
/// disagree on which ops are random.
#[derive(Deserialize)]
struct RandomOps {
    apis: Vec<String>,
    modules: Vec<String>,
    dropout_when_active: Vec<String>,
}

fn random_ops() -> RandomOps {
    // Built into the binary and tested (`the_random_op_lists_parse`): not an input.
    serde_json::from_str(include_str!("../python/probe/random_ops.json"))
        .expect("python/probe/random_ops.json is valid")
}

/// The APIs that draw random numbers, as `Type.api` with `*` for any characters: the one
/// list the localiser reads (docs/compare.md, "Random ops"). Forward calls only: a backward
/// call reuses its forward call's mask.
pub(crate) static RANDOM_APIS: LazyLock<Vec<String>> = LazyLock::new(|| random_ops().apis);

/// Module classes that draw random numbers (`Module.drop.Dropout.forward.0`).
pub(crate) static RANDOM_MODULES: LazyLock<Vec<String>> = LazyLock::new(|| random_ops().modules);

/// APIs and module classes that draw random numbers only when their dropout is active.
pub(crate) static DROPOUT_WHEN_ACTIVE: LazyLock<Vec<String>> =
    LazyLock::new(|| random_ops().dropout_when_active);

/// APIs that write their target (first argument) without reading it: what it held before,
/// often memory just allocated, is not what they compute from. Matched as [`RANDOM_APIS`].
/// So do the in-place random fills among [`RANDOM_APIS`] (`Tensor.normal_`, ...);
/// `dist.gather` writes its second argument; any call writes an `out=` buffer this way.
pub(crate) const WRITE_ONLY_APIS: &[&str] = &[
    "Tensor.copy_",
    "Tensor.fill_",
    "Tensor.zero_",
    "Distributed.recv",
    "Distributed.irecv",
    "Distributed.scatter",
    "Distributed.all_gather*",
    "Distributed._all_gather_base",
    "Distributed.reduce_scatter*",
    "Distributed._reduce_scatter_base",
    "Distributed.all_to_all*",
];

/// `*` matches any run of characters (none included); everything else literally.
fn wildcard(pattern: &str, s: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = s.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

impl<S: AsRef<str>> Key<S> {
    /// Whether the tensor in `slot` (`input.0`, `input.0.1`, `input.out`) is a target this
    /// op only writes ([`WRITE_ONLY_APIS`]): its value before the call is not an input.
    pub(crate) fn only_writes(&self, slot: &str) -> bool {
        let under = |t: &str| slot == t || slot.strip_prefix(t).is_some_and(|r| r.starts_with('.'));
        if under("input.out") {
            return true;
        }
        if self.parts.form != Form::Api || self.parts.direction != Direction::Forward {
            return false;
        }
        let name = self.base();
        let random_fill = || {
            name.starts_with("Tensor.")
                && name.ends_with('_')
                && self.randomness() == Randomness::Always
        };
        let targets: &[&str] = if name == "Distributed.gather" {
            &["input.1", "input.gather_list"]
        } else if WRITE_ONLY_APIS.iter().any(|p| wildcard(p, name)) || random_fill() {
            &[
                "input.0",
                "input.tensor",
                "input.output",
                "input.output_tensor",
            ]
        } else {
            return false;
        };
        targets.iter().any(|t| under(t))
    }

    /// Whether this op draws random numbers ([`RANDOM_APIS`], [`RANDOM_MODULES`],
    /// [`DROPOUT_WHEN_ACTIVE`]).
    pub(crate) fn randomness(&self) -> Randomness {
        if self.parts.direction != Direction::Forward {
            return Randomness::None;
        }
        let name = match self.parts.form {
            Form::Api => self.base(),
            // The class: the last part of `Module.path.Class`.
            Form::Module => self.base().rsplit('.').next().unwrap_or(""),
            Form::ParametersGrad | Form::Other => return Randomness::None,
        };
        let any = |list: &[String]| list.iter().any(|p| wildcard(p, name));
        let module = self.parts.form == Form::Module && RANDOM_MODULES.iter().any(|m| m == name);
        if any(&RANDOM_APIS) || module {
            Randomness::Always
        } else if any(&DROPOUT_WHEN_ACTIVE) {
            Randomness::WhenDropoutActive
        } else {
            Randomness::None
        }
    }
}

impl<S: AsRef<str>> fmt::Display for Key<S> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<T: AsRef<str>> Serialize for Key<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for OpKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OpKey, D::Error> {
        Ok(OpKey::from_string(String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_random_op_lists_parse() {
        use super::{OpKey, Randomness, DROPOUT_WHEN_ACTIVE, RANDOM_APIS, RANDOM_MODULES};
        assert!(RANDOM_APIS.iter().any(|p| p == "Tensor.normal_"));
        assert!(RANDOM_MODULES.iter().any(|m| m == "Dropout"));
        assert!(DROPOUT_WHEN_ACTIVE
            .iter()
            .any(|p| p == "MultiheadAttention"));
        let random = |k: &str| OpKey::parse(k).randomness();
        assert_eq!(random("Functional.dropout.0.forward"), Randomness::Always);
        assert_eq!(random("Module.drop.Dropout.forward.0"), Randomness::Always);
        assert_eq!(
            random("Functional.scaled_dot_product_attention.0.forward"),
            Randomness::WhenDropoutActive
        );
        assert_eq!(random("Functional.gelu.0.forward"), Randomness::None);
    }

    #[test]
    fn module_records_split_into_path_and_class() {
        use super::{module_class, module_path};
        let k = "Module.model.layers.0.LlamaDecoderLayer.forward.0";
        assert_eq!(
            module_class(k),
            Some(("model.layers.0", "LlamaDecoderLayer"))
        );
        assert_eq!(module_path(k), Some("model.layers.0"));
        assert_eq!(
            module_class("Cell.net.Dense.backward.1"),
            Some(("net", "Dense"))
        );
        assert_eq!(module_class("Module.Linear.forward.0"), None);
        let grad = "Module.a.b.Linear.parameters_grad";
        assert_eq!(module_class(grad), Some(("a.b", "Linear")));
        assert_eq!(module_path(grad), Some("a.b"));
        // Not a call of a module: no direction and call counter, or no path.
        assert_eq!(module_class("Module.a.b.Linear.forward"), None);
        assert_eq!(module_class("Module.a.b.Linear.output.0"), None);
        assert_eq!(module_class("Functional.linear.0.forward"), None);
    }

    #[test]
    fn api_names_drop_the_call_counter_and_direction() {
        use super::api_name;
        assert_eq!(api_name("Functional.gelu.3.forward"), "Functional.gelu");
        assert_eq!(api_name("Tensor.__add__.0.backward"), "Tensor.__add__");
        // Outside the API grammar, unchanged.
        assert_eq!(api_name("Functional.gelu"), "Functional.gelu");
        assert_eq!(
            api_name("Module.fc.Linear.forward.0"),
            "Module.fc.Linear.forward.0"
        );
        assert_eq!(
            api_name("Functional.gelu.x.forward"),
            "Functional.gelu.x.forward"
        );
    }

    #[test]
    fn a_gradient_sits_in_the_mirrored_slot() {
        use super::gradient_slot;
        assert_eq!(gradient_slot("input.1").as_deref(), Some("output.1"));
        assert_eq!(gradient_slot("output.0").as_deref(), Some("input.0"));
        assert_eq!(gradient_slot("parameters.weight"), None);
    }

    use super::*;

    #[test]
    fn targets_an_op_only_writes_are_known_by_name_and_slot() {
        let writes = |key: &str, slot: &str| OpKey::parse(key).only_writes(slot);
        for key in [
            "Tensor.copy_.0.forward",
            "Tensor.normal_.1.forward",
            "Tensor.bernoulli_.0.forward",
            "Distributed.irecv.2.forward",
            "Distributed.all_gather_into_tensor.0.forward",
        ] {
            assert!(writes(key, "input.0"), "{key}");
            assert!(!writes(key, "input.1"), "{key}");
        }
        assert!(writes("Distributed.all_gather.0.forward", "input.0.1"));
        assert!(writes("Distributed.gather.0.forward", "input.1.0"));
        assert!(!writes("Distributed.gather.0.forward", "input.0"));
        assert!(writes("Torch.add.0.forward", "input.out"));
        for (key, slot) in [
            ("Tensor.add_.0.forward", "input.0"),
            ("Tensor.bernoulli.0.forward", "input.0"),
            ("Tensor.copy_.0.backward", "input.0"),
            ("Distributed.all_reduce.0.forward", "input.0"),
            ("Tensor.copy_.0.forward", "input.00"),
        ] {
            assert!(!writes(key, slot), "{key} {slot}");
        }
    }

    #[test]
    fn random_ops_are_known_by_name() {
        let always = [
            "Functional.dropout.0.forward",
            "Functional.dropout2d.3.forward",
            "Functional.feature_alpha_dropout.0.forward",
            "Functional.rrelu.0.forward",
            "Functional.gumbel_softmax.1.forward",
            "Torch.rand.0.forward",
            "Torch.randn_like.2.forward",
            "Torch.randint.0.forward",
            "Torch.randperm.0.forward",
            "Torch.bernoulli.0.forward",
            "Torch.multinomial.0.forward",
            "Torch.normal.0.forward",
            "Torch.native_dropout.0.forward",
            "Tensor.bernoulli_.0.forward",
            "Tensor.normal_.4.forward",
            "Tensor.uniform_.0.forward",
            "Tensor.random_.0.forward",
            "Tensor.exponential_.0.forward",
            "NPU.npu_dropout.0.forward",
            "NPU.npu_dropout_with_add_softmax.0.forward",
            "Module.block.drop.Dropout.forward.0",
        ];
        for k in always {
            assert_eq!(OpKey::parse(k).randomness(), Randomness::Always, "{k}");
        }
        let maybe = [
            "Functional.scaled_dot_product_attention.0.forward",
            "NPU.npu_fusion_attention.1.forward",
            "Module.attn.MultiheadAttention.forward.0",
        ];
        for k in maybe {
            let r = OpKey::parse(k).randomness();
            assert_eq!(r, Randomness::WhenDropoutActive, "{k}");
        }
        let not = [
            "Functional.dropout.0.backward",
            "Module.block.drop.Dropout.backward.0",
            "Torch.range.0.forward",
            "Torch.matmul.0.forward",
            "Tensor.normal.0.forward",
            "Functional.linear.0.forward",
            "Module.dropout.Linear.forward.0",
            "Module.fc.Linear.parameters_grad",
            "random",
        ];
        for k in not {
            assert_eq!(OpKey::parse(k).randomness(), Randomness::None, "{k}");
        }
    }

    #[test]
    fn api_keys() {
        let k = OpKey::parse("Functional.gelu.3.forward");
        assert_eq!(k.kind(), OpKind::Api);
        assert_eq!(k.direction(), Direction::Forward);
        assert_eq!(
            (k.prefix(), k.base(), k.call()),
            ("Functional", "Functional.gelu", Some(3))
        );
        assert_eq!(k.forward_twin(), None);
        assert_eq!(k.with_call(0).as_deref(), Some("Functional.gelu.0.forward"));
        let b = OpKey::parse("Functional.gelu.3.backward");
        assert_eq!(b.direction(), Direction::Backward);
        assert_eq!(
            b.forward_twin().as_deref(),
            Some("Functional.gelu.3.forward")
        );
        assert_eq!(
            b.with_call(0).as_deref(),
            Some("Functional.gelu.0.backward")
        );
        // Dunder and dotted API names.
        let d = OpKey::parse("Tensor.__add__.12.forward");
        assert_eq!((d.base(), d.call()), ("Tensor.__add__", Some(12)));
        let l = OpKey::parse("Torch.linalg.vector_norm.1.backward");
        assert_eq!(
            (l.prefix(), l.base(), l.call(), l.kind()),
            ("Torch", "Torch.linalg.vector_norm", Some(1), OpKind::Api)
        );
        assert_eq!(
            l.forward_twin().as_deref(),
            Some("Torch.linalg.vector_norm.1.forward")
        );
    }

    #[test]
    fn module_keys() {
        let k = OpKey::parse("Module.layers.0.attn.Attention.backward.2");
        assert_eq!(k.kind(), OpKind::Module);
        assert_eq!(k.direction(), Direction::Backward);
        assert_eq!(k.base(), "Module.layers.0.attn.Attention");
        assert_eq!(k.call(), Some(2));
        assert_eq!(
            k.forward_twin().as_deref(),
            Some("Module.layers.0.attn.Attention.forward.2")
        );
        assert_eq!(
            k.with_call(0).as_deref(),
            Some("Module.layers.0.attn.Attention.backward.0")
        );
        assert_eq!(
            OpKey::parse("Cell.fc.Dense.forward.0").kind(),
            OpKind::Module
        );
    }

    #[test]
    fn parameter_gradients_and_other_keys() {
        for key in [
            "Module.fc.Linear.parameters_grad",
            "Module.fc.Linear.parameters_grad.1",
        ] {
            let k = OpKey::parse(key);
            assert_eq!(k.kind(), OpKind::ParametersGrad);
            assert_eq!(k.direction(), Direction::Backward);
            assert_eq!(k.base(), "Module.fc.Linear");
            assert_eq!(k.forward_twin(), None);
            assert_eq!(k.with_call(0), None);
        }
        let o = OpKey::parse("weird_op");
        assert_eq!(
            (o.kind(), o.direction(), o.call()),
            (OpKind::Api, Direction::Forward, None)
        );
        assert_eq!(o.as_str(), "weird_op");
        assert_eq!(
            OpKey::parse("x.backward.y").direction(),
            Direction::Backward
        );
    }

    #[test]
    fn tensor_slots() {
        let k = OpKey::parse("Functional.gelu.3.backward");
        let t = "Functional.gelu.3.backward.input.0";
        assert_eq!(k.slot(t), Some("input.0"));
        assert_eq!(k.slot("Functional.gelu.30.backward.input.0"), None);
        assert_eq!(k.leaf(), "gelu");
        assert_eq!(
            OpKey::parse("Tensor.__truediv__.0.forward").leaf(),
            "__truediv__"
        );
    }
}
