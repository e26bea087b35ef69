//! One side's checkpoint as stored: its files and every tensor in them (name, dtype,
//! shape, where its bytes lie), found without reading a tensor byte.
//!
//! Kinds: safetensors (one file, several, or sharded with `*.safetensors.index.json`),
//! `torch.save` files (`.pt`, `.bin`, `.pth`; a state dict, or a `model`/`state_dict`/
//! `module` entry holding one, read with the restricted pickle machine) and a Megatron-style
//! folder of tensor/pipeline-parallel ranks ([`super::megatron`]) and a PyTorch Distributed
//! Checkpoint folder ([`super::dcp`]).

use super::megatron;
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use crate::tensor::pickle::Node;
use crate::tensor::{pt, ShardIndex};
use memmap2::MmapOptions;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where one stored tensor came from among a sharded checkpoint's ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Rank {
    /// Tensor-parallel rank.
    pub tp: usize,
    /// Pipeline-parallel rank.
    pub pp: usize,
}

/// A tensor as stored in one file.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its name in the file (a state dict's nested keys joined with dots).
    pub name: String,
    /// Index of its file in [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte offset of its first element.
    pub offset: u64,
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Its rank, in a Megatron-style checkpoint.
    pub rank: Option<Rank>,
}

impl Stored {
    /// Elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The tensor seen as a matrix: (dimension 0, the product of the others); a scalar is
    /// one row.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.shape.first() {
            None => (1, 1),
            Some(&0) => (0, 0),
            Some(&r) => (r, self.numel() / r),
        }
    }
}

/// How a checkpoint is laid out.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Layout {
    /// safetensors file(s): names as written (HF layout for HF checkpoints).
    Safetensors,
    /// `torch.save` state dict(s).
    Torch,
    /// Megatron-style ranks: `mp_rank_TT` or `mp_rank_TT_PPP` folders.
    Megatron {
        /// Tensor-parallel size.
        tp: usize,
        /// Pipeline-parallel size.
        pp: usize,
    },
    /// A PyTorch Distributed Checkpoint folder ([`super::dcp`]).
    Dcp,
}

/// One side's checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// What the user named.
    pub root: PathBuf,
    /// Its layout.
    pub layout: Layout,
    /// Every file read, opened.
    pub files: Vec<(PathBuf, File)>,
    /// Every tensor, in file order (then the file's own order).
    pub tensors: Vec<Stored>,
    /// Integer settings the checkpoint records about its model: an HF `config.json`
    /// beside it, Megatron's `args`. Key → value.
    pub settings: BTreeMap<String, i64>,
    /// Entries that are not parameters, left out by name (`_extra_state`, ...): counted.
    pub non_parameters: usize,
    /// The logical parameters of a layout that records them itself (DCP's metadata);
    /// empty for the others.
    pub logical: Vec<super::layout::Logical>,
}

impl Checkpoint {
    /// The file a tensor lies in.
    pub fn path_of(&self, t: &Stored) -> &Path {
        &self.files[t.file].0
    }
}

fn bad(path: &Path, msg: impl Into<String>) -> ProbeError {
    ProbeError::BadCheckpoint {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Reads the layout and tensor list of the checkpoint at `path` (a file or a folder).
pub fn open(path: &Path) -> Result<Checkpoint> {
    let meta = std::fs::metadata(path).map_err(|e| ProbeError::io(path, e))?;
    let mut ck = Checkpoint {
        root: path.to_path_buf(),
        layout: Layout::Safetensors,
        files: Vec::new(),
        tensors: Vec::new(),
        settings: BTreeMap::new(),
        non_parameters: 0,
        logical: Vec::new(),
    };
    if meta.is_dir() {
        if super::dcp::is_dcp(path) {
            super::dcp::read(&mut ck, path)?;
            return Ok(ck);
        }
        if let Some(ranks) = megatron::find_ranks(path)? {
            megatron::read(&mut ck, &ranks)?;
            return Ok(ck);
        }
        read_config_json(&mut ck, &path.join("config.json"))?;
        let files = folder_files(path)?;
        read_files(&mut ck, &files)?;
        return Ok(ck);
    }
    if let Some(dir) = path.parent() {
        read_config_json(&mut ck, &dir.join("config.json"))?;
    }
    let name = path.to_string_lossy();
    if name.ends_with(".index.json") {
        let files = index_files(path)?;
        read_files(&mut ck, &files)?;
        return Ok(ck);
    }
    read_files(&mut ck, &[path.to_path_buf()])?;
    Ok(ck)
}

/// The checkpoint files of a folder: an index json's shards, else every safetensors file,
/// else the one `torch.save` file.
fn folder_files(dir: &Path) -> Result<Vec<PathBuf>> {
    for index in [
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    ] {
        if dir.join(index).is_file() {
            return index_files(&dir.join(index));
        }
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ProbeError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    let ext = |p: &Path, e: &[&str]| {
        p.extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| e.contains(&x))
    };
    let st: Vec<PathBuf> = names
        .iter()
        .filter(|p| ext(p, &["safetensors"]))
        .cloned()
        .collect();
    if !st.is_empty() {
        return Ok(st);
    }
    let pt: Vec<PathBuf> = names
        .into_iter()
        .filter(|p| ext(p, &["pt", "bin", "pth"]))
        .collect();
    match pt.len() {
        0 => Err(bad(
            dir,
            "no checkpoint found: no safetensors file, no .pt/.bin file, no mp_rank_* folders",
        )),
        1 => Ok(pt),
        n => Err(bad(
            dir,
            format!("{n} .pt/.bin files and no index json: name the file to compare"),
        )),
    }
}

/// The shard files an HF index json names (`weight_map`: tensor → file), each once, in
/// order of first mention; every one must exist.
fn index_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = crate::config_file::read(index)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(index, format!("not an index json: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(index, "no weight_map object"))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    let mut names: Vec<&str> = map.values().filter_map(|f| f.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for f in names {
        if f.contains('/') || f.contains('\\') || f == ".." {
            return Err(bad(
                index,
                format!("weight_map names {f:?}: not a file name"),
            ));
        }
        let p = dir.join(f);
        if !p.is_file() {
            return Err(bad(
                index,
                format!("shard {f} named in weight_map is missing"),
            ));
        }
        files.push(p);
    }
    if files.is_empty() {
        return Err(bad(index, "weight_map names no file"));
    }
    Ok(files)
}

/// Integer settings of an HF `config.json` (when there is one).
fn read_config_json(ck: &mut Checkpoint, path: &Path) -> Result<()> {
    if !path.is_file() {
        return Ok(());
    }
    let text = crate::config_file::read(path)?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(path, format!("not JSON: {e}")))?;
    if let Some(o) = v.as_object() {
        for (k, x) in o {
            if let Some(i) = x.as_i64() {
                ck.settings.insert(format!("hf.{k}"), i);
            }
        }
    }
    Ok(())
}

fn read_files(ck: &mut Checkpoint, files: &[PathBuf]) -> Result<()> {
    for f in files {
        let is_st = f.extension().is_some_and(|e| e == "safetensors");
        if is_st {
            read_safetensors(ck, f, None)?;
        } else {
            ck.layout = Layout::Torch;
            let archive = open_torch(ck, f)?;
            let sd = state_dict(&archive).ok_or_else(|| bad(f, "holds no state dict"))?;
            flatten(ck, f, &archive, sd, None)?;
        }
    }
    let mut seen = std::collections::HashSet::new();
    for t in &ck.tensors {
        if !seen.insert((t.name.as_str(), t.rank)) {
            return Err(bad(&ck.root, format!("tensor {} is stored twice", t.name)));
        }
    }
    Ok(())
}

/// Adds a safetensors file's tensors (header validated by the `safetensors` crate over
/// a memory map of the file; only the header's pages are read).
pub(crate) fn read_safetensors(ck: &mut Checkpoint, path: &Path, rank: Option<Rank>) -> Result<()> {
    let file = File::open(path).map_err(|e| ProbeError::io(path, e))?;
    // SAFETY: read-only map, used only while the header is parsed; a checkpoint is not
    // truncated while probe reads it.
    let map = unsafe { MmapOptions::new().map(&file) }.map_err(|e| ProbeError::io(path, e))?;
    let index = ShardIndex::parse(&map).map_err(|msg| ProbeError::BadShard {
        path: path.to_path_buf(),
        msg,
    })?;
    drop(map);
    let fi = ck.files.len();
    let mut entries = index.entries();
    entries.sort_by_key(|e| e.1);
    for (name, offset, dtype, shape) in entries {
        let dtype =
            dtype.ok_or_else(|| bad(path, format!("tensor {name}: dtype not supported")))?;
        ck.tensors.push(Stored {
            name: name.to_string(),
            file: fi,
            offset,
            dtype,
            shape: shape.to_vec(),
            rank,
        });
    }
    ck.files.push((path.to_path_buf(), file));
    Ok(())
}

/// Opens a `torch.save` file and reads its pickle (restricted); the file joins `ck`.
pub(crate) fn open_torch(ck: &mut Checkpoint, path: &Path) -> Result<pt::Archive> {
    let file = File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let len = file.metadata().map_err(|e| ProbeError::io(path, e))?.len();
    let archive = pt::read_archive(std::io::BufReader::new(&file), len, path)?;
    ck.files.push((path.to_path_buf(), file));
    Ok(archive)
}

/// The state dict of a `torch.save` object: itself when it holds tensors, else its
/// `model`, `state_dict` or `module` entry.
pub(crate) fn state_dict(a: &pt::Archive) -> Option<&Node> {
    let root = &a.tree;
    for key in ["model", "state_dict", "module"] {
        if let Some(n @ Node::Dict(_)) = root.get(key) {
            return Some(n);
        }
    }
    matches!(root, Node::Dict(_)).then_some(root)
}

/// Adds every tensor under `node` (nested dicts' keys joined with dots) of `archive`, the
/// file just opened (the last of `ck`). Entries that are not tensors (numbers, `None`,
/// TransformerEngine's `_extra_state` bytes) are counted as non-parameters.
pub(crate) fn flatten(
    ck: &mut Checkpoint,
    path: &Path,
    archive: &pt::Archive,
    node: &Node,
    rank: Option<Rank>,
) -> Result<()> {
    let fi = ck.files.len() - 1;
    let mut work: Vec<(String, &Node)> = vec![(String::new(), node)];
    let mut out = Vec::new();
    while let Some((prefix, n)) = work.pop() {
        match n {
            Node::Dict(items) => {
                for (k, v) in items.iter().rev() {
                    let key = match k {
                        Node::Str(s) => s.clone(),
                        Node::Int(i) => i.to_string(),
                        _ => {
                            return Err(bad(path, format!("{prefix}: a key that is not a string")))
                        }
                    };
                    let name = if prefix.is_empty() {
                        key
                    } else {
                        format!("{prefix}.{key}")
                    };
                    work.push((name, v));
                }
            }
            Node::Tensor(t) => {
                let located = archive.locate(t, path)?;
                out.push(Stored {
                    name: prefix,
                    file: fi,
                    offset: located.offset,
                    dtype: located.dtype,
                    shape: located.shape,
                    rank,
                });
            }
            _ => ck.non_parameters += 1,
        }
    }
    ck.tensors.extend(out);
    Ok(())
}
