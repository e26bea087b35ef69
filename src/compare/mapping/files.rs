//! Mapping files read into a table: the extension says which reader (probe's TOML,
//! msprobe's YAML), the file is read with a size cap, and `--mapping A --mapping B` makes
//! one table over the built-in one. Apart from the table (`super`), which the readers build.

use super::{msprobe_yaml, probe_toml, Mapping, MappingError, MAX_MAPPING_BYTES};
use std::io::Read;
use std::path::{Path, PathBuf};

impl Mapping {
    /// Reads one mapping file: probe's TOML (`.toml`) or one of msprobe's YAML mapping files
    /// (`.yaml`, `.yml`; which one is told by its content, see docs/compare.md). The
    /// extension is checked before anything is read.
    pub(crate) fn load(path: &Path) -> Result<Mapping, MappingError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let parse: fn(&str, &Path) -> Result<Mapping, MappingError> = match ext.as_deref() {
            Some("toml") => Mapping::from_toml,
            Some("yaml" | "yml") => Mapping::from_yaml,
            _ => {
                return Err(MappingError::UnknownKind {
                    path: path.to_path_buf(),
                })
            }
        };
        parse(&read_text(path)?, path)
    }

    /// The table for `probe compare --mapping A --mapping B`: A's entries, then B's, then
    /// the built-in table's, so a file given earlier takes precedence.
    pub(crate) fn with_files(paths: &[PathBuf]) -> Result<Mapping, MappingError> {
        let mut all = Mapping::default();
        for p in paths {
            all = all.merge(Mapping::load(p)?);
        }
        Ok(all.merge(Mapping::builtin()))
    }

    /// probe's TOML mapping format from text (`path` names it in errors and in the rules'
    /// `source`). The entry point of the TOML reader, for tests and fuzzing.
    pub fn from_toml(text: &str, path: &Path) -> Result<Mapping, MappingError> {
        probe_toml::parse(text, path)
    }

    /// One of msprobe's YAML mapping files from text: API mapping (`-am`), data mapping
    /// (`-dm`), cell mapping (`-cm`) or layer mapping (`-lm`), told apart by content.
    pub fn from_yaml(text: &str, path: &Path) -> Result<Mapping, MappingError> {
        msprobe_yaml::parse(text, path)
    }
}

/// Reads a mapping file of at most [`MAX_MAPPING_BYTES`] as text.
fn read_text(path: &Path) -> Result<String, MappingError> {
    let io = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::NotFound => MappingError::NotFound(path.to_path_buf()),
        _ => MappingError::Io {
            path: path.to_path_buf(),
            source,
        },
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    f.take(MAX_MAPPING_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_MAPPING_BYTES {
        return Err(MappingError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_MAPPING_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|_| MappingError::NotText {
        path: path.to_path_buf(),
    })
}
