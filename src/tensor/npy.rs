//! `.npy` files (msprobe's MindSpore tensor dumps): the header is parsed here, the data is
//! read in place by [`crate::tensor`] like any other tensor.

use crate::dtype::DType;
use crate::error::{ProbeError, Result};
use std::io::Read;
use std::path::Path;

/// A tensor inside a `.npy` file, located and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyTensor {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Number of elements (the product of `shape`).
    pub numel: usize,
    /// Absolute byte offset of the first element in the file.
    pub offset: u64,
}

/// Value of `'key': value` in the header dict, as raw text up to the next top-level comma.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat_a = format!("'{key}':");
    let pat_b = format!("\"{key}\":");
    let i = header
        .find(&pat_a)
        .map(|i| i + pat_a.len())
        .or_else(|| header.find(&pat_b).map(|i| i + pat_b.len()))?;
    let rest = header[i..].trim_start();
    let mut depth = 0i32;
    for (j, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth <= 0 => return Some(rest[..j].trim()),
            _ => {}
        }
        if depth < 0 {
            return None;
        }
    }
    None
}

/// Parses a `.npy` header (`bytes` starts at the magic string).
/// Returns dtype, shape and the data offset.
pub(crate) fn parse_header(bytes: &[u8]) -> std::result::Result<(DType, Vec<usize>, u64), String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let major = bytes[6];
    let (hlen, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("header ends early".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!(".npy format version {v} is not supported")),
    };
    let end = start
        .checked_add(hlen)
        .filter(|&e| e <= bytes.len())
        .ok_or("header ends early")?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| "header is not text")?;
    let descr = field(header, "descr").ok_or("header has no 'descr'")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let fortran = field(header, "fortran_order").ok_or("header has no 'fortran_order'")?;
    let shape_s = field(header, "shape").ok_or("header has no 'shape'")?;
    let inner = shape_s
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("shape {shape_s:?} is not a tuple"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| format!("shape {shape_s:?} is not a tuple of sizes"))?;
    // Single-byte types may be written with '|' or '<'; big-endian is refused.
    let norm = match descr {
        "<i1" | "|i1" => "|i1",
        "<u1" | "|u1" => "|u1",
        "<b1" | "|b1" => "|b1",
        d => d,
    };
    let dtype = DType::parse(norm).ok_or_else(|| {
        format!("dtype {descr:?} is not supported (little-endian float, int, uint8 and bool only)")
    })?;
    let multi = shape.iter().filter(|&&d| d > 1).count() > 1;
    if fortran == "True" && multi {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    Ok((dtype, shape, end as u64))
}

/// Locates the tensor of a `.npy` file from its first bytes (`head`: at least the whole
/// header; [`read`] passes up to 64 KiB) and the file's length, checking that the file
/// holds all the data the header declares. The error is one line, without the file name.
pub fn locate(head: &[u8], file_len: u64) -> std::result::Result<NpyTensor, String> {
    let (dtype, shape, offset) = parse_header(head).map_err(crate::error::one_line)?;
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let need = (numel as u64)
        .checked_mul(dtype.size() as u64)
        .and_then(|n| n.checked_add(offset))
        .ok_or("size overflows")?;
    if need > file_len {
        return Err(format!(
            "{file_len} bytes cannot hold {numel} {dtype} elements after a {offset}-byte header"
        ));
    }
    Ok(NpyTensor {
        dtype,
        shape,
        numel,
        offset,
    })
}

/// Reads the header of the `.npy` file at `path` and checks the file holds all its data
/// ([`locate`]).
pub fn read(path: &Path) -> Result<NpyTensor> {
    let mut f = std::fs::File::open(path).map_err(|e| ProbeError::io(path, e))?;
    let len = f.metadata().map_err(|e| ProbeError::io(path, e))?.len();
    let mut head = Vec::new();
    (&mut f)
        .take(1 << 16)
        .read_to_end(&mut head)
        .map_err(|e| ProbeError::io(path, e))?;
    locate(&head, len).map_err(|msg| ProbeError::BadTensorFile {
        path: path.to_path_buf(),
        msg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b
    }

    #[test]
    fn parses_headers() {
        let b = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n");
        assert_eq!(
            parse_header(&b).unwrap(),
            (DType::F32, vec![2, 3], b.len() as u64)
        );
        let b = npy("{'descr': '|b1', 'fortran_order': False, 'shape': (), }");
        assert_eq!(parse_header(&b).unwrap().1, Vec::<usize>::new());
        let b = npy("{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }");
        assert_eq!(parse_header(&b).unwrap().1, vec![5]);
        let b = npy("{'descr': '>f4', 'fortran_order': False, 'shape': (5,), }");
        assert!(parse_header(&b).is_err());
        let b = npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }");
        assert!(parse_header(&b).is_err());
        for n in 0..b.len() {
            let _ = parse_header(&b[..n]);
        }
    }
}
