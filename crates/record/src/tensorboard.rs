//! TensorBoard event files, written from Rust: every numeric field of a `metrics.jsonl` line
//! becomes a scalar of the same name at the line's `step`, so `tensorboard --logdir runs/` shows
//! the loss, the learning rate, GRPO's reward and each reward function's share, the held-out
//! accuracy, the phases of a step, ...; and `wandb sync` uploads the run directory as it is.
//!
//! The file is TensorFlow's record format: each record is its length (u64, little-endian), the
//! length's masked CRC32C, the bytes, and their masked CRC32C; the first record's event carries
//! `file_version: "brain.Event:2"`, every other one a `Summary` of scalars. The two messages are
//! declared here with prost's derive, from `tensorboard/compat/proto/{event,summary}.proto`
//! (only the fields written). Values are `simple_value` (float32), the encoding every reader
//! takes (TensorBoard, `EventAccumulator`, W&B): a metric is rounded to float32 there, as
//! `torch.utils.tensorboard` rounds it. No maintained crate writes the format (tensorboard-rs was
//! last released in 2022, on protobuf 2), and what is needed is fifty lines.

use prost::Message;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// `tensorflow.Event`.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

/// `tensorflow.Summary.Value` with its `simple_value` member of the `value` oneof (present even
/// when 0, as a oneof member is).
#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// TensorFlow's masked CRC32C of a record's length and of its bytes.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record, framed.
fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&length);
    record.extend_from_slice(&masked_crc(&length).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc(data).to_le_bytes());
    record
}

/// An open event file.
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

/// The prefix TensorBoard looks for, and podctl's suffix (so a new record replaces only its own).
const PREFIX: &str = "events.out.tfevents.";
const SUFFIX: &str = ".podctl";

impl EventWriter {
    /// Starts `events.out.tfevents.<unix seconds>.<host>.<pid>.podctl` in `dir`, replacing the
    /// event files of an earlier record there (as `metrics.jsonl` is started afresh).
    pub fn create(dir: &Path, unix: f64) -> std::io::Result<Self> {
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
                std::fs::remove_file(entry.path())?;
            }
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().replace(['/', '\\'], "_"))
            .unwrap_or_else(|_| "localhost".into());
        let path = dir.join(format!("{PREFIX}{}.{host}.{}{SUFFIX}", unix as u64, std::process::id()));
        let mut writer = Self { file: BufWriter::new(File::create(&path)?), path };
        writer.write(&Event {
            wall_time: unix,
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        })?;
        Ok(writer)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `scalars` at `step` and flushes (a crash or `tensorboard` reading along sees it).
    pub fn scalars<'a>(
        &mut self,
        step: u64,
        unix: f64,
        scalars: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> std::io::Result<()> {
        let value: Vec<Value> = scalars
            .into_iter()
            .map(|(tag, v)| Value { tag: tag.to_string(), simple_value: Some(v as f32) })
            .collect();
        if value.is_empty() {
            return Ok(());
        }
        self.write(&Event {
            wall_time: unix,
            step: step as i64,
            what: Some(What::Summary(Summary { value })),
        })
    }

    fn write(&mut self, event: &Event) -> std::io::Result<()> {
        self.file.write_all(&frame(&event.encode_to_vec()))?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the records back, checking both CRCs of each.
    fn read(path: &Path) -> Vec<Event> {
        let bytes = std::fs::read(path).unwrap();
        let mut events = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let length = &bytes[at..at + 8];
            assert_eq!(masked_crc(length).to_le_bytes(), bytes[at + 8..at + 12]);
            let n = u64::from_le_bytes(length.try_into().unwrap()) as usize;
            let data = &bytes[at + 12..at + 12 + n];
            assert_eq!(masked_crc(data).to_le_bytes(), bytes[at + 12 + n..at + 16 + n]);
            events.push(Event::decode(data).unwrap());
            at += 16 + n;
        }
        events
    }

    #[test]
    fn the_masked_crc_is_tensorflow_s() {
        // TensorFlow's crc32c_test: CRC32C("123456789") is 0xe3069283; masking rotates right by
        // 15 bits and adds 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
        assert_eq!(masked_crc(b""), 0u32.wrapping_add(0xa282_ead8));
    }

    #[test]
    fn records_hold_a_version_then_the_scalars_and_replace_an_earlier_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = EventWriter::create(dir.path(), 1.0).unwrap();
        first.scalars(1, 2.0, [("loss", 2.5)]).unwrap();
        let first = first.path().to_path_buf();
        std::fs::write(dir.path().join("events.out.tfevents.1.other"), b"not ours").unwrap();
        let mut writer = EventWriter::create(dir.path(), 1_700_000_000.5).unwrap();
        assert!(!first.exists() || first == writer.path(), "the earlier record's file is gone");
        assert!(dir.path().join("events.out.tfevents.1.other").exists(), "another writer's file stays");
        writer.scalars(3, 1_700_000_001.0, [("loss", 2.5), ("reward", 0.0)]).unwrap();
        writer.scalars(4, 1_700_000_002.0, []).unwrap();
        let events = read(writer.path());
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].what, Some(What::FileVersion("brain.Event:2".into())));
        assert_eq!(events[1].step, 3);
        let Some(What::Summary(summary)) = &events[1].what else { panic!("{:?}", events[1]) };
        let values: Vec<(&str, Option<f32>)> =
            summary.value.iter().map(|v| (v.tag.as_str(), v.simple_value)).collect();
        assert_eq!(values, [("loss", Some(2.5)), ("reward", Some(0.0))]);
    }
}
