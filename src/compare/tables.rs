//! Where a run's rows wait between the compare and the reports.
//!
//! Why: the reports need every row of the run (the parquet table, the workbook, the html
//! plot), but a 1,000-rank job has tens of millions of them, about 0.5–0.65 KB each in memory;
//! held until the end they grow with the number of ranks. So each unit's result comes
//! in two ([`super::compare_unit`]): its [`super::UnitSummary`] (counts, findings,
//! coverage, its worst ops: small, held for every unit, all the verdict needs) and its
//! [`UnitTable`] (rows and unmatched tensors), which is *parked*: kept in memory while the
//! run's parked rows fit a budget (`--row-memory`), appended to a temporary file in the
//! output folder past it (the run's last unit excepted: nothing comes after it to make room
//! for). Readers visit the tables one unit at a time ([`Tables::visit_rows`]), so peak
//! memory is the budget plus a few units, whatever the number of units.
//!
//! A shard result's rows file is such a file too: `probe merge` visits the shards' tables
//! where they lie ([`Tables::in_file`]) and never holds them all.

use super::{Row, Unmatched};
use crate::error::{ProbeError, Result};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The bulk of a unit's result: every tensor row, in the comparison run's execution order,
/// and every tensor found on one side only.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UnitTable {
    /// Matched tensors.
    pub rows: Vec<Row>,
    /// Tensors present on one side only.
    pub unmatched: Vec<Unmatched>,
}

/// Memory a row takes, heap included: what the budget counts. Measured on the scaling
/// bench's 64 ranks × 20,000 statistics tensors (peak RSS with every row in memory minus
/// with every row parked, over the rows): 516 bytes; a tensor-mode row adds its metrics
/// (128 bytes with the allocator's rounding). The larger figure, so a run never holds more
/// than its budget.
const ROW_BYTES: usize = 650;

/// About how many bytes a table of `lines` rows and unmatched tensors holds in memory.
pub fn weight(lines: usize) -> usize {
    lines.saturating_mul(ROW_BYTES)
}

impl UnitTable {
    /// About how many bytes the table holds in memory.
    fn weight(&self) -> usize {
        weight(self.rows.len() + self.unmatched.len())
    }
}

/// How many bytes of rows a run keeps in memory before it parks the rest in a file
/// (`--row-memory`), and the folder for that file (None: never park in a file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMemory {
    /// Bytes of rows held in memory at most (about 0.65 KB a row); 0 parks every
    /// table but the run's last in the file.
    pub budget: usize,
    /// Where the temporary file goes (the output folder: it is several times the size of
    /// the parquet table, and `/tmp` may be a small RAM disk).
    pub dir: Option<PathBuf>,
}

impl Default for RowMemory {
    fn default() -> RowMemory {
        RowMemory {
            budget: usize::MAX,
            dir: None,
        }
    }
}

/// A file holding parked tables: a temporary one is removed when the last table in it is
/// dropped.
#[derive(Debug)]
struct TableFile {
    path: PathBuf,
    temporary: bool,
}

impl Drop for TableFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Where one unit's table is: in memory, or at two places in a file (its rows, then its
/// unmatched tensors, apart: most readers want only one of them).
#[derive(Debug)]
pub struct Parked(Place);

/// `(offset, len)` of an encoded part in a file.
pub type Span = (u64, u64);

#[derive(Debug)]
enum Place {
    Memory(UnitTable),
    File {
        file: Arc<TableFile>,
        rows: Span,
        unmatched: Span,
    },
}

impl Parked {
    /// A table kept in memory.
    pub fn memory(table: UnitTable) -> Parked {
        Parked(Place::Memory(table))
    }

    /// The rows, borrowed or read back from the file.
    pub fn rows(&self) -> Result<Cow<'_, [Row]>> {
        match &self.0 {
            Place::Memory(t) => Ok(Cow::Borrowed(&t.rows)),
            Place::File { file, rows, .. } => decode(&file.path, *rows).map(Cow::Owned),
        }
    }

    /// The unmatched tensors, borrowed or read back from the file.
    pub fn unmatched(&self) -> Result<Cow<'_, [Unmatched]>> {
        match &self.0 {
            Place::Memory(t) => Ok(Cow::Borrowed(&t.unmatched)),
            Place::File {
                file, unmatched, ..
            } => decode(&file.path, *unmatched).map(Cow::Owned),
        }
    }

    /// The encoded rows and unmatched tensors (what a rows file holds).
    fn bytes(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        match &self.0 {
            Place::Memory(t) => {
                let memory = Path::new("(memory)");
                Ok((encode(&t.rows, memory)?, encode(&t.unmatched, memory)?))
            }
            Place::File {
                file,
                rows,
                unmatched,
            } => Ok((
                read_bytes(&file.path, *rows)?,
                read_bytes(&file.path, *unmatched)?,
            )),
        }
    }
}

/// MessagePack with fields by position (no names): a third of the size, several times faster
/// to read back than with names (parked rows are read once per report). Every type in a
/// row serialises each of its fields always (no `skip_serializing_if`), which positional
/// reading needs.
fn encode<T: Serialize + ?Sized>(v: &T, path: &Path) -> Result<Vec<u8>> {
    rmp_serde::to_vec(v).map_err(|e| ProbeError::Output {
        path: path.to_path_buf(),
        msg: format!("encoding rows: {e}"),
    })
}

fn read_bytes(path: &Path, (offset, len): Span) -> Result<Vec<u8>> {
    let size = std::fs::metadata(path)
        .map_err(|e| ProbeError::io(path, e))?
        .len();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(ProbeError::BadShardResult {
            path: path.to_path_buf(),
            msg: format!(
                "rows at {offset}+{len} lie past the file's end ({size} bytes): truncated"
            ),
        });
    }
    let mut f = File::open(path).map_err(|e| ProbeError::io(path, e))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| ProbeError::io(path, e))?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf)
        .map_err(|e| ProbeError::io(path, e))?;
    Ok(buf)
}

fn decode<T: serde::de::DeserializeOwned>(path: &Path, span: Span) -> Result<Vec<T>> {
    let bytes = read_bytes(path, span)?;
    decode_array(&bytes).map_err(|e| ProbeError::BadShardResult {
        path: path.to_path_buf(),
        msg: format!("rows at {}: {e}", span.0),
    })
}

/// A MessagePack array decoded into a vector of exactly its length.
///
/// Why: serde's own `Vec` reserves at most 1 MiB of elements up front (its guard against a
/// hostile length) and doubles from there, so a unit of 2,800 rows (~0.4 KB each) was
/// grown, copied and kept with room for 5,200; reading 358,656 rows back in a merge, that
/// growth and the fresh pages it touched took a third of the CPU. The length is trusted
/// only as far as the bytes go: what is reserved up front is at most four times the
/// encoded bytes (a row takes ~0.3 KB encoded, ~0.4 KB decoded), so a hostile length
/// costs no more memory than the input could fill.
fn decode_array<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> std::result::Result<Vec<T>, rmp_serde::decode::Error> {
    use serde::de::{SeqAccess, Visitor};
    use serde::Deserializer as _;
    struct Exact<T> {
        most: usize,
        of: std::marker::PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Exact<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Vec<T>, A::Error> {
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.most));
            while let Some(x) = seq.next_element()? {
                v.push(x);
            }
            Ok(v)
        }
    }
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    (&mut de).deserialize_seq(Exact {
        most: bytes.len().saturating_mul(4) / std::mem::size_of::<T>().max(1),
        of: std::marker::PhantomData,
    })
}

/// One unit's rows as a rows file holds them (a shard's `rows.msgpack` is read through
/// this; the entry point of the mutation test and the fuzz harness).
pub fn parse_rows(bytes: &[u8]) -> std::result::Result<Vec<Row>, String> {
    decode_array(bytes).map_err(|e| crate::error::one_line(e.to_string()))
}

/// One unit's rows, encoded as a rows file holds them.
pub fn encode_rows(rows: &[Row]) -> Result<Vec<u8>> {
    encode(rows, Path::new("(memory)"))
}

/// The tables of a run's units, in unit order.
#[derive(Debug, Default)]
pub struct Tables(Vec<Parked>);

impl From<Vec<Parked>> for Tables {
    fn from(v: Vec<Parked>) -> Tables {
        Tables(v)
    }
}

impl Tables {
    /// Tables at `(rows, unmatched)` places of `path` (a shard's rows file, kept).
    pub fn in_file(path: &Path, places: &[(Span, Span)]) -> Vec<Parked> {
        let file = Arc::new(TableFile {
            path: path.to_path_buf(),
            temporary: false,
        });
        places
            .iter()
            .map(|&(rows, unmatched)| {
                Parked(Place::File {
                    file: file.clone(),
                    rows,
                    unmatched,
                })
            })
            .collect()
    }

    /// The same tables, those in a file read into memory in unit order while their
    /// `weights` (bytes each) add up to at most `budget`: read once, rather than once by
    /// every report.
    pub fn loaded(self, weights: &[usize], budget: usize) -> Result<Tables> {
        let mut held = 0usize;
        let mut out = Vec::with_capacity(self.0.len());
        for (p, &w) in self.0.into_iter().zip(weights) {
            let fits = held.saturating_add(w) <= budget;
            out.push(match p.0 {
                Place::File { .. } if fits => {
                    held += w;
                    Parked::memory(UnitTable {
                        rows: p.rows()?.into_owned(),
                        unmatched: p.unmatched()?.into_owned(),
                    })
                }
                _ => p,
            });
        }
        Ok(Tables(out))
    }

    /// How many units.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rows of unit `i` (borrowed, or read back from its file). Panics past the end,
    /// as indexing does.
    pub fn rows(&self, i: usize) -> Result<Cow<'_, [Row]>> {
        self.0[i].rows()
    }

    /// The unmatched tensors of unit `i`.
    pub fn unmatched(&self, i: usize) -> Result<Cow<'_, [Unmatched]>> {
        self.0[i].unmatched()
    }

    /// Calls `f` with each unit's index and rows, in order, one unit's rows in memory at a
    /// time (beyond those kept in memory); stops at the first error.
    pub fn visit_rows(&self, mut f: impl FnMut(usize, &[Row]) -> Result<()>) -> Result<()> {
        for (i, p) in self.0.iter().enumerate() {
            let rows = p.rows()?;
            f(i, &rows)?;
        }
        Ok(())
    }

    /// As [`Tables::visit_rows`], for the unmatched tensors.
    pub fn visit_unmatched(
        &self,
        mut f: impl FnMut(usize, &[Unmatched]) -> Result<()>,
    ) -> Result<()> {
        for (i, p) in self.0.iter().enumerate() {
            let unmatched = p.unmatched()?;
            f(i, &unmatched)?;
        }
        Ok(())
    }
}

/// Writes the tables, in order, into `path` (a shard's rows file, atomically); returns the
/// places of each (rows, unmatched) and the SHA-256 of the file.
pub fn write_file<'a>(
    tables: impl Iterator<Item = &'a Parked>,
    path: &Path,
) -> Result<(Vec<(Span, Span)>, String)> {
    use sha2::{Digest, Sha256};
    let mut places = Vec::new();
    let mut hash = Sha256::new();
    let mut offset = 0u64;
    crate::atomic::write_with(path, |w| {
        for p in tables {
            let (rows, unmatched) = p.bytes().map_err(|e| e.to_string())?;
            let mut span = |bytes: &[u8]| -> std::result::Result<Span, String> {
                w.write_all(bytes).map_err(|e| e.to_string())?;
                hash.update(bytes);
                let at = (offset, bytes.len() as u64);
                offset += bytes.len() as u64;
                Ok(at)
            };
            places.push((span(&rows)?, span(&unmatched)?));
        }
        Ok(())
    })?;
    Ok((places, format!("{:x}", hash.finalize())))
}

/// Parks the tables of a run as its units finish: in memory up to the budget, then in one
/// temporary file.
pub struct Parking {
    memory: RowMemory,
    held: usize,
    file: Option<Spill>,
}

struct Spill {
    file: Arc<TableFile>,
    out: BufWriter<File>,
    end: u64,
}

/// Numbers the temporary files of one process.
static SPILLS: AtomicU64 = AtomicU64::new(0);

impl Parking {
    /// Parks under `memory`'s budget.
    pub fn new(memory: RowMemory) -> Parking {
        Parking {
            memory,
            held: 0,
            file: None,
        }
    }

    /// Parks one unit's table; the returned handle is readable once [`Parking::finish`]
    /// returned. The run's `last` unit stays in memory whatever the budget: nothing comes
    /// after it to make room for, and reading it back once per report would only add copies
    /// (a run of one huge pair would hold it several times over).
    pub fn park(&mut self, table: UnitTable, last: bool) -> Result<Parked> {
        let weight = table.weight();
        let over = !last
            && (self.memory.budget == 0 || self.held.saturating_add(weight) > self.memory.budget);
        let dir = match &self.memory.dir {
            Some(d) if over => d,
            _ => {
                self.held = self.held.saturating_add(weight);
                return Ok(Parked::memory(table));
            }
        };
        if self.file.is_none() {
            let n = SPILLS.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".probe-rows-{}-{n}.msgpack", std::process::id()));
            let f = File::create(&path).map_err(|e| ProbeError::Output {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            self.file = Some(Spill {
                file: Arc::new(TableFile {
                    path,
                    temporary: true,
                }),
                out: BufWriter::with_capacity(1 << 20, f),
                end: 0,
            });
        }
        let Some(s) = self.file.as_mut() else {
            unreachable!("created above")
        };
        let mut span = |bytes: Vec<u8>| -> Result<Span> {
            s.out.write_all(&bytes).map_err(|e| ProbeError::Output {
                path: s.file.path.clone(),
                msg: e.to_string(),
            })?;
            let at = (s.end, bytes.len() as u64);
            s.end += bytes.len() as u64;
            Ok(at)
        };
        let rows = span(encode(&table.rows, &s.file.path)?)?;
        let unmatched = span(encode(&table.unmatched, &s.file.path)?)?;
        Ok(Parked(Place::File {
            file: s.file.clone(),
            rows,
            unmatched,
        }))
    }

    /// Flushes the file (if any): every handle parked so far is readable after this.
    pub fn finish(self) -> Result<()> {
        if let Some(mut s) = self.file {
            s.out.flush().map_err(|e| ProbeError::Output {
                path: s.file.path.clone(),
                msg: e.to_string(),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_past_the_budget_go_to_a_file_that_is_removed_with_them() {
        let dir = std::env::temp_dir().join(format!("probe-tables-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut parking = Parking::new(RowMemory {
            budget: 0,
            dir: Some(dir.clone()),
        });
        let a = parking.park(UnitTable::default(), false).unwrap();
        let b = parking.park(UnitTable::default(), false).unwrap();
        assert!(matches!(b.0, Place::File { rows, .. } if rows.0 > 0));
        let c = parking.park(UnitTable::default(), true).unwrap();
        assert!(
            matches!(c.0, Place::Memory(_)),
            "the last unit stays in memory"
        );
        parking.finish().unwrap();
        let tables = Tables::from(vec![a, b, c]);
        let mut seen = 0;
        tables
            .visit_rows(|_, rows| {
                assert!(rows.is_empty());
                seen += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, 3);
        drop(tables);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "the temporary file is removed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn arrays_decode_into_vectors_of_their_exact_length() {
        // Past serde's 1 MiB of elements reserved up front, where its vector would double.
        let v: Vec<(u64, String)> = (0..70_000).map(|i| (i, format!("t{i}"))).collect();
        let bytes = rmp_serde::to_vec(&v).unwrap();
        let back: Vec<(u64, String)> = decode_array(&bytes).unwrap();
        assert_eq!(back, v);
        assert_eq!(back.capacity(), back.len());
    }

    #[test]
    fn a_hostile_array_length_is_an_error_not_a_huge_reservation() {
        // array32 of 4,294,967,295 elements, then one element.
        let bytes = [0xdd, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(decode_array::<(u64, String)>(&bytes).is_err());
        assert!(parse_rows(&bytes).is_err());
    }
}
