//! Reading a pack zip safely: in memory, never extracted to disk.
//!
//! A pack comes from another machine, so it is treated as hostile: path traversal,
//! absolute paths, symlinks, encrypted entries, duplicate names, too many entries and zip
//! bombs (declared sizes and ratios checked up front, and the decompressed bytes capped
//! while reading in case the headers lie) are each refused with a one-line error naming the
//! pack and the entry.

use crate::error::{ProbeError, Result};
use std::collections::BTreeMap;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

/// Bounds on what a pack may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Size of the zip file itself.
    pub max_file_bytes: u64,
    /// Entries in the archive (directories included).
    pub max_entries: usize,
    /// Uncompressed size of one entry.
    pub max_entry_bytes: u64,
    /// Uncompressed size of all entries together.
    pub max_total_bytes: u64,
    /// Uncompressed / compressed size of an entry, checked for entries above 1 MiB.
    pub max_ratio: u64,
    /// JSON values (variables, packages, hyperparameters, records: every string, number,
    /// list and object) in all of the pack's JSON entries together: what config-check holds
    /// and reports grows with them (about 2 KB an item with every report written).
    pub max_items: u64,
}

/// The default [`Limits::max_items`]: a real pack holds a few thousand (an environment of
/// hundreds of variables, a Python's hundreds of packages).
pub const MAX_ITEMS: u64 = 250_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 256 << 20,
            max_entries: 10_000,
            max_entry_bytes: 256 << 20,
            max_total_bytes: 1 << 30,
            max_ratio: 100,
            max_items: MAX_ITEMS,
        }
    }
}

/// Entries above this size must respect [`Limits::max_ratio`].
const RATIO_FLOOR: u64 = 1 << 20;

/// The files of a pack, by name, decompressed in memory.
#[derive(Debug)]
pub struct Archive {
    /// The pack file, for error messages.
    pub path: PathBuf,
    /// Entry name (without a trailing `/`) → decompressed bytes; directories left out.
    pub entries: BTreeMap<String, Vec<u8>>,
    /// JSON values its entries may still hold ([`Limits::max_items`]), counted before any
    /// entry is parsed into memory.
    items_left: std::cell::Cell<u64>,
    max_items: u64,
}

impl Archive {
    /// The bytes of entry `name`, if the pack has it.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.entries.get(name).map(|v| v.as_slice())
    }

    /// Parses an entry as JSON; a malformed one is an error naming pack and entry.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        match self.get(name) {
            None => Ok(None),
            Some(bytes) => {
                let text = crate::json::accept_nonfinite(bytes);
                self.count(name, &text)?;
                serde_json::from_slice(&text)
                    .map(Some)
                    .map_err(|e| self.bad(name, format!("malformed JSON: {e}")))
            }
        }
    }

    /// Takes `n` items of entry `name` (lines of a text entry) from what the pack may still
    /// hold: an error past [`Limits::max_items`].
    pub(crate) fn take_items(&self, name: &str, n: usize) -> Result<()> {
        let left = self.items_left.get();
        match left.checked_sub(n as u64) {
            Some(rest) => {
                self.items_left.set(rest);
                Ok(())
            }
            None => {
                self.items_left.set(0);
                Err(self.too_many(name))
            }
        }
    }

    fn too_many(&self, name: &str) -> ProbeError {
        self.bad(
            name,
            format!(
                "more than {} items (variables, packages, hyperparameters, records) in the \
                 pack: config-check takes at most that many (a real pack holds a few thousand)",
                self.max_items
            ),
        )
    }

    /// Counts the JSON values of entry `name` against what the pack may still hold, without
    /// building them: a pack of millions of variables is refused before it takes memory.
    fn count(&self, name: &str, text: &[u8]) -> Result<()> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(text);
        match (Count(&self.items_left)).deserialize(&mut de) {
            Ok(()) => Ok(()),
            Err(_) if self.items_left.get() == 0 => Err(self.too_many(name)),
            Err(e) => Err(self.bad(name, format!("malformed JSON: {e}"))),
        }
    }

    /// A [`ProbeError::BadPack`] naming this pack and `entry`.
    pub(crate) fn bad(&self, entry: &str, msg: impl Into<String>) -> ProbeError {
        ProbeError::BadPack {
            path: self.path.clone(),
            entry: entry.to_string(),
            msg: msg.into(),
        }
    }
}

fn hostile(path: &Path, msg: String) -> ProbeError {
    ProbeError::HostileZip {
        path: path.to_path_buf(),
        msg,
    }
}

/// Why a name is unsafe, if it is.
fn unsafe_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("empty entry name");
    }
    if name.contains('\0') {
        return Some("NUL byte in entry name");
    }
    if name.starts_with('/') || name.starts_with('\\') {
        return Some("absolute path");
    }
    let b = name.as_bytes();
    if b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic() {
        return Some("absolute path (drive letter)");
    }
    if name.split(['/', '\\']).any(|c| c == "..") {
        return Some("path traversal (..)");
    }
    None
}

/// Total entries as the end-of-central-directory record declares them (0xFFFF means
/// zip64, which no legitimate pack needs).
fn declared_entries(bytes: &[u8]) -> Option<u64> {
    let start = bytes.len().saturating_sub(22 + 65_535);
    let tail = &bytes[start..];
    let pos = tail.windows(4).rposition(|w| w == b"PK\x05\x06")?;
    let rec = tail.get(pos..pos + 22)?;
    Some(u16::from_le_bytes([rec[10], rec[11]]) as u64)
}

/// Every entry name in the central directory, in order, read from the bytes themselves:
/// the zip crate keeps one entry per name, so a second `env.json` would silently replace the
/// first. None when the directory cannot be walked (the zip reader then says why).
fn central_names(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let start = bytes.len().saturating_sub(22 + 65_535);
    let tail = &bytes[start..];
    let eocd = start + tail.windows(4).rposition(|w| w == b"PK\x05\x06")?;
    let rec = bytes.get(eocd..eocd + 22)?;
    let u16_at = |b: &[u8], i: usize| Some(u16::from_le_bytes([*b.get(i)?, *b.get(i + 1)?]));
    let u32_at = |b: &[u8], i: usize| {
        Some(u32::from_le_bytes([
            *b.get(i)?,
            *b.get(i + 1)?,
            *b.get(i + 2)?,
            *b.get(i + 3)?,
        ]))
    };
    let count = u16_at(rec, 10)? as usize;
    let mut at = u32_at(rec, 16)? as usize;
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let hdr = bytes.get(at..at + 46)?;
        if &hdr[..4] != b"PK\x01\x02" {
            return None;
        }
        let (n, extra, comment) = (
            u16_at(hdr, 28)? as usize,
            u16_at(hdr, 30)? as usize,
            u16_at(hdr, 32)? as usize,
        );
        names.push(bytes.get(at + 46..at + 46 + n)?.to_vec());
        at += 46 + n + extra + comment;
    }
    Some(names)
}

/// Reads `path` with the default [`Limits`].
pub fn read(path: &Path) -> Result<Archive> {
    read_with(path, &Limits::default())
}

/// Reads `path` into memory, refusing anything unsafe.
pub(crate) fn read_with(path: &Path, limits: &Limits) -> Result<Archive> {
    let meta = std::fs::metadata(path).map_err(|e| ProbeError::io(path, e))?;
    if meta.is_dir() {
        return Err(ProbeError::BadPack {
            path: path.to_path_buf(),
            entry: "-".into(),
            msg: "is a directory, expected a config pack zip".into(),
        });
    }
    if meta.len() > limits.max_file_bytes {
        return Err(hostile(
            path,
            format!(
                "file is {} bytes, more than the {} allowed for a pack",
                meta.len(),
                limits.max_file_bytes
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(limits.max_file_bytes + 1).read_to_end(&mut bytes))
        .map_err(|e| ProbeError::io(path, e))?;
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(hostile(path, "file grew past the size limit".into()));
    }
    from_bytes(path, bytes, limits)
}

/// Reads a pack zip already in memory (`path` only names it in errors), refusing anything
/// unsafe. `read_with` reads the file and calls this; public for tools and fuzzing.
pub fn from_bytes(path: &Path, bytes: Vec<u8>, limits: &Limits) -> Result<Archive> {
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(hostile(
            path,
            format!(
                "file is {} bytes, more than the {} allowed for a pack",
                bytes.len(),
                limits.max_file_bytes
            ),
        ));
    }
    if let Some(n) = declared_entries(&bytes) {
        if n > limits.max_entries as u64 {
            return Err(hostile(
                path,
                format!(
                    "declares {n} entries, more than the {} allowed",
                    limits.max_entries
                ),
            ));
        }
    }
    if let Some(names) = central_names(&bytes) {
        let mut seen = std::collections::HashSet::new();
        for n in &names {
            let name = String::from_utf8_lossy(n);
            if !seen.insert(name.trim_end_matches('/').to_string()) {
                return Err(hostile(path, format!("entry {name:?}: duplicate name")));
            }
        }
    }
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| ProbeError::BadPack {
        path: path.to_path_buf(),
        entry: "-".into(),
        msg: format!("not a zip archive: {e}"),
    })?;
    if zip.len() > limits.max_entries {
        return Err(hostile(
            path,
            format!(
                "{} entries, more than the {} allowed",
                zip.len(),
                limits.max_entries
            ),
        ));
    }
    // First pass: names and declared sizes, before decompressing anything.
    let mut declared_total: u64 = 0;
    for i in 0..zip.len() {
        let f = zip
            .by_index_raw(i)
            .map_err(|e| hostile(path, format!("entry #{i}: unreadable header: {e}")))?;
        let name = String::from_utf8_lossy(f.name_raw()).into_owned();
        if let Some(why) = unsafe_name(&name) {
            return Err(hostile(path, format!("entry {name:?}: {why}")));
        }
        if f.is_symlink() {
            return Err(hostile(path, format!("entry {name:?}: symbolic link")));
        }
        if f.encrypted() {
            return Err(hostile(path, format!("entry {name:?}: encrypted")));
        }
        let (size, csize) = (f.size(), f.compressed_size());
        if size > limits.max_entry_bytes {
            return Err(hostile(
                path,
                format!(
                    "entry {name:?}: declares {size} bytes uncompressed, more than the {} allowed",
                    limits.max_entry_bytes
                ),
            ));
        }
        if size > RATIO_FLOOR && size / csize.max(1) > limits.max_ratio {
            return Err(hostile(
                path,
                format!(
                    "entry {name:?}: compression ratio {}:1 exceeds {}:1 (zip bomb?)",
                    size / csize.max(1),
                    limits.max_ratio
                ),
            ));
        }
        declared_total = declared_total.saturating_add(size);
        if declared_total > limits.max_total_bytes {
            return Err(hostile(
                path,
                format!(
                    "entries declare more than {} bytes uncompressed in total (zip bomb?)",
                    limits.max_total_bytes
                ),
            ));
        }
    }
    // Second pass: decompress, never more than each entry declared.
    let mut entries = BTreeMap::new();
    let mut total: u64 = 0;
    for i in 0..zip.len() {
        let f = zip
            .by_index(i)
            .map_err(|e| hostile(path, format!("entry #{i}: {e}")))?;
        let name = String::from_utf8_lossy(f.name_raw()).into_owned();
        if f.is_dir() {
            continue;
        }
        let declared = f.size();
        let mut buf = Vec::with_capacity(declared.min(1 << 20) as usize);
        f.take(declared + 1)
            .read_to_end(&mut buf)
            .map_err(|e| hostile(path, format!("entry {name:?}: cannot decompress: {e}")))?;
        if buf.len() as u64 > declared {
            return Err(hostile(
                path,
                format!(
                    "entry {name:?}: decompresses to more than the {declared} bytes its header declares (zip bomb?)"
                ),
            ));
        }
        total += buf.len() as u64;
        if total > limits.max_total_bytes {
            return Err(hostile(path, "uncompressed total over the limit".into()));
        }
        let key = name.trim_end_matches('/').to_string();
        if entries.insert(key, buf).is_some() {
            return Err(hostile(path, format!("entry {name:?}: duplicate name")));
        }
    }
    Ok(Archive {
        path: path.to_path_buf(),
        entries,
        items_left: std::cell::Cell::new(limits.max_items),
        max_items: limits.max_items,
    })
}

/// A pass over a JSON document that counts its values against a budget and builds nothing
/// (keys and strings borrowed or skipped): an error once the budget is spent.
struct Count<'a>(&'a std::cell::Cell<u64>);

impl Count<'_> {
    fn take<E: serde::de::Error>(&self) -> std::result::Result<(), E> {
        match self.0.get() {
            0 => Err(E::custom("too many items")),
            n => {
                self.0.set(n - 1);
                Ok(())
            }
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<(), E> {
        self.take()
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(Count(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        self.take()?;
        while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            map.next_value_seed(Count(self.0))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(unsafe_name("env.json").is_none());
        assert!(unsafe_name("dataset/step0/rank0/dataset.json").is_none());
        assert!(unsafe_name("../x").is_some());
        assert!(unsafe_name("a/../../x").is_some());
        assert!(unsafe_name("/etc/passwd").is_some());
        assert!(unsafe_name("C:\\x").is_some());
        assert!(unsafe_name("a\\..\\x").is_some());
    }
}
