//! Byte layouts on the wire: the handshake that opens a ring link, the header of every frame on
//! it, and the payload of an abort frame. All integers are little-endian; every variable-length
//! field has a bound that is checked before anything is allocated.

use crate::spec::{MAX_JOB_LEN, MAX_RANKS};
use std::io::{self, Read, Write};

/// First bytes of every handshake, so a stray client is told apart at once.
const MAGIC: &[u8; 8] = b"PODCTLAR";
/// Bumped on any change of these layouts.
pub(crate) const PROTOCOL_VERSION: u16 = 1;
/// Longest refusal reason or abort text, in bytes.
const MAX_TEXT: usize = 4096;

/// Size of a [`FrameHeader`] on the wire.
pub(crate) const HEADER_LEN: usize = 24;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// One chunk of a bucket.
    Data = 1,
    /// The sender's group failed; the payload is an encoded [`Cause`].
    Abort = 2,
}

/// The header before every frame's payload. A data frame names exactly which chunk it is, so a
/// receiver detects members that disagree on a round's buckets instead of summing garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// Data or abort.
    pub kind: FrameKind,
    /// Ring step (data frames).
    pub step: u16,
    /// Bucket index in the round (data frames).
    pub bucket: u32,
    /// Round number since the group formed (data frames).
    pub round: u64,
    /// Chunk index within the segment (data frames).
    pub chunk: u32,
    /// Payload bytes.
    pub len: u32,
}

impl FrameHeader {
    /// The header of a data frame.
    pub fn data(round: u64, bucket: u32, step: u16, chunk: u32, len: u32) -> FrameHeader {
        FrameHeader { kind: FrameKind::Data, step, bucket, round, chunk, len }
    }

    /// Serializes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[2..4].copy_from_slice(&self.step.to_le_bytes());
        b[4..8].copy_from_slice(&self.bucket.to_le_bytes());
        b[8..16].copy_from_slice(&self.round.to_le_bytes());
        b[16..20].copy_from_slice(&self.chunk.to_le_bytes());
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; `None` for an unknown kind.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Option<FrameHeader> {
        let kind = match b[0] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            _ => return None,
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(FrameHeader {
            kind,
            step: u16::from_le_bytes([b[2], b[3]]),
            bucket: u32_at(4),
            round: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
            chunk: u32_at(16),
            len: u32_at(20),
        })
    }
}

/// Why a member's group failed, as relayed to the next member in an abort frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// `rank` on `member` is gone (its connection closed or reset).
    Lost { rank: u32, member: u32, detail: String },
    /// `rank` on `member` aborted the group.
    Aborted { rank: u32, member: u32, detail: String },
    /// `rank` on `member` failed with `detail`.
    Failed { rank: u32, member: u32, detail: String },
}

impl Cause {
    /// Serializes the cause; the text is cut to [`MAX_TEXT`] bytes.
    pub fn encode(&self) -> Vec<u8> {
        let (code, rank, member, detail) = match self {
            Cause::Lost { rank, member, detail } => (1u8, rank, member, detail),
            Cause::Aborted { rank, member, detail } => (2, rank, member, detail),
            Cause::Failed { rank, member, detail } => (3, rank, member, detail),
        };
        let mut b = vec![code];
        b.extend_from_slice(&rank.to_le_bytes());
        b.extend_from_slice(&member.to_le_bytes());
        b.extend_from_slice(truncate(detail, MAX_TEXT).as_bytes());
        b
    }

    /// Parses a cause; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<Cause> {
        if b.len() < 9 || b.len() > 9 + MAX_TEXT {
            return None;
        }
        let rank = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
        let member = u32::from_le_bytes([b[5], b[6], b[7], b[8]]);
        let detail = String::from_utf8_lossy(&b[9..]).into_owned();
        match b[0] {
            1 => Some(Cause::Lost { rank, member, detail }),
            2 => Some(Cause::Aborted { rank, member, detail }),
            3 => Some(Cause::Failed { rank, member, detail }),
            _ => None,
        }
    }

    /// Longest encoded cause.
    pub const MAX_LEN: usize = 9 + MAX_TEXT;
}

/// The connector's half of the handshake: who it is and which group it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Protocol version.
    pub version: u16,
    /// Job name.
    pub job: String,
    /// Generation.
    pub generation: u64,
    /// Configured chunk size, which both ends must share.
    pub chunk_bytes: u32,
    /// The placement (logical rank -> member).
    pub placement: Vec<u32>,
    /// The sending rank of this link.
    pub from_rank: u32,
    /// The receiving rank of this link.
    pub to_rank: u32,
}

impl Hello {
    /// Writes the hello.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut b = Vec::with_capacity(40 + self.job.len() + 4 * self.placement.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.job.len() as u16).to_le_bytes());
        b.extend_from_slice(self.job.as_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.chunk_bytes.to_le_bytes());
        b.extend_from_slice(&(self.placement.len() as u32).to_le_bytes());
        for m in &self.placement {
            b.extend_from_slice(&m.to_le_bytes());
        }
        b.extend_from_slice(&self.from_rank.to_le_bytes());
        b.extend_from_slice(&self.to_rank.to_le_bytes());
        w.write_all(&b)
    }

    /// Reads a hello; an error of kind `InvalidData` says what was malformed.
    pub fn read_from(r: &mut impl Read) -> io::Result<Hello> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(invalid("not a podctl collective handshake (bad magic)".into()));
        }
        let version = read_u16(r)?;
        let job_len = read_u16(r)? as usize;
        if job_len > MAX_JOB_LEN {
            return Err(invalid(format!("job name of {job_len} bytes exceeds {MAX_JOB_LEN}")));
        }
        let mut job = vec![0u8; job_len];
        r.read_exact(&mut job)?;
        let job = String::from_utf8(job).map_err(|_| invalid("job name is not UTF-8".into()))?;
        let generation = read_u64(r)?;
        let chunk_bytes = read_u32(r)?;
        let ranks = read_u32(r)? as usize;
        if ranks > MAX_RANKS {
            return Err(invalid(format!("{ranks} ranks exceeds {MAX_RANKS}")));
        }
        let placement = (0..ranks).map(|_| read_u32(r)).collect::<io::Result<Vec<u32>>>()?;
        let from_rank = read_u32(r)?;
        let to_rank = read_u32(r)?;
        Ok(Hello { version, job, generation, chunk_bytes, placement, from_rank, to_rank })
    }
}

/// The acceptor's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Joined.
    Accept,
    /// The connector is from an older generation than the acceptor's (carried).
    Stale(u64),
    /// The connector is from a newer generation than the acceptor's (carried); the acceptor is
    /// the stale one and will come back at the new generation, so the connector retries.
    Behind(u64),
    /// Any other mismatch, with the reason.
    Mismatch(String),
}

impl Reply {
    /// Writes the reply.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let (code, generation, reason) = match self {
            Reply::Accept => (0u8, 0, ""),
            Reply::Stale(g) => (1, *g, ""),
            Reply::Behind(g) => (2, *g, ""),
            Reply::Mismatch(reason) => (3, 0, truncate(reason, MAX_TEXT)),
        };
        let mut b = vec![code];
        b.extend_from_slice(&generation.to_le_bytes());
        b.extend_from_slice(&(reason.len() as u16).to_le_bytes());
        b.extend_from_slice(reason.as_bytes());
        w.write_all(&b)
    }

    /// Reads a reply.
    pub fn read_from(r: &mut impl Read) -> io::Result<Reply> {
        let mut code = [0u8; 1];
        r.read_exact(&mut code)?;
        let generation = read_u64(r)?;
        let len = read_u16(r)? as usize;
        if len > MAX_TEXT {
            return Err(invalid(format!("refusal reason of {len} bytes exceeds {MAX_TEXT}")));
        }
        let mut reason = vec![0u8; len];
        r.read_exact(&mut reason)?;
        match code[0] {
            0 => Ok(Reply::Accept),
            1 => Ok(Reply::Stale(generation)),
            2 => Ok(Reply::Behind(generation)),
            3 => Ok(Reply::Mismatch(String::from_utf8_lossy(&reason).into_owned())),
            other => Err(invalid(format!("unknown handshake reply code {other}"))),
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_le_bytes(b))
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader::data(7, 3, 5, 11, 4096);
        assert_eq!(FrameHeader::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] = 9;
        assert_eq!(FrameHeader::decode(&bad), None);
    }

    #[test]
    fn hello_and_reply_round_trip() {
        let hello = Hello {
            version: PROTOCOL_VERSION,
            job: "sft-qwen3".into(),
            generation: 42,
            chunk_bytes: 1 << 20,
            placement: vec![0, 1, 0, 1],
            from_rank: 3,
            to_rank: 0,
        };
        let mut b = Vec::new();
        hello.write_to(&mut b).unwrap();
        assert_eq!(Hello::read_from(&mut b.as_slice()).unwrap(), hello);
        for reply in
            [Reply::Accept, Reply::Stale(9), Reply::Behind(10), Reply::Mismatch("job differs".into())]
        {
            let mut b = Vec::new();
            reply.write_to(&mut b).unwrap();
            assert_eq!(Reply::read_from(&mut b.as_slice()).unwrap(), reply);
        }
    }

    #[test]
    fn malformed_hello_is_refused_before_allocating() {
        let err = Hello::read_from(&mut &b"GET / HTTP/1.1\r\n\r\n"[..]).unwrap_err();
        assert!(err.to_string().contains("bad magic"));
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b.extend_from_slice(&u16::MAX.to_le_bytes());
        let err = Hello::read_from(&mut b.as_slice()).unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
    }

    #[test]
    fn cause_round_trips_and_truncates() {
        let c = Cause::Lost { rank: 2, member: 1, detail: "connection reset".into() };
        assert_eq!(Cause::decode(&c.encode()), Some(c));
        let long = Cause::Failed { rank: 0, member: 0, detail: "é".repeat(5000) };
        let encoded = long.encode();
        assert!(encoded.len() <= Cause::MAX_LEN);
        assert!(matches!(Cause::decode(&encoded), Some(Cause::Failed { .. })));
        assert_eq!(Cause::decode(&[7, 0, 0, 0, 0, 0, 0, 0, 0]), None);
    }
}
