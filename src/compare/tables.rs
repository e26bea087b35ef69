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

use super::judged::Judged;
use super::{Row, Unmatched};
use crate::error::{ProbeError, Result};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The bulk of a unit's result: every tensor row, in the comparison run's execution order,
/// and every tensor found on one side only.
#[derive(Debug, Clone, Default)]
pub struct UnitTable {
    /// Matched tensors.
    pub rows: UnitRows,
    /// Tensors present on one side only.
    pub unmatched: Vec<Unmatched>,
}

/// A unit's rows: made (read back from a file, or built by hand), or judged pairs whose
/// rows are made as they are read ([`Judged`]: a fraction of the memory).
#[derive(Debug, Clone)]
pub enum UnitRows {
    /// Rows made.
    Made(Vec<Row>),
    /// Judged pairs over their records (boxed: two op stores' worth of vectors).
    Judged(Box<Judged>),
}

impl Default for UnitRows {
    fn default() -> UnitRows {
        UnitRows::Made(Vec::new())
    }
}

impl UnitRows {
    /// How many rows.
    pub(crate) fn len(&self) -> usize {
        match self {
            UnitRows::Made(r) => r.len(),
            UnitRows::Judged(j) => j.len(),
        }
    }

    /// Calls `f` with the rows in order, in chunks of whole ops (one for made rows);
    /// stops at the first error.
    pub(crate) fn visit(&self, f: &mut dyn FnMut(&[Row]) -> Result<()>) -> Result<()> {
        match self {
            UnitRows::Made(r) => f(r),
            UnitRows::Judged(j) => j.visit(f),
        }
    }

    /// Every row, made.
    pub fn all(&self) -> Vec<Row> {
        match self {
            UnitRows::Made(r) => r.clone(),
            UnitRows::Judged(j) => j.rows(0..j.len()),
        }
    }

    /// About how many bytes the rows hold in memory.
    fn weight(&self) -> usize {
        match self {
            UnitRows::Made(r) => weight(r.len()),
            UnitRows::Judged(j) => j.weight(),
        }
    }

    /// Writes the rows as one MessagePack array (what [`encode`] makes of the same rows),
    /// a chunk at a time; returns the bytes written.
    fn write(&self, w: &mut dyn Write, path: &Path) -> Result<u64> {
        let mut out = Counted { w, n: 0 };
        let bad = |msg: String| ProbeError::Output {
            path: path.to_path_buf(),
            msg: format!("encoding rows: {msg}"),
        };
        let len = u32::try_from(self.len()).map_err(|_| bad("more than 2^32 rows".into()))?;
        rmp::encode::write_array_len(&mut out, len).map_err(|e| bad(e.to_string()))?;
        self.visit(&mut |rows| {
            for r in rows {
                rmp_serde::encode::write(&mut out, r).map_err(|e| bad(e.to_string()))?;
            }
            Ok(())
        })?;
        Ok(out.n)
    }
}

/// A writer that counts what it writes.
struct Counted<'w> {
    w: &'w mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.w.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Memory a row takes, heap included: what the budget counts. Measured on the scaling
/// bench's 64 ranks × 20,000 statistics tensors (peak RSS with every row in memory minus
/// with every row parked, over the rows): 516 bytes; a tensor-mode row adds its metrics
/// (128 bytes with the allocator's rounding). The larger figure, so a run never holds more
/// than its budget.
const ROW_BYTES: usize = 650;

/// About how many bytes a table of `lines` rows and unmatched tensors holds in memory.
pub(crate) fn weight(lines: usize) -> usize {
    lines.saturating_mul(ROW_BYTES)
}

impl UnitTable {
    /// About how many bytes the table holds in memory.
    fn weight(&self) -> usize {
        self.rows.weight() + weight(self.unmatched.len())
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
pub(crate) type Span = (u64, u64);

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
    pub(crate) fn memory(table: UnitTable) -> Parked {
        Parked(Place::Memory(table))
    }

    /// Calls `f` with the rows in order, a chunk of whole ops at a time (made, or read
    /// back from the file); stops at the first error.
    pub(crate) fn visit_rows(&self, f: &mut dyn FnMut(&[Row]) -> Result<()>) -> Result<()> {
        match &self.0 {
            Place::Memory(t) => t.rows.visit(f),
            Place::File { file, rows, .. } => visit_file(&file.path, *rows, f),
        }
    }

    /// Every row.
    pub(crate) fn rows(&self) -> Result<Vec<Row>> {
        match &self.0 {
            Place::Memory(t) => Ok(t.rows.all()),
            Place::File { file, rows, .. } => decode(&file.path, *rows),
        }
    }

    /// The unmatched tensors, borrowed or read back from the file.
    pub(crate) fn unmatched(&self) -> Result<Cow<'_, [Unmatched]>> {
        match &self.0 {
            Place::Memory(t) => Ok(Cow::Borrowed(&t.unmatched)),
            Place::File {
                file, unmatched, ..
            } => decode(&file.path, *unmatched).map(Cow::Owned),
        }
    }

    /// Writes the encoded rows, then the encoded unmatched tensors (what a rows file holds)
    /// into `w`; returns how many bytes each took.
    fn write(&self, w: &mut dyn Write, path: &Path) -> Result<(u64, u64)> {
        let out = |e: std::io::Error| ProbeError::Output {
            path: path.to_path_buf(),
            msg: e.to_string(),
        };
        match &self.0 {
            Place::Memory(t) => {
                let rows = t.rows.write(w, path)?;
                let unmatched = encode(&t.unmatched, path)?;
                w.write_all(&unmatched).map_err(out)?;
                Ok((rows, unmatched.len() as u64))
            }
            Place::File {
                file,
                rows,
                unmatched,
            } => {
                for span in [rows, unmatched] {
                    let mut r = open_span(&file.path, *span)?;
                    std::io::copy(&mut r, w).map_err(out)?;
                }
                Ok((rows.1, unmatched.1))
            }
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

/// A reader of the `len` bytes at `offset` of `path`, checked to lie inside the file.
fn open_span(path: &Path, (offset, len): Span) -> Result<BufReader<std::io::Take<File>>> {
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
    // The buffer outside the limit: a decoder's many small reads are then copies out of
    // the buffer (inside, each went through the limit to the buffer).
    Ok(BufReader::with_capacity(1 << 20, f.take(len)))
}

fn read_bytes(path: &Path, span: Span) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut r = open_span(path, span)?;
    // The span was checked against the file's size: this reserves at most what it holds.
    buf.reserve_exact(span.1 as usize);
    r.read_to_end(&mut buf)
        .map_err(|e| ProbeError::io(path, e))?;
    Ok(buf)
}

/// Rows read back at a time from a file (more when an op's rows would be cut).
const FILE_CHUNK: usize = 4096;

/// Calls `f` with the rows of the array at `span` of `path`, decoded a chunk of whole ops
/// at a time (never the whole array in memory).
fn visit_file(path: &Path, span: Span, f: &mut dyn FnMut(&[Row]) -> Result<()>) -> Result<()> {
    let bad = |msg: String| ProbeError::BadShardResult {
        path: path.to_path_buf(),
        msg: format!("rows at {}: {msg}", span.0),
    };
    let mut r = open_span(path, span)?;
    let n = rmp::decode::read_array_len(&mut r).map_err(|e| bad(e.to_string()))?;
    let mut de = rmp_serde::Deserializer::new(&mut r);
    let mut chunk: Vec<Row> = Vec::with_capacity(FILE_CHUNK.min(n as usize));
    for _ in 0..n {
        let row =
            Row::deserialize(&mut de).map_err(|e| bad(crate::error::one_line(e.to_string())))?;
        let new_op = chunk
            .last()
            .is_some_and(|l| l.tensor.op.index != row.tensor.op.index);
        if chunk.len() >= FILE_CHUNK && new_op {
            f(&chunk)?;
            chunk.clear();
        }
        chunk.push(row);
    }
    let r = de.get_ref();
    let left = r.get_ref().limit() + r.buffer().len() as u64;
    if left != 0 {
        return Err(bad(format!("{left} bytes after its {n} rows")));
    }
    if !chunk.is_empty() {
        f(&chunk)?;
    }
    Ok(())
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
    pub(crate) fn loaded(self, weights: &[usize], budget: usize) -> Result<Tables> {
        let mut held = 0usize;
        let mut out = Vec::with_capacity(self.0.len());
        for (p, &w) in self.0.into_iter().zip(weights) {
            let fits = held.saturating_add(w) <= budget;
            out.push(match p.0 {
                Place::File { .. } if fits => {
                    held += w;
                    Parked::memory(UnitTable {
                        rows: UnitRows::Made(p.rows()?),
                        unmatched: p.unmatched()?.into_owned(),
                    })
                }
                _ => p,
            });
        }
        Ok(Tables(out))
    }

    /// Every row of unit `i` (made, or read back from its file). Panics past the end, as
    /// indexing does.
    pub fn rows(&self, i: usize) -> Result<Vec<Row>> {
        self.0[i].rows()
    }

    /// The unmatched tensors of unit `i`.
    pub fn unmatched(&self, i: usize) -> Result<Cow<'_, [Unmatched]>> {
        self.0[i].unmatched()
    }

    /// Calls `f` with each unit's index and rows, in order, a chunk of a unit's whole ops
    /// at a time (a unit may come in several chunks); stops at the first error.
    pub fn visit_rows(&self, mut f: impl FnMut(usize, &[Row]) -> Result<()>) -> Result<()> {
        for (i, p) in self.0.iter().enumerate() {
            p.visit_rows(&mut |rows| f(i, rows))?;
        }
        Ok(())
    }

    /// As [`Tables::visit_rows`], for the unmatched tensors.
    pub(crate) fn visit_unmatched(
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
pub(crate) fn write_file<'a>(
    tables: impl Iterator<Item = &'a Parked>,
    path: &Path,
) -> Result<(Vec<(Span, Span)>, String)> {
    use sha2::{Digest, Sha256};
    let mut places = Vec::new();
    let mut hash = Sha256::new();
    let mut offset = 0u64;
    crate::atomic::write_with(path, |w| {
        let mut w = Hashed { w, hash: &mut hash };
        for p in tables {
            let (rows, unmatched) = p.write(&mut w, path).map_err(|e| e.to_string())?;
            places.push(((offset, rows), (offset + rows, unmatched)));
            offset += rows + unmatched;
        }
        Ok(())
    })?;
    Ok((places, format!("{:x}", hash.finalize())))
}

/// A writer that hashes what it writes.
struct Hashed<'a, W: Write> {
    w: W,
    hash: &'a mut sha2::Sha256,
}

impl<W: Write> Write for Hashed<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        let k = self.w.write(buf)?;
        self.hash.update(&buf[..k]);
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
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
    pub(crate) fn park(&mut self, table: UnitTable, last: bool) -> Result<Parked> {
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
            let path = dir.join(crate::atomic::scratch_name(
                "rows",
                &format!("-{n}.msgpack"),
            ));
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
        let (r, u) = Parked::memory(table).write(&mut s.out, &s.file.path)?;
        let rows = (s.end, r);
        let unmatched = (s.end + r, u);
        s.end += r + u;
        Ok(Parked(Place::File {
            file: s.file.clone(),
            rows,
            unmatched,
        }))
    }

    /// Flushes the file (if any): every handle parked so far is readable after this.
    pub(crate) fn finish(self) -> Result<()> {
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
        // One call for the empty table in memory; none for those in the file.
        assert_eq!(seen, 1);
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
