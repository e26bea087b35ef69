//! The mapping file (`--mapping FILE.toml`) and the model shape a Megatron side needs,
//! from the file, an HF `config.json` beside a side, Megatron's `args`, or the other
//! side's embedding: the first source that gives a value wins, and two sources that give
//! different values are an error.
//!
//! ```toml
//! [model]            # what a fused QKV split needs (heads, kv_heads, head_dim) and the
//! heads = 32         # vocabulary without Megatron's padding
//! kv_heads = 8
//! head_dim = 128
//! vocab = 32000
//!
//! [rename]           # after the built-in mapping, on both sides: a name starting with
//! "base_model.model." = ""   # the key gets the value instead (longest key first)
//!
//! ignore = ["*.rotary_emb.inv_freq"]   # glob patterns of names not compared (counted)
//! ```

use super::layout::Dims;
use super::source::Checkpoint;
use crate::error::{ProbeError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The mapping file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MappingFile {
    /// Names not compared (glob patterns).
    #[serde(default)]
    pub ignore: Vec<String>,
    /// The model's shape.
    #[serde(default)]
    pub model: ModelSection,
    /// Prefix renames.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
}

/// `[model]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Attention heads.
    pub heads: Option<usize>,
    /// Key/value heads.
    pub kv_heads: Option<usize>,
    /// Size of a head.
    pub head_dim: Option<usize>,
    /// Unpadded vocabulary size.
    pub vocab: Option<usize>,
}

/// The mapping: renames, ignore patterns, the file's model section.
#[derive(Debug, Default)]
pub struct Mapping {
    renames: Vec<(String, String)>,
    ignore: Vec<glob::Pattern>,
    /// The file's `[model]`.
    pub model: ModelSection,
}

impl Mapping {
    /// Reads a mapping file.
    pub fn from_file(path: &Path) -> Result<Mapping> {
        let text = crate::config_file::read(path)?;
        let bad = |msg: String| ProbeError::BadConfig {
            path: path.to_path_buf(),
            msg,
        };
        let f: MappingFile = toml::from_str(&text).map_err(|e| bad(e.message().to_string()))?;
        let ignore = f
            .ignore
            .iter()
            .map(|p| glob::Pattern::new(p).map_err(|e| bad(format!("ignore pattern {p:?}: {e}"))))
            .collect::<Result<_>>()?;
        let mut renames: Vec<(String, String)> = f.rename.into_iter().collect();
        renames.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        Ok(Mapping {
            renames,
            ignore,
            model: f.model,
        })
    }

    /// A name after the renames.
    pub fn rename(&self, name: &str) -> String {
        for (from, to) in &self.renames {
            if let Some(rest) = name.strip_prefix(from.as_str()) {
                return format!("{to}{rest}");
            }
        }
        name.to_string()
    }

    /// Whether a (renamed) name is left out.
    pub fn ignored(&self, name: &str) -> bool {
        self.ignore.iter().any(|p| p.matches(name))
    }
}

/// One value of the model's shape and where it came from.
fn pick(what: &str, sources: &[(String, Option<usize>)]) -> Result<Option<(usize, String)>> {
    let mut found: Option<(usize, String)> = None;
    for (src, v) in sources {
        if let Some(v) = *v {
            match &found {
                Some((w, wsrc)) if *w != v => {
                    return Err(ProbeError::Usage(format!(
                        "the model's {what} is {w} by {wsrc} but {v} by {src}: the checkpoints are of other models, or a setting is wrong"
                    )))
                }
                Some(_) => {}
                None => found = Some((v, src.clone())),
            }
        }
    }
    Ok(found)
}

/// The model's shape from the mapping file, both sides' recorded settings and the other
/// side's vocabulary; each value's source (for the report).
pub fn dims(
    map: &Mapping,
    sides: [&Checkpoint; 2],
    flat_vocab: Option<usize>,
) -> Result<(Dims, BTreeMap<String, String>)> {
    let get = |ck: &Checkpoint, k: &str| ck.settings.get(k).and_then(|&v| usize::try_from(v).ok());
    let from = |key_hf: &str, key_mg: &str, file: Option<usize>| {
        let mut v = vec![("--mapping".to_string(), file)];
        for (i, ck) in sides.iter().enumerate() {
            let side = ["bench", "cmp"][i];
            v.push((
                format!("{side}'s config.json"),
                get(ck, &format!("hf.{key_hf}")),
            ));
            v.push((
                format!("{side}'s Megatron args"),
                get(ck, &format!("megatron.{key_mg}")),
            ));
        }
        v
    };
    let mut src = BTreeMap::new();
    let mut one = |what: &str, s: Vec<(String, Option<usize>)>| -> Result<Option<usize>> {
        Ok(pick(what, &s)?.map(|(v, from)| {
            src.insert(what.to_string(), from);
            v
        }))
    };
    let heads = one(
        "heads",
        from(
            "num_attention_heads",
            "num_attention_heads",
            map.model.heads,
        ),
    )?;
    let mut kv = from(
        "num_key_value_heads",
        "num_query_groups",
        map.model.kv_heads,
    );
    // Megatron without GQA records no query groups: as many as heads.
    for ck in sides {
        if get(ck, "megatron.num_attention_heads").is_some()
            && get(ck, "megatron.num_query_groups").is_none()
        {
            kv.push((
                "Megatron args (no query groups)".into(),
                get(ck, "megatron.num_attention_heads"),
            ));
        }
    }
    let kv_heads = one("kv_heads", kv)?;
    let mut hd = from("head_dim", "kv_channels", map.model.head_dim);
    for ck in sides {
        let h = get(ck, "hf.hidden_size").or(get(ck, "megatron.hidden_size"));
        if let (Some(h), Some(n)) = (h, heads) {
            if get(ck, "hf.head_dim").is_none()
                && get(ck, "megatron.kv_channels").is_none()
                && n > 0
            {
                hd.push(("hidden size / heads".into(), Some(h / n)));
            }
        }
    }
    let head_dim = one("head_dim", hd)?;
    let mut voc = from("vocab_size", "", map.model.vocab);
    voc.push(("the other side's embedding".into(), flat_vocab));
    let vocab = one("vocab", voc)?;
    Ok((
        Dims {
            heads,
            kv_heads,
            head_dim,
            vocab,
        },
        src,
    ))
}
