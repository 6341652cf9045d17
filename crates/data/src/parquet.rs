//! Parquet example files (what the Hugging Face hub serves and `datasets.Dataset.to_parquet`
//! writes): one file or a directory of shards read in name order as one table; example `i` is
//! row `i` of that table. Rows are read with the `parquet` crate's record reader, each row as
//! its JSON object, then made an example by the data's [`RowFormat`], exactly as a JSONL line of
//! the same object is, so a Parquet file and the JSONL form of the same rows give the same
//! examples.
//!
//! Opening a source reads each shard's footer (its last bytes) and checks the schema: a column the
//! kind needs that is missing or is not text is an error naming the file, the column and the fix.
//! Rows are read a row group at a time, only the row groups that hold rows asked for: a host reads
//! its share of a large file, not the file. [`ParquetSource::prefetch`] reads a run's row groups
//! at once and checks their rows, so a bad row stops a run before its first step; a row that is
//! only reached later is checked then, and its error names the file, the row and the field.
//! Decoded row groups are kept in memory up to [`DECODED_BYTES`].

use crate::files::DataFile;
use crate::rows::Row;
use crate::rows::RowFormat;
use crate::source::{Example, ExampleSource, Prefetched};
use crate::{DataError, Result};
use bytes::{Buf, Bytes};
use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::column::page::Page;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, FileReader, Length, RowGroupReader};
use parquet::file::serialized_reader::SerializedFileReader;
use parquet::record::Field;
use serde_json::value::RawValue;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Decoded rows kept in memory (by the row groups' uncompressed size): beyond it the least
/// recently used row group is dropped and decoded again when needed. A row group larger than
/// this is kept alone (it is in memory while its rows are read anyway), so reading its rows
/// decodes it once, not once a row.
pub const DECODED_BYTES: u64 = 512 << 20;

/// The most rows one row group may hold. A row group is decoded whole into memory, so this bounds
/// what one decode holds (pyarrow writes 1Mi rows a group unless told otherwise) and a damaged
/// footer's claim (the fuzzer's file claimed 155 billion rows in 758 bytes).
pub const MAX_GROUP_ROWS: u64 = 1 << 24;

/// How much a page header read asks the file for at a time: headers are tens of bytes (more
/// with long statistics, read in more pieces), and what a read takes past the column chunk is
/// bytes of a row group that may not be wanted.
const HEADER_READ: u64 = 1 << 10;

/// A Parquet table of examples. See the module docs.
pub struct ParquetSource {
    shards: Vec<Shard>,
    format: RowFormat,
    /// The first row of every row group of every shard, in table order, and one past the last.
    starts: Vec<u64>,
    /// `(shard, row group)` of each entry of `starts` but the last.
    groups: Vec<(usize, usize)>,
    decoded: Mutex<Decoded>,
}

struct Shard {
    file: Arc<dyn DataFile>,
    reader: SerializedFileReader<Chunks>,
}

impl std::fmt::Debug for ParquetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetSource")
            .field("shards", &self.shards.iter().map(|s| s.file.name()).collect::<Vec<_>>())
            .field("rows", &self.len())
            .finish()
    }
}

impl ParquetSource {
    /// Reads the footers of `files` (one table, in this order) and checks their schemas.
    pub fn open(files: Vec<Arc<dyn DataFile>>, format: RowFormat) -> Result<Self> {
        let mut shards = Vec::with_capacity(files.len());
        let (mut starts, mut groups) = (vec![0u64], Vec::new());
        for file in files {
            let path = PathBuf::from(file.name());
            let reader =
                SerializedFileReader::new(Chunks(Arc::clone(&file))).map_err(|error| DataError::Parquet {
                    path: path.clone(),
                    message: format!("is not a Parquet file this reader can read ({error})"),
                })?;
            check_schema(reader.metadata(), &format)
                .and_then(|()| check_chunks(reader.metadata(), file.len()))
                .map_err(|message| DataError::Parquet { path: path.clone(), message })?;
            let shard = shards.len();
            for (group, meta) in reader.metadata().row_groups().iter().enumerate() {
                let rows = group_rows(group, meta.num_rows())
                    .map_err(|message| DataError::Parquet { path: path.clone(), message })?;
                if rows > 0 {
                    starts.push(starts.last().copied().unwrap_or(0) + rows);
                    groups.push((shard, group));
                }
            }
            shards.push(Shard { file, reader });
        }
        let source = Self { shards, format, starts, groups, decoded: Mutex::new(Decoded::default()) };
        if source.is_empty() {
            let path = source.shards.first().map_or_else(PathBuf::new, |s| PathBuf::from(s.file.name()));
            return Err(DataError::EmptyFile {
                path,
                what: format!("expected rows of {}", source.format.example_row()),
            });
        }
        Ok(source)
    }

    /// Rows in the table.
    pub fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Whether the table has no rows (never true for an opened source).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row group (index into `groups`) that holds `row`, and the row's place in it.
    fn group_of(&self, row: u64) -> (usize, usize) {
        let group = self.starts.partition_point(|&start| start <= row) - 1;
        (group, (row - self.starts[group]) as usize)
    }

    /// The rows of group `group` as JSON objects, decoded now or kept from before.
    fn rows(&self, group: usize) -> Result<Arc<Vec<Row>>> {
        if let Some(rows) = self.decoded.lock().ok().and_then(|mut decoded| decoded.get(group)) {
            return Ok(rows);
        }
        let (shard, index) = self.groups[group];
        let shard = &self.shards[shard];
        let at = |row: u64| format!("{} row {row}", shard.file.name());
        let first_row = self.starts[group];
        let error = |row: u64, message: String| DataError::Example {
            at: at(row),
            source: Box::new(DataError::Parquet { path: PathBuf::from(shard.file.name()), message }),
        };
        // The `parquet` crate's page decoders still assert on some damaged pages (found by the
        // fuzzer: "Decoder for dict should have been set"); such a panic is the file's fault,
        // so it becomes this file's error instead of ending the worker.
        let decode = || -> Result<Vec<Row>> {
            let reader = shard.reader.get_row_group(index).map_err(|e| error(first_row, e.to_string()))?;
            check_dictionaries(reader.as_ref())
                .map_err(|e| error(first_row, format!("row group {index} {e}")))?;
            // Grown as rows decode, not sized by the footer's count: a damaged page ends the
            // decode early.
            let mut rows = Vec::new();
            for (offset, row) in
                reader.get_row_iter(None).map_err(|e| error(first_row, e.to_string()))?.enumerate()
            {
                let row = row.map_err(|e| error(first_row + offset as u64, e.to_string()))?;
                let cells = row
                    .get_column_iter()
                    .map(|(name, field)| {
                        let mut text = String::new();
                        write_json(&mut text, field);
                        RawValue::from_string(text).map(|raw| (name.clone(), raw))
                    })
                    .collect::<std::result::Result<Row, _>>()
                    .map_err(|e| {
                        error(first_row + offset as u64, format!("a value does not convert to JSON: {e}"))
                    })?;
                rows.push(cells);
            }
            Ok(rows)
        };
        let rows = std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).map_err(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            error(first_row, format!("row group {index} is damaged; the Parquet decoder failed: {what}"))
        })??;
        if rows.len() as u64 != self.starts[group + 1] - first_row {
            return Err(error(
                first_row,
                format!("row group {index} holds fewer rows than its metadata says"),
            ));
        }
        let rows = Arc::new(rows);
        let size = shard.reader.metadata().row_group(index).total_byte_size().max(0) as u64;
        if let Ok(mut decoded) = self.decoded.lock() {
            decoded.insert(group, Arc::clone(&rows), size);
        }
        Ok(rows)
    }

    /// Where `row` of the table is: its file and the row within that file.
    fn locate_row(&self, row: u64) -> (String, u64) {
        let (group, _) = self.group_of(row.min(self.len().saturating_sub(1)));
        let shard = self.groups[group].0;
        let shard_start = self.groups.iter().position(|&(s, _)| s == shard).map_or(0, |g| self.starts[g]);
        (self.shards[shard].file.name().to_owned(), row - shard_start)
    }
}

impl ExampleSource for ParquetSource {
    fn num_examples(&self) -> Option<u64> {
        Some(self.len())
    }

    fn example(&self, index: u64) -> Result<Example> {
        if index >= self.len() {
            return Err(DataError::ExampleOutOfRange {
                source_name: self.shards[0].file.name().to_owned(),
                index,
                len: self.len(),
            });
        }
        let (group, offset) = self.group_of(index);
        let rows = self.rows(group)?;
        self.format.example(rows[offset].clone()).map_err(|message| DataError::Example {
            at: self.locate(index),
            source: Box::new(DataError::Parquet { path: PathBuf::from(self.locate_row(index).0), message }),
        })
    }

    fn locate(&self, index: u64) -> String {
        let (file, row) = self.locate_row(index);
        format!("{file} row {row}")
    }

    fn prefetch(&self, indices: &[u64]) -> Result<Prefetched> {
        let groups: BTreeSet<usize> = indices
            .iter()
            .filter(|&&index| index < self.len())
            .map(|&index| self.group_of(index).0)
            .collect();
        let mut ranges: HashMap<usize, Vec<std::ops::Range<u64>>> = HashMap::new();
        let mut bytes = 0;
        for &group in &groups {
            let (shard, index) = self.groups[group];
            for column in self.shards[shard].reader.metadata().row_group(index).columns() {
                let (start, len) = column.byte_range();
                bytes += len;
                ranges.entry(shard).or_default().push(start..start.saturating_add(len));
            }
        }
        for (shard, ranges) in &ranges {
            self.shards[*shard].file.prefetch(ranges)?;
        }
        for &index in indices {
            self.example(index)?;
        }
        Ok(Prefetched {
            examples: indices.len() as u64,
            parts: groups.len() as u64,
            parts_total: self.groups.len() as u64,
            bytes,
            bytes_total: self.shards.iter().map(|shard| shard.file.len()).sum(),
        })
    }
}

/// A Parquet value as JSON text: records keep their fields in the schema's order (as
/// `datasets` gives them to Python); leaves as the `parquet` crate's JSON of them.
fn write_json(out: &mut String, field: &Field) {
    match field {
        Field::Group(row) => {
            out.push('{');
            for (i, (name, field)) in row.get_column_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::from(name.as_str()).to_string());
                out.push(':');
                write_json(out, field);
            }
            out.push('}');
        }
        Field::ListInternal(list) => {
            out.push('[');
            for (i, element) in list.elements().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, element);
            }
            out.push(']');
        }
        leaf => out.push_str(&leaf.to_json_value().to_string()),
    }
}

/// The columns `format` needs are there and hold what it needs; the message names the column.
fn check_schema(metadata: &ParquetMetaData, format: &RowFormat) -> std::result::Result<(), String> {
    let root = metadata.file_metadata().schema_descr().root_schema();
    let fields = root.get_fields();
    let names: Vec<&str> = fields.iter().map(|field| field.name()).collect();
    for column in format.required_columns() {
        let Some(field) = fields.iter().find(|field| field.name() == column) else {
            let mut shown = names.clone();
            shown.truncate(12);
            return Err(format!(
                "has no column `{column}` (its columns: {}); rows are {} (data.columns names the file's columns \
                 where they differ)",
                shown.join(", "),
                format.example_row()
            ));
        };
        let is_text = field.is_primitive()
            && field.get_physical_type() == PhysicalType::BYTE_ARRAY
            && (matches!(field.get_basic_info().logical_type_ref(), Some(LogicalType::String))
                || field.get_basic_info().converted_type() == ConvertedType::UTF8);
        let wants_list = matches!(format, RowFormat::Chat { messages, .. } if messages == column);
        match (wants_list, is_text, field.is_group()) {
            (false, true, _) | (true, _, true) => {}
            (false, false, _) => {
                return Err(format!(
                    "column `{column}` must hold text (a UTF-8 string column), not {}",
                    describe(field)
                ));
            }
            (true, _, false) => {
                return Err(format!(
                    "column `{column}` must be a list of {{role, content}} records (a conversation), not {}",
                    describe(field)
                ));
            }
        }
    }
    Ok(())
}

/// The rows row group `group` claims, refused when negative or above [`MAX_GROUP_ROWS`].
fn group_rows(group: usize, claimed: i64) -> std::result::Result<u64, String> {
    match u64::try_from(claimed) {
        Ok(rows) if rows <= MAX_GROUP_ROWS => Ok(rows),
        Ok(rows) => Err(format!(
            "row group {group} holds {rows} rows, more than the {MAX_GROUP_ROWS} podctl decodes at once (it reads \
             a row group whole): write the file with smaller row groups, e.g. pyarrow's \
             `pq.write_table(table, path, row_group_size=100_000)`"
        )),
        Err(_) => Err(format!("is damaged: row group {group} claims {claimed} rows")),
    }
}

/// Every column chunk lies inside the file. The `parquet` crate asserts it (a panic) when a
/// chunk is read or its range is asked for, so a damaged footer is refused here, by name.
fn check_chunks(metadata: &ParquetMetaData, file_len: u64) -> std::result::Result<(), String> {
    for (group, row_group) in metadata.row_groups().iter().enumerate() {
        for (column, chunk) in row_group.columns().iter().enumerate() {
            let start = chunk.dictionary_page_offset().unwrap_or_else(|| chunk.data_page_offset());
            let len = chunk.compressed_size();
            let inside = u64::try_from(start)
                .ok()
                .zip(u64::try_from(len).ok())
                .and_then(|(start, len)| start.checked_add(len))
                .is_some_and(|end| end <= file_len);
            if !inside {
                return Err(format!(
                    "is damaged: row group {group}, column {column} ({}) says its data is {len} bytes at \
                     offset {start}, outside the file's {file_len} bytes",
                    chunk.column_path()
                ));
            }
        }
    }
    Ok(())
}

/// Every dictionary page holds the values it claims. The decoder allocates room for the claimed
/// count before it reads one value (the fuzzer's file claimed 2.7 billion strings: a 65 GB
/// allocation that ends the process), so the claim is checked against the page's bytes: a value
/// takes at least its physical type's width there (a string its 4-byte length).
fn check_dictionaries(group: &dyn RowGroupReader) -> std::result::Result<(), String> {
    for column in 0..group.num_columns() {
        let mut pages = group.get_column_page_reader(column).map_err(|e| e.to_string())?;
        // The header says whether a dictionary comes first; a data page is not read for nothing.
        if !pages.peek_next_page().map_err(|e| e.to_string())?.is_some_and(|page| page.is_dict) {
            continue;
        }
        let Some(Page::DictionaryPage { buf, num_values, .. }) =
            pages.get_next_page().map_err(|e| e.to_string())?
        else {
            continue;
        };
        let descr = group.metadata().column(column).column_descr();
        let bits_per_value: u64 = match descr.physical_type() {
            PhysicalType::BOOLEAN => 1,
            PhysicalType::INT32 | PhysicalType::FLOAT | PhysicalType::BYTE_ARRAY => 32,
            PhysicalType::INT64 | PhysicalType::DOUBLE => 64,
            PhysicalType::INT96 => 96,
            PhysicalType::FIXED_LEN_BYTE_ARRAY => 8 * u64::try_from(descr.type_length()).unwrap_or(0).max(1),
        };
        if u64::from(num_values) * bits_per_value > buf.len() as u64 * 8 {
            return Err(format!(
                "is damaged: column {column} ({}) has a dictionary page that claims {num_values} values \
                 in {} bytes",
                descr.path(),
                buf.len()
            ));
        }
    }
    Ok(())
}

fn describe(field: &parquet::schema::types::Type) -> String {
    if field.is_group() {
        "a nested column".into()
    } else {
        format!("a {} column", field.get_physical_type())
    }
}

/// Decoded row groups, least recently used dropped first.
#[derive(Default)]
struct Decoded {
    groups: HashMap<usize, (Arc<Vec<Row>>, u64, u64)>,
    bytes: u64,
    clock: u64,
}

impl Decoded {
    fn get(&mut self, group: usize) -> Option<Arc<Vec<Row>>> {
        self.clock += 1;
        let clock = self.clock;
        self.groups.get_mut(&group).map(|(rows, _, used)| {
            *used = clock;
            Arc::clone(rows)
        })
    }

    fn insert(&mut self, group: usize, rows: Arc<Vec<Row>>, size: u64) {
        while self.bytes + size > DECODED_BYTES {
            let Some((&oldest, &(_, bytes, _))) = self.groups.iter().min_by_key(|(_, (_, _, used))| *used)
            else {
                break;
            };
            self.groups.remove(&oldest);
            self.bytes -= bytes;
        }
        self.clock += 1;
        if let Some((_, old, _)) = self.groups.insert(group, (rows, size, self.clock)) {
            self.bytes -= old;
        }
        self.bytes += size;
    }
}

/// A [`DataFile`] as the `parquet` crate reads files.
struct Chunks(Arc<dyn DataFile>);

impl Length for Chunks {
    fn len(&self) -> u64 {
        self.0.len()
    }
}

impl ChunkReader for Chunks {
    type T = ChunkRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<ChunkRead> {
        Ok(ChunkRead { file: Arc::clone(&self.0), at: start, buffer: Bytes::new() })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let end = start.saturating_add(length as u64);
        self.0.read(start..end).map_err(|error| parquet::errors::ParquetError::External(Box::new(error)))
    }
}

/// Reads a file from an offset on, [`HEADER_READ`] bytes at a time.
struct ChunkRead {
    file: Arc<dyn DataFile>,
    at: u64,
    buffer: Bytes,
}

impl std::io::Read for ChunkRead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buffer.is_empty() {
            let end = self.at.saturating_add(HEADER_READ.max(out.len() as u64)).min(self.file.len());
            if self.at >= end {
                return Ok(0);
            }
            self.buffer = self.file.read(self.at..end).map_err(std::io::Error::other)?;
            self.at = end;
        }
        let n = out.len().min(self.buffer.len());
        self.buffer.copy_to_slice(&mut out[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Arc<Vec<Row>> {
        Arc::new(Vec::new())
    }

    #[test]
    fn the_least_recently_used_group_goes_first() {
        let mut decoded = Decoded::default();
        decoded.insert(0, rows(), DECODED_BYTES / 2);
        decoded.insert(1, rows(), DECODED_BYTES / 2);
        assert!(decoded.get(0).is_some());
        decoded.insert(2, rows(), DECODED_BYTES / 2);
        assert!(decoded.get(1).is_none(), "group 1 was used least recently");
        assert!(decoded.get(0).is_some() && decoded.get(2).is_some());
        assert_eq!(decoded.bytes, DECODED_BYTES);
    }

    #[test]
    fn a_group_larger_than_the_bound_is_kept_alone() {
        let mut decoded = Decoded::default();
        decoded.insert(0, rows(), DECODED_BYTES / 4);
        decoded.insert(1, rows(), DECODED_BYTES * 3);
        assert!(decoded.get(1).is_some(), "read again for its next row, it is not decoded again");
        assert!(decoded.get(0).is_none());
        assert_eq!(decoded.bytes, DECODED_BYTES * 3);
        decoded.insert(2, rows(), 1);
        assert!(decoded.get(1).is_none() && decoded.get(2).is_some());
        assert_eq!(decoded.bytes, 1);
    }
}
