//! A file as fixed-size records: a header to skip, a record size, a count.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mapping::MappedFile;

/// A mapped file seen as `count` records of `record_bytes` each, after a
/// header of `header` bytes (a `.npy` file's, say): what an `np.memmap` of
/// shape `(count, *record_shape)` sees.
///
/// Bytes after the last whole record are an error unless the view is made
/// with [`Records::ignoring_tail`], which leaves them out, as an `np.memmap`
/// with an explicit shape does.
///
/// ```
/// use wirespeed_pinned::{MappedFile, Records};
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let path = std::env::temp_dir().join(format!("records-doc-{}.bin", std::process::id()));
/// std::fs::write(&path, vec![7u8; 3 * 2883])?;
/// // SAFETY: nobody writes or truncates the file while it is mapped.
/// let file = unsafe { MappedFile::open(&path) }?;
/// let rec = Records::new(&file, 0, 2883)?;
/// assert_eq!(rec.count(), 3);
/// assert_eq!(rec.range(2), 5766..8649);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Records {
    file: Arc<MappedFile>,
    header: u64,
    record_bytes: u64,
    count: u64,
}

impl Records {
    /// The records of `file` after `header` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `record_bytes` is 0, when the file holds
    /// no whole record after the header, or when bytes are left after the
    /// last whole record (see [`Records::ignoring_tail`]).
    pub fn new(file: &Arc<MappedFile>, header: u64, record_bytes: u64) -> Result<Records> {
        let r = Records::ignoring_tail(file, header, record_bytes)?;
        let tail = file.len() - header - r.count * record_bytes;
        if tail != 0 {
            return Err(Error::invalid(
                "records",
                format!(
                    "{}: {} bytes after the header are not a whole number of {record_bytes}-byte records \
                     ({tail} bytes left over); check the record size and header, or use Records::ignoring_tail",
                    file.path().display(),
                    file.len() - header
                ),
            ));
        }
        Ok(r)
    }

    /// As [`Records::new`], but bytes after the last whole record are left out.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `record_bytes` is 0 or the file holds no
    /// whole record after the header.
    pub fn ignoring_tail(file: &Arc<MappedFile>, header: u64, record_bytes: u64) -> Result<Records> {
        if record_bytes == 0 {
            return Err(Error::invalid("records", "the record size is 0 bytes"));
        }
        let after = file.len().checked_sub(header).ok_or_else(|| {
            Error::invalid(
                "records",
                format!(
                    "{}: a header of {header} bytes is longer than the file ({} bytes)",
                    file.path().display(),
                    file.len()
                ),
            )
        })?;
        let count = after / record_bytes;
        if count == 0 {
            return Err(Error::invalid(
                "records",
                format!(
                    "{}: no whole {record_bytes}-byte record in the {after} bytes after the header",
                    file.path().display()
                ),
            ));
        }
        Ok(Records { file: file.clone(), header, record_bytes, count })
    }

    /// The records of a `.npy` file, as its header describes them: a
    /// C-ordered array of a plain dtype whose first axis counts records.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the file is not a `.npy` file, is in
    /// Fortran order, has a structured or object dtype, or is shorter than its
    /// header says.
    ///
    /// ```
    /// use wirespeed_pinned::{MappedFile, Records};
    /// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let path = std::env::temp_dir().join(format!("records-npy-doc-{}.npy", std::process::id()));
    /// let dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 3, 31, 31), }";
    /// let mut header = format!("{dict:<117}\n").into_bytes(); // 10 + 118 = 128 bytes
    /// let mut bytes = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
    /// bytes.append(&mut header);
    /// bytes.extend(std::iter::repeat(0u8).take(4 * 2883));
    /// std::fs::write(&path, &bytes)?;
    /// // SAFETY: nobody writes or truncates the file while it is mapped.
    /// let file = unsafe { MappedFile::open(&path) }?;
    /// let rec = Records::npy(&file)?;
    /// assert_eq!((rec.header(), rec.record_bytes(), rec.count()), (128, 2883, 4));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn npy(file: &Arc<MappedFile>) -> Result<Records> {
        let head = file.bytes(0..file.len().min(NPY_HEADER_MAX))?;
        let NpyHeader { header, record_bytes, count } = parse_npy(head).map_err(|why| {
            Error::invalid("records", format!("{}: not a usable .npy file: {why}", file.path().display()))
        })?;
        let r = Records::ignoring_tail(file, header, record_bytes)?;
        if r.count < count {
            return Err(Error::invalid(
                "records",
                format!("{}: the header says {count} records, the file holds {}", file.path().display(), r.count),
            ));
        }
        Ok(Records { count, ..r })
    }

    /// The first `count` records only (an array whose file holds more, as an
    /// `np.memmap` with an explicit shape sees it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `count` is 0 or more than the file holds.
    pub fn take(self, count: u64) -> Result<Records> {
        if count == 0 || count > self.count {
            return Err(Error::invalid(
                "records",
                format!("{}: {count} records asked, the file holds {}", self.file.path().display(), self.count),
            ));
        }
        Ok(Records { count, ..self })
    }

    /// The file.
    pub fn file(&self) -> &Arc<MappedFile> {
        &self.file
    }

    /// Bytes before the first record.
    pub fn header(&self) -> u64 {
        self.header
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> u64 {
        self.record_bytes
    }

    /// Number of records.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The file's byte range of record `i` (`i < count()`; past the last
    /// record, offsets are clipped to `u64::MAX` rather than wrapping).
    pub fn range(&self, i: u64) -> std::ops::Range<u64> {
        self.span(i..i.saturating_add(1))
    }

    /// The file's byte range of records `first..end` (clipped to `u64::MAX`
    /// past the last record, as [`Records::range`]).
    pub fn span(&self, records: std::ops::Range<u64>) -> std::ops::Range<u64> {
        let at = |i: u64| self.header.saturating_add(i.saturating_mul(self.record_bytes));
        at(records.start)..at(records.end)
    }
}

/// The most of a `.npy` file read to find its header.
const NPY_HEADER_MAX: u64 = 1 << 20;

/// What a `.npy` header says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NpyHeader {
    pub header: u64,
    pub record_bytes: u64,
    pub count: u64,
}

/// Parses the header of a `.npy` file (format versions 1 to 3).
pub(crate) fn parse_npy(bytes: &[u8]) -> std::result::Result<NpyHeader, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("no .npy magic (\\x93NUMPY) at its start".into());
    }
    let (len, start) = match bytes[6] {
        1 => (u64::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10u64),
        2 | 3 if bytes.len() >= 12 => (u64::from(u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]])), 12),
        v => return Err(format!("format version {v} is not one of 1, 2, 3")),
    };
    let header = start + len;
    let text = bytes.get(start as usize..header as usize).ok_or("the file is shorter than its header")?;
    let text = std::str::from_utf8(text).map_err(|_| "the header is not text")?;
    let descr = dict_value(text, "descr").ok_or("no 'descr' in the header")?;
    let fortran = dict_value(text, "fortran_order").ok_or("no 'fortran_order' in the header")?;
    let shape = dict_value(text, "shape").ok_or("no 'shape' in the header")?;
    if fortran.trim() != "False" {
        return Err("it is in Fortran order: records are not contiguous (save it C-ordered)".into());
    }
    let itemsize = dtype_size(descr.trim())?;
    let dims = parse_shape(shape.trim())?;
    let (&count, rest) = dims.split_first().ok_or("its shape is () (a scalar, not records)")?;
    let record_bytes =
        rest.iter().try_fold(itemsize, |acc, &d| acc.checked_mul(d)).ok_or("the record size overflows")?;
    if record_bytes == 0 {
        return Err("its records are empty (a 0 in the shape)".into());
    }
    Ok(NpyHeader { header, record_bytes, count })
}

/// The text of `key`'s value in a Python dict literal of simple values.
fn dict_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.find(&format!("'{key}'")).or_else(|| text.find(&format!("\"{key}\"")))?;
    let rest = text[at + key.len() + 2..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else if let Some(q) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
        rest[1..].find(q)? + 2
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    Some(&rest[..end])
}

fn dtype_size(descr: &str) -> std::result::Result<u64, String> {
    let s = descr.trim_matches(|c| c == '\'' || c == '"');
    if descr.starts_with('[') || s.is_empty() {
        return Err(format!("its dtype {descr} is structured; only plain dtypes are records here"));
    }
    let kind = s.trim_start_matches(['<', '>', '|', '=']);
    let (code, size) = kind.split_at(1);
    if !"biufcV".contains(code) {
        return Err(format!("its dtype {descr} is not a plain number or bytes type"));
    }
    size.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| format!("its dtype {descr} has no item size"))
}

fn parse_shape(s: &str) -> std::result::Result<Vec<u64>, String> {
    let inner =
        s.strip_prefix('(').and_then(|s| s.strip_suffix(')')).ok_or_else(|| format!("shape {s} is not a tuple"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.trim_end_matches('L').parse::<u64>().map_err(|_| format!("shape {s} has a non-integer")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(dict: &str, version: u8) -> Vec<u8> {
        let pre = if version == 1 { 10 } else { 12 };
        let mut h = dict.to_string();
        while !(pre + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY".to_vec();
        b.push(version);
        b.push(0);
        if version == 1 {
            b.extend((h.len() as u16).to_le_bytes());
        } else {
            b.extend((h.len() as u32).to_le_bytes());
        }
        b.extend(h.bytes());
        b
    }

    #[test]
    fn npy_headers_of_every_version_and_common_dtypes() {
        let d = "{'descr': '|u1', 'fortran_order': False, 'shape': (25000000, 3, 31, 31), }";
        for v in [1, 2, 3] {
            let b = npy(d, v);
            let h = parse_npy(&b).unwrap();
            assert_eq!((h.header, h.record_bytes, h.count), (b.len() as u64, 2883, 25_000_000));
        }
        let labels = npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1000,), }", 1);
        assert_eq!(parse_npy(&labels).unwrap().record_bytes, 8);
        let f32s = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (10, 4096), }", 1);
        assert_eq!(parse_npy(&f32s).unwrap().record_bytes, 4 * 4096);
    }

    #[test]
    fn npy_files_that_are_not_records_are_refused_with_a_reason() {
        let cases = [
            ("{'descr': '|u1', 'fortran_order': True, 'shape': (4, 3), }", "Fortran"),
            ("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (4,), }", "structured"),
            ("{'descr': '|O', 'fortran_order': False, 'shape': (4,), }", "plain"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (), }", "scalar"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 0), }", "empty"),
        ];
        for (dict, why) in cases {
            let e = parse_npy(&npy(dict, 1)).unwrap_err();
            assert!(e.contains(why), "{dict}: {e}");
        }
        assert!(parse_npy(b"not numpy at all").unwrap_err().contains("magic"));
        let mut short = npy("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 1);
        short.truncate(20);
        assert!(parse_npy(&short).unwrap_err().contains("shorter"));
    }
}
