//! msprobe's YAML mapping files, translated into a [`Mapping`].
//!
//! msprobe's compare takes four kinds of mapping file (its docs: "自定义映射文件" in
//! 10.accuracy_compare_PyTorch.md and 11.accuracy_compare_MindSpore.md of the mstt
//! repository); which one a file is follows from its shape, so probe needs no flag per kind:
//!
//! - API mapping (`-am`): a list of entries `{ms_api, pt_api, ms_args, pt_args, ms_outputs,
//!   pt_outputs[, ms_parameters, pt_parameters, ms_parameters_grad, pt_parameters_grad]}`
//!   (msprobe's docs show one entry as a bare mapping; both forms are read) →
//!   [`Mapping::api_renames`];
//! - layer mapping (`-lm`): `{LayerClass: {cmp_child: bench_child}}` →
//!   [`Mapping::layer_renames`];
//! - a flat `{name: name}` mapping, told apart by its first key: tensor names → data mapping
//!   (`-dm`, [`Mapping::tensor_pairs`]); `{ApiType}.{api}` names → API renames in the flat
//!   form of msprobe's own `ms_to_pt_api.yaml`; anything else (`fc2.Dense: fc2.Linear`) →
//!   cell mapping (`-cm`, [`Mapping::module_renames`]).
//!
//! In every kind the left-hand name is the comparison run's (msprobe's NPU/MindSpore side)
//! and the right-hand one the benchmark's.
//!
//! The YAML is read as events by `saphyr-parser` (safe Rust) into a small tree built here,
//! bounded where a hostile file could hurt: nesting deeper than [`MAX_DEPTH`] (a mapping
//! file needs 3 levels) and more than [`MAX_NODES`] values are refused before they are
//! built, and aliases are refused outright (no mapping file needs them; expanding them is
//! how a few hundred bytes become gigabytes). Tags and second documents are refused too.

use super::{check_api_name, check_dotted, LayerRename, Mapping, MappingError};
use crate::error::one_line;
use saphyr_parser::{Event, Parser, ScalarStyle};
use std::collections::HashMap;
use std::path::Path;

/// Deepest nesting read. A mapping file needs 3 levels (a list of entries holding lists of
/// slots); the bound stops a file of nested brackets from building a tree that is costly to
/// build and to drop.
pub(crate) const MAX_DEPTH: usize = 16;

/// Most values (names, lists, mappings) read from one file: about twice what a data mapping
/// of a very large model holds.
pub(crate) const MAX_NODES: usize = 2_000_000;

/// A scalar: its text, whether it was written plain (unquoted; only then can it be a YAML
/// null), and its line.
struct Scalar {
    text: String,
    plain: bool,
    line: usize,
}

impl Scalar {
    /// A YAML null (`~`, `null`, or nothing at all), which no name may be.
    fn is_null(&self) -> bool {
        self.plain && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }
}

/// A value of the file, with the line it starts on.
enum Node {
    Scalar(Scalar),
    Seq(Vec<Node>, usize),
    Map(Vec<(Scalar, Node)>, usize),
}

impl Node {
    fn line(&self) -> usize {
        match self {
            Node::Scalar(s) => s.line,
            Node::Seq(_, l) | Node::Map(_, l) => *l,
        }
    }

    /// What the value is, for messages.
    fn what(&self) -> &'static str {
        match self {
            Node::Scalar(s) if s.is_null() => "nothing (null)",
            Node::Scalar(_) => "a name",
            Node::Seq(..) => "a list",
            Node::Map(..) => "a mapping",
        }
    }
}

/// A container being read.
enum Frame {
    Seq(Vec<Node>, usize),
    /// Entries so far, the key waiting for its value, the line.
    Map(Vec<(Scalar, Node)>, Option<Scalar>, usize),
}

/// Reads the file's one document into a tree; None for a file with no document.
fn load(text: &str, path: &Path) -> Result<Option<Node>, MappingError> {
    let yaml = |line: usize, msg: &str| MappingError::Yaml {
        path: path.to_path_buf(),
        line,
        msg: one_line(msg.to_string()),
    };
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let (mut docs, mut nodes) = (0usize, 0usize);
    for ev in Parser::new_from_str(text) {
        let (ev, span) = ev.map_err(|e| yaml(e.marker().line(), e.info()))?;
        let line = span.start.line();
        let (tag, opens) = match &ev {
            Event::Scalar(_, _, _, tag) => (tag.is_some(), false),
            Event::SequenceStart(_, tag) | Event::MappingStart(_, tag) => (tag.is_some(), true),
            _ => (false, false),
        };
        if tag {
            return Err(yaml(
                line,
                "YAML tags (!name) are not allowed in a mapping file",
            ));
        }
        if opens || matches!(ev, Event::Scalar(..)) {
            nodes += 1;
            if nodes > MAX_NODES {
                return Err(yaml(
                    line,
                    &format!("more than {MAX_NODES} values: not a mapping file"),
                ));
            }
        }
        if opens && stack.len() >= MAX_DEPTH {
            return Err(yaml(
                line,
                &format!("nested deeper than {MAX_DEPTH} levels: not a mapping file"),
            ));
        }
        let node = match ev {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => continue,
            Event::DocumentStart(_) => {
                docs += 1;
                if docs > 1 {
                    return Err(yaml(
                        line,
                        "more than one YAML document: a mapping file holds one",
                    ));
                }
                continue;
            }
            Event::Alias(_) => {
                return Err(yaml(
                    line,
                    "YAML aliases (*name) are not allowed in a mapping file",
                ))
            }
            Event::SequenceStart(..) => {
                stack.push(Frame::Seq(Vec::new(), line));
                continue;
            }
            Event::MappingStart(..) => {
                stack.push(Frame::Map(Vec::new(), None, line));
                continue;
            }
            Event::Scalar(v, style, _, _) => Node::Scalar(Scalar {
                text: v.into_owned(),
                plain: style == ScalarStyle::Plain,
                line,
            }),
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq(items, l)) => Node::Seq(items, l),
                _ => return Err(yaml(line, "unbalanced list")),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map(entries, None, l)) => {
                    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(entries.len());
                    for (k, _) in &entries {
                        if let Some(first) = seen.insert(&k.text, k.line) {
                            return Err(MappingError::invalid(
                                path,
                                k.line,
                                format!("{:?} is given twice (first at line {first})", k.text),
                            ));
                        }
                    }
                    Node::Map(entries, l)
                }
                _ => return Err(yaml(line, "unbalanced mapping")),
            },
        };
        match stack.last_mut() {
            None => root = Some(node),
            Some(Frame::Seq(items, _)) => items.push(node),
            Some(Frame::Map(entries, key, _)) => match key.take() {
                Some(k) => entries.push((k, node)),
                None => match node {
                    Node::Scalar(s) => *key = Some(s),
                    other => {
                        return Err(yaml(
                            other.line(),
                            "a mapping key must be a name, not a list or mapping",
                        ))
                    }
                },
            },
        }
    }
    Ok(root)
}

const EMPTY: &str = "no entries: an empty mapping file";

/// The keys of an API mapping entry, and the slot lists that must pair up.
const API_KEYS: [&str; 10] = [
    "ms_api",
    "pt_api",
    "ms_args",
    "pt_args",
    "ms_outputs",
    "pt_outputs",
    "ms_parameters",
    "pt_parameters",
    "ms_parameters_grad",
    "pt_parameters_grad",
];
const SLOT_PAIRS: [(&str, &str); 4] = [
    ("ms_args", "pt_args"),
    ("ms_outputs", "pt_outputs"),
    ("ms_parameters", "pt_parameters"),
    ("ms_parameters_grad", "pt_parameters_grad"),
];

/// API types of dump names (docs/format.md), with MindSpore's: a flat mapping whose first
/// key starts with one of these is a mapping of API names.
const API_TYPES: [&str; 10] = [
    "Tensor",
    "Torch",
    "Functional",
    "NPU",
    "VF",
    "Aten",
    "Distributed",
    "Mint",
    "MintFunctional",
    "Primitive",
];

/// Reads one of msprobe's mapping files.
pub(super) fn parse(text: &str, path: &Path) -> Result<Mapping, MappingError> {
    let bad = |line: usize, msg: String| MappingError::invalid(path, line, msg);
    let root = load(text, path)?.ok_or_else(|| bad(0, EMPTY.into()))?;
    let mut m = Mapping::default();
    match root {
        Node::Scalar(s) if s.is_null() => return Err(bad(s.line, EMPTY.into())),
        Node::Scalar(s) => return Err(bad(
            s.line,
            "a single value, not a mapping: expected msprobe's API, data, cell or layer mapping"
                .into(),
        )),
        Node::Seq(items, line) => {
            if items.is_empty() {
                return Err(bad(line, EMPTY.into()));
            }
            let mut seen = HashMap::new();
            for item in &items {
                match item {
                    Node::Map(entries, l) => api_entry(entries, *l, path, &mut m, &mut seen)?,
                    other => {
                        return Err(bad(
                            other.line(),
                            format!(
                                "a list of API mapping entries (msprobe -am) holds {}: expected a mapping with ms_api and pt_api",
                                other.what()
                            ),
                        ))
                    }
                }
            }
        }
        Node::Map(entries, line) => {
            let Some((_, first)) = entries.first() else {
                return Err(bad(line, EMPTY.into()));
            };
            if entries
                .iter()
                .any(|(k, _)| API_KEYS.contains(&k.text.as_str()))
            {
                api_entry(&entries, line, path, &mut m, &mut HashMap::new())?;
            } else if let Node::Map(..) = first {
                layer_mapping(&entries, path, &mut m)?;
            } else {
                flat_mapping(&entries, path, &mut m)?;
            }
        }
    }
    Ok(m)
}

/// One API mapping entry: `ms_api` → `pt_api` becomes an API rename. The slot lists must
/// pair up (as msprobe requires) and, since probe compares slot i of the renamed call with
/// slot i, list the same slots on both sides.
fn api_entry(
    entries: &[(Scalar, Node)],
    line: usize,
    path: &Path,
    m: &mut Mapping,
    seen: &mut HashMap<String, usize>,
) -> Result<(), MappingError> {
    let bad = |line: usize, msg: String| MappingError::invalid(path, line, msg);
    for (k, _) in entries {
        if !API_KEYS.contains(&k.text.as_str()) {
            return Err(bad(
                k.line,
                format!(
                    "unknown key {:?} in an API mapping entry (msprobe -am): expected {}",
                    k.text,
                    API_KEYS.join(", ")
                ),
            ));
        }
    }
    let get = |key: &str| entries.iter().find(|(k, _)| k.text == key).map(|(_, v)| v);
    let name = |key: &str| -> Result<&Scalar, MappingError> {
        match get(key) {
            Some(Node::Scalar(s)) if !s.is_null() => {
                check_api_name(&s.text, false).map_err(|e| bad(s.line, format!("{key}: {e}")))?;
                Ok(s)
            }
            Some(other) => Err(bad(
                other.line(),
                format!("{key}: expected an API name, found {}", other.what()),
            )),
            None => Err(bad(line, format!("API mapping entry without {key}"))),
        }
    };
    let (ms, pt) = (name("ms_api")?, name("pt_api")?);
    for (a, b) in SLOT_PAIRS {
        let (sa, sb) = (slots(get(a), a, path)?, slots(get(b), b, path)?);
        if sa.len() != sb.len() {
            return Err(bad(
                line,
                format!(
                    "{a} lists {} slot(s) and {b} {}: they must pair up",
                    sa.len(),
                    sb.len()
                ),
            ));
        }
        if sa != sb {
            return Err(bad(
                line,
                format!(
                    "{a} [{}] against {b} [{}]: remapping slots is not supported (probe compares slot i of {} with slot i of {})",
                    sa.join(", "),
                    sb.join(", "),
                    ms.text,
                    pt.text
                ),
            ));
        }
    }
    if let Some(first) = seen.insert(ms.text.clone(), ms.line) {
        return Err(bad(
            ms.line,
            format!(
                "ms_api {:?} is mapped twice (first at line {first})",
                ms.text
            ),
        ));
    }
    m.api_renames.push((ms.text.clone(), pt.text.clone()));
    Ok(())
}

/// The slots a list names (indices normalised: `00` is `0`); absent or null is none.
fn slots(node: Option<&Node>, key: &str, path: &Path) -> Result<Vec<String>, MappingError> {
    let bad = |line: usize, msg: String| MappingError::invalid(path, line, msg);
    match node {
        None => Ok(Vec::new()),
        Some(Node::Scalar(s)) if s.is_null() => Ok(Vec::new()),
        Some(Node::Seq(items, _)) => items
            .iter()
            .map(|i| match i {
                Node::Scalar(s) if !s.is_null() && !s.text.is_empty() => {
                    Ok(match s.text.parse::<u64>() {
                        Ok(n) => n.to_string(),
                        Err(_) => s.text.clone(),
                    })
                }
                other => Err(bad(
                    other.line(),
                    format!("{key}: expected slot indices, found {}", other.what()),
                )),
            })
            .collect(),
        Some(other) => Err(bad(
            other.line(),
            format!(
                "{key}: expected a list of slot indices, found {}",
                other.what()
            ),
        )),
    }
}

/// A layer mapping: `{LayerClass: {cmp_child: bench_child}}`.
fn layer_mapping(
    entries: &[(Scalar, Node)],
    path: &Path,
    m: &mut Mapping,
) -> Result<(), MappingError> {
    let bad = |line: usize, msg: String| MappingError::invalid(path, line, msg);
    for (class, v) in entries {
        check_dotted(&class.text, "layer class").map_err(|e| bad(class.line, e))?;
        let Node::Map(children, _) = v else {
            return Err(bad(
                v.line(),
                format!(
                    "{:?} maps to {}, but the file's first entry makes it a layer mapping (msprobe -lm): {{LayerClass: {{cmp_child: bench_child}}}}",
                    class.text,
                    v.what()
                ),
            ));
        };
        for (k, child) in children {
            let Node::Scalar(b) = child else {
                return Err(bad(
                    child.line(),
                    format!(
                        "layer {:?}: {:?} maps to {}: expected a child name",
                        class.text,
                        k.text,
                        child.what()
                    ),
                ));
            };
            for s in [k, b] {
                check_dotted(&s.text, "child name")
                    .map_err(|e| bad(s.line, format!("layer {:?}: {e}", class.text)))?;
            }
            m.layer_renames.push(LayerRename {
                layer: class.text.clone(),
                cmp: k.text.clone(),
                bench: b.text.clone(),
            });
        }
    }
    if m.layer_renames.is_empty() {
        return Err(bad(0, EMPTY.into()));
    }
    Ok(())
}

/// What a flat `{name: name}` mapping maps.
#[derive(Clone, Copy)]
enum Flat {
    /// Tensor names (data mapping, `-dm`).
    Data,
    /// API names (the flat form of msprobe's built-in API table).
    Api,
    /// `{cell_name}.{class_name}` (cell mapping, `-cm`).
    Cell,
}

impl Flat {
    /// The kind a first key says.
    fn of(name: &str) -> Flat {
        let ty = name.split('.').next().unwrap_or("");
        if is_tensor_name(name) {
            Flat::Data
        } else if API_TYPES.contains(&ty) {
            Flat::Api
        } else {
            Flat::Cell
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Flat::Data => "a data mapping (msprobe -dm), whose every entry maps a tensor name to a tensor name",
            Flat::Api => "an API mapping of {ApiType}.{api} names to {ApiType}.{api} names",
            Flat::Cell => "a cell mapping (msprobe -cm), whose every entry maps {cell_name}.{class_name} to {module_name}.{class_name}",
        }
    }

    fn check(self, name: &str) -> Result<(), String> {
        match self {
            Flat::Data if is_tensor_name(name) => check_dotted(name, "tensor name"),
            Flat::Data => Err(format!(
                "{name:?} is not a tensor name ({{op key}}.{{input|output|parameters}}.{{slot}})"
            )),
            Flat::Api => check_api_name(name, false),
            Flat::Cell => {
                check_dotted(name, "cell name")?;
                if name.starts_with("Cell.") || name.starts_with("Module.") {
                    Err(format!(
                        "{name:?}: write the cell name without the Cell./Module. prefix ({{cell_name}}.{{class_name}})"
                    ))
                } else if !name.contains('.') || is_tensor_name(name) {
                    Err(format!("{name:?} is not {{cell_name}}.{{class_name}}"))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// A flat `{name: name}` mapping: data, API or cell mapping by its first key.
fn flat_mapping(
    entries: &[(Scalar, Node)],
    path: &Path,
    m: &mut Mapping,
) -> Result<(), MappingError> {
    let bad = |line: usize, msg: String| MappingError::invalid(path, line, msg);
    let Some((first, _)) = entries.first() else {
        return Err(bad(0, EMPTY.into()));
    };
    let kind = Flat::of(&first.text);
    for (k, v) in entries {
        let Node::Scalar(b) = v else {
            return Err(bad(
                v.line(),
                format!(
                    "{:?} maps to {}, but the file's first entry (line {}) makes it {}",
                    k.text,
                    v.what(),
                    first.line,
                    kind.describe()
                ),
            ));
        };
        for s in [k, b] {
            if s.is_null() {
                return Err(bad(s.line, format!("{:?} maps to nothing (null)", k.text)));
            }
            kind.check(&s.text).map_err(|e| {
                bad(
                    s.line,
                    format!(
                        "{e}; the file's first entry (line {}) makes it {}",
                        first.line,
                        kind.describe()
                    ),
                )
            })?;
        }
        let pair = (k.text.clone(), b.text.clone());
        match kind {
            Flat::Data => m.tensor_pairs.push(pair),
            Flat::Api => m.api_renames.push(pair),
            Flat::Cell => m.module_renames.push(pair),
        }
    }
    Ok(())
}

/// Whether `name` is a tensor name of a dump: an op key followed by a slot
/// (`Functional.conv2d.1.backward.input.0`, `Module.fc.Linear.forward.0.output.0`,
/// `Cell.relu.ReLU.parameters_grad.weight`).
fn is_tensor_name(name: &str) -> bool {
    let segs: Vec<&str> = name.split('.').collect();
    for i in 2..segs.len() {
        match segs[i] {
            "parameters_grad" => return i + 1 < segs.len(),
            "forward" | "backward" => {
                let mut j = i + 1;
                if segs
                    .get(j)
                    .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                {
                    j += 1;
                }
                return matches!(segs.get(j), Some(&("input" | "output" | "parameters")))
                    && j + 1 < segs.len();
            }
            _ => {}
        }
    }
    false
}
