//! PyTorch Distributed Checkpoint (DCP) folders: `.metadata` (a pickle of
//! `torch.distributed.checkpoint.metadata.Metadata`, read with the restricted pickle
//! machine, never executed) and `__<rank>_<n>.distcp` files.
//!
//! The metadata gives each parameter's logical shape and dtype and its chunks (offsets
//! and sizes in every dimension); `storage_data` says where each chunk's bytes lie
//! (file, offset, length). The default `FileSystemWriter` writes each chunk as a
//! `torch.save` of the chunk tensor over that byte range: a small zip, read here with the
//! `.pt` reader over the range alone. Each chunk becomes stored tensors and pieces of a
//! [`Logical`] parameter, so a parameter is read a block of rows at a time, like any
//! other ([`super::measure`]); no tensor byte is read when the checkpoint is opened.
//!
//! A chunk cut only on dimensions 0 and 1 is one piece; a chunk cut on a later
//! dimension is one piece per contiguous run of the logical matrix (at most
//! [`MAX_RUNS`] a parameter). Not supported: stream transforms (`transform_descriptors`,
//! e.g. compression), chunks that are not `torch.save` zips (the safetensors
//! serialization format), non-tensor entries (`BytesStorageMetadata`: counted as
//! non-parameters).

use super::layout::{Logical, Piece};
use super::source::{Checkpoint, Layout, Stored};
use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use crate::tensor::pickle::{parse_tree, Node};
use crate::tensor::pt;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Most pieces one parameter may be cut into (chunks cut on dimensions past 1).
pub const MAX_RUNS: usize = 1 << 20;
/// Largest `.metadata` read.
const MAX_METADATA: u64 = 1 << 30;

fn bad(path: &Path, msg: impl Into<String>) -> ProbeError {
    ProbeError::BadCheckpoint {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Whether `dir` is a DCP folder: it holds a `.metadata` file (the `.distcp` files it
/// names must then exist: a missing one is an error naming it, not another layout).
pub fn is_dcp(dir: &Path) -> bool {
    dir.join(".metadata").is_file()
}

/// One chunk of a parameter, as the metadata describes it.
struct Chunk {
    offsets: Vec<usize>,
    sizes: Vec<usize>,
}

/// One parameter of the metadata.
struct Param {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    chunks: Vec<Chunk>,
}

/// Where a chunk's bytes lie.
struct StorageInfo {
    file: String,
    offset: u64,
    length: u64,
}

/// Reads a DCP folder's metadata and locates every chunk; the parameters go to
/// `ck.logical`.
pub fn read(ck: &mut Checkpoint, dir: &Path) -> Result<()> {
    ck.layout = Layout::Dcp;
    let mpath = dir.join(".metadata");
    let bytes = read_limited(&mpath)?;
    let tree = parse_tree(&bytes).map_err(|m| bad(&mpath, m))?;
    drop(bytes);
    let sdm = tree
        .get("state_dict_metadata")
        .ok_or_else(|| bad(&mpath, "no state_dict_metadata: not a DCP Metadata pickle"))?;
    let storage = storage_data(&tree, &mpath)?;
    let Node::Dict(entries) = sdm else {
        return Err(bad(&mpath, "state_dict_metadata is not a dict"));
    };
    let mut files: HashMap<String, usize> = HashMap::new();
    for (k, v) in entries {
        let Node::Str(name) = k else {
            return Err(bad(
                &mpath,
                "state_dict_metadata: a key that is not a string",
            ));
        };
        let Some(p) = param(name, v, &mpath)? else {
            ck.non_parameters += 1;
            continue;
        };
        let mut pieces = Vec::new();
        for c in &p.chunks {
            let info = storage
                .get(&(p.name.clone(), c.offsets.clone()))
                .ok_or_else(|| {
                    bad(
                        &mpath,
                        format!(
                            "{}: chunk at {:?} has no storage_data entry",
                            p.name, c.offsets
                        ),
                    )
                })?;
            let fi = open_file(ck, dir, &mut files, &info.file)?;
            let data = locate_chunk(ck, fi, info, &p, c)?;
            add_pieces(ck, fi, data, &p, c, &mut pieces)?;
        }
        let l = logical(p, pieces);
        super::layout::check_tiling(ck, &l)?;
        ck.logical.push(l);
    }
    Ok(())
}

fn read_limited(path: &Path) -> Result<Vec<u8>> {
    let f = File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let mut bytes = Vec::new();
    f.take(MAX_METADATA + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ProbeError::io(path, e))?;
    if bytes.len() as u64 > MAX_METADATA {
        return Err(bad(path, "larger than 1 GiB: not read"));
    }
    Ok(bytes)
}

/// A list of ints: a `torch.Size` (its constructor's argument) or a tuple/list.
fn ints(n: &Node) -> Option<Vec<usize>> {
    match n {
        Node::Object { class, args, .. } if class == "torch.Size" => match &**args {
            Node::List(a) if a.len() == 1 => ints(&a[0]),
            _ => None,
        },
        Node::List(items) => items
            .iter()
            .map(|x| match x {
                Node::Int(i) => usize::try_from(*i).ok(),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn class_of(n: &Node) -> &str {
    match n {
        Node::Object { class, .. } => class,
        _ => "",
    }
}

/// A `TensorStorageMetadata` entry as a parameter; None for any other entry (bytes).
fn param(name: &str, v: &Node, mpath: &Path) -> Result<Option<Param>> {
    if !class_of(v).ends_with("TensorStorageMetadata") {
        return Ok(None);
    }
    let err = |m: &str| bad(mpath, format!("{name}: {m}"));
    let shape = v.get("size").and_then(ints).ok_or_else(|| err("no size"))?;
    let dtype = match v.get("properties") {
        Some(Node::Object { state, .. }) => match &**state {
            Node::List(items) => items.first(),
            s => s.get("dtype"),
        },
        _ => None,
    };
    let dtype = match dtype {
        Some(Node::Global(g)) => DType::parse(g.strip_prefix("torch.").unwrap_or(g))
            .ok_or_else(|| err(&format!("dtype {g} not supported")))?,
        _ => return Err(err("no dtype in properties")),
    };
    let Some(Node::List(cs)) = v.get("chunks") else {
        return Err(err("no chunks"));
    };
    let mut chunks = Vec::new();
    for c in cs {
        let offsets = c.get("offsets").and_then(ints);
        let sizes = c.get("sizes").and_then(ints);
        let (Some(offsets), Some(sizes)) = (offsets, sizes) else {
            return Err(err("a chunk without offsets and sizes"));
        };
        let fits = offsets.len() == shape.len()
            && sizes.len() == shape.len()
            && (0..shape.len()).all(|d| {
                offsets[d]
                    .checked_add(sizes[d])
                    .is_some_and(|e| e <= shape[d])
            });
        if !fits {
            return Err(err(&format!(
                "chunk at {offsets:?} of size {sizes:?} does not fit the shape {shape:?}"
            )));
        }
        chunks.push(Chunk { offsets, sizes });
    }
    Ok(Some(Param {
        name: name.to_string(),
        dtype,
        shape,
        chunks,
    }))
}

/// `storage_data`: (fqn, chunk offsets) → where its bytes lie.
fn storage_data(tree: &Node, mpath: &Path) -> Result<HashMap<(String, Vec<usize>), StorageInfo>> {
    let Some(Node::Dict(items)) = tree.get("storage_data") else {
        return Err(bad(mpath, "no storage_data dict"));
    };
    let mut out = HashMap::new();
    for (k, v) in items {
        let fqn = match k.get("fqn") {
            Some(Node::Str(s)) => s.clone(),
            _ => return Err(bad(mpath, "storage_data: a key without fqn")),
        };
        let offset = k.get("offset").and_then(ints).unwrap_or_default();
        if let Some(Node::List(t)) = v.get("transform_descriptors") {
            if !t.is_empty() {
                return Err(bad(
                    mpath,
                    format!("{fqn}: written with stream transforms (compression?): not supported"),
                ));
            }
        }
        let int = |key: &str| match v.get(key) {
            Some(Node::Int(i)) => u64::try_from(*i).ok(),
            _ => None,
        };
        let (Some(Node::Str(file)), Some(off), Some(len)) =
            (v.get("relative_path"), int("offset"), int("length"))
        else {
            return Err(bad(mpath, format!("{fqn}: storage_data entry incomplete")));
        };
        let info = StorageInfo {
            file: file.clone(),
            offset: off,
            length: len,
        };
        out.insert((fqn, offset), info);
    }
    Ok(out)
}

/// The index in `ck.files` of a `.distcp` file, opened once.
fn open_file(
    ck: &mut Checkpoint,
    dir: &Path,
    files: &mut HashMap<String, usize>,
    name: &str,
) -> Result<usize> {
    if let Some(&i) = files.get(name) {
        return Ok(i);
    }
    let plain = Path::new(name)
        .file_name()
        .is_some_and(|f| f == std::ffi::OsStr::new(name));
    if !plain || name == ".." {
        return Err(bad(dir, format!("storage file {name:?}: not a file name")));
    }
    let path: PathBuf = dir.join(name);
    let file = File::open(&path).map_err(|e| {
        bad(
            dir,
            format!("storage file {name} named in .metadata cannot be opened: {e}"),
        )
    })?;
    ck.files.push((path, file));
    files.insert(name.to_string(), ck.files.len() - 1);
    Ok(ck.files.len() - 1)
}

/// A byte range of a file as a seekable reader.
struct Window<'a> {
    file: &'a File,
    start: u64,
    len: u64,
    pos: u64,
}

impl Read for Window<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.start + self.pos)?;
        self.pos += got as u64;
        Ok(got)
    }
}

impl Seek for Window<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let p = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = p.ok_or_else(|| std::io::Error::other("seek before the start"))?;
        Ok(self.pos)
    }
}

/// Absolute offset of a chunk's first element, its `torch.save` zip read over the
/// chunk's byte range and checked against the metadata.
fn locate_chunk(
    ck: &Checkpoint,
    fi: usize,
    info: &StorageInfo,
    p: &Param,
    c: &Chunk,
) -> Result<u64> {
    let (path, file) = &ck.files[fi];
    let err = |m: String| bad(path, format!("{} chunk at {:?}: {m}", p.name, c.offsets));
    let flen = file.metadata().map_err(|e| ProbeError::io(path, e))?.len();
    if info
        .offset
        .checked_add(info.length)
        .is_none_or(|e| e > flen)
    {
        return Err(err(format!(
            "bytes {}..{} lie past the end of the file ({flen} bytes)",
            info.offset,
            info.offset.saturating_add(info.length)
        )));
    }
    let mut magic = [0u8; 4];
    let head = file.read_exact_at(&mut magic, info.offset);
    if head.is_err() || info.length < 4 || &magic != b"PK\x03\x04" {
        return Err(err(
            "not a torch.save zip (a DCP in the safetensors format, or corrupt): not supported"
                .into(),
        ));
    }
    let w = Window {
        file,
        start: info.offset,
        len: info.length,
        pos: 0,
    };
    let archive = pt::read_archive(std::io::BufReader::new(w), info.length, path)?;
    let Node::Tensor(t) = &archive.tree else {
        return Err(err("the chunk's torch.save holds no tensor".into()));
    };
    let located = archive.locate(t, path)?;
    let numel: usize = c.sizes.iter().product();
    if located.dtype != p.dtype || located.numel != numel {
        return Err(err(format!(
            "holds {:?} {} where the metadata says {:?} {}",
            located.shape,
            located.dtype.name(),
            c.sizes,
            p.dtype.name()
        )));
    }
    Ok(info.offset + located.offset)
}

/// Product of the logical dimensions after `d`.
fn stride(shape: &[usize], d: usize) -> usize {
    shape[d + 1..].iter().product()
}

/// Adds the stored tensors and pieces of one chunk whose first element is at `at`.
fn add_pieces(
    ck: &mut Checkpoint,
    fi: usize,
    at: u64,
    p: &Param,
    c: &Chunk,
    pieces: &mut Vec<Piece>,
) -> Result<()> {
    let nd = p.shape.len();
    let es = p.dtype.size();
    let label = format!("{} chunk {:?}", p.name, c.offsets);
    let cut = (0..nd).rev().find(|&d| c.sizes[d] != p.shape[d]);
    let done = pieces.len();
    let mut push = |ck: &mut Checkpoint, off: u64, shape: Vec<usize>, row: usize, col: usize| {
        let rows = shape.first().copied().unwrap_or(1);
        pieces.push(Piece {
            src: ck.tensors.len(),
            src_row: 0,
            rows,
            row,
            col,
        });
        ck.tensors.push(Stored {
            name: label.clone(),
            file: fi,
            offset: off,
            dtype: p.dtype,
            shape,
            rank: None,
        });
    };
    match cut {
        None | Some(0) | Some(1) => {
            let shape = if nd >= 2 {
                vec![c.sizes[0], c.sizes[1..].iter().product()]
            } else {
                c.sizes.clone()
            };
            let col = if nd >= 2 {
                c.offsets[1] * stride(&p.shape, 1)
            } else {
                0
            };
            let row = c.offsets.first().copied().unwrap_or(0);
            push(ck, at, shape, row, col);
        }
        Some(k) => {
            let width: usize = c.sizes[k..].iter().product();
            let runs: usize = c.sizes[..k].iter().product();
            if done + runs > MAX_RUNS {
                return Err(bad(
                    &ck.root,
                    format!(
                        "{}: chunks cut into more than {MAX_RUNS} runs: not supported",
                        p.name
                    ),
                ));
            }
            let mut idx = vec![0usize; k];
            for r in 0..runs {
                let col = (1..k)
                    .map(|d| (c.offsets[d] + idx[d]) * stride(&p.shape, d))
                    .sum::<usize>()
                    + c.offsets[k] * stride(&p.shape, k);
                let off = at + (r * width * es) as u64;
                push(ck, off, vec![1, width], c.offsets[0] + idx[0], col);
                for d in (0..k).rev() {
                    idx[d] += 1;
                    if idx[d] < c.sizes[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
    }
    Ok(())
}

fn logical(p: Param, pieces: Vec<Piece>) -> Logical {
    let rows = p.shape.first().copied().unwrap_or(1);
    let cols = p
        .shape
        .iter()
        .product::<usize>()
        .checked_div(rows)
        .unwrap_or(0);
    Logical {
        name: p.name,
        shape: p.shape,
        rows,
        cols,
        dtype: p.dtype,
        pieces,
        replicas: Vec::new(),
        note: None,
    }
}
