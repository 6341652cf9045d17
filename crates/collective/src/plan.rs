//! The ring schedule as pure arithmetic: how a buffer splits into segments and chunks, which
//! segment each logical rank sends and receives at each step, and where a chunk goes next.
//!
//! A buffer of `len` elements reduced over `d` logical ranks is cut into `d` balanced segments
//! (the first `len % d` are one element longer). The ring runs `2 (d - 1)` steps: steps
//! `0 ..= d - 2` are the reduce-scatter, where rank `r` sends segment `(r - t) mod d` and adds
//! the incoming segment `(r - 1 - t) mod d` into its own copy; steps `d - 1 ..= 2d - 3` are the
//! all-gather, where the same segment pattern carries finished sums and the receiver copies.
//! So segment `j` is summed as `((x_j + x_{j+1}) + x_{j+2}) + ... + x_{j-1}` (ranks mod `d`),
//! a function of `(d, len)` alone: chunking only splits the work, it never changes an addition.
//!
//! Each segment is cut into chunks of at most `chunk_elems` elements; a chunk is the unit that
//! travels and that a sender may forward as soon as it has been received, which is what
//! pipelines the steps.

use std::ops::Range;

/// What a receiver does with an incoming chunk at a given step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvKind {
    /// Reduce-scatter: `local = incoming + local`.
    Add,
    /// All-gather: `local = incoming`.
    Copy,
}

/// Where a chunk of a rank's buffer goes after one of its operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// To the rank's sender, to be sent at this step.
    Send(u32),
    /// To the rank's receiver, to be overwritten or added into at this step.
    Recv(u32),
    /// Finished: this chunk of the rank's buffer holds the final sum.
    Done,
}

/// Number of ring steps for `d` logical ranks.
pub(crate) fn steps(d: usize) -> u32 {
    2 * (d as u32).saturating_sub(1)
}

/// The segment rank `rank` sends at `step`.
pub(crate) fn send_segment(rank: usize, d: usize, step: u32) -> usize {
    (rank + d - (step as usize % d)) % d
}

/// The segment rank `rank` receives at `step`.
pub(crate) fn recv_segment(rank: usize, d: usize, step: u32) -> usize {
    (rank + 2 * d - 1 - (step as usize % d)) % d
}

/// Whether a receive at `step` adds (reduce-scatter) or copies (all-gather).
pub(crate) fn recv_kind(d: usize, step: u32) -> RecvKind {
    if (step as usize) < d - 1 { RecvKind::Add } else { RecvKind::Copy }
}

/// Where a chunk goes after it was received at `step`: the received segment is the one sent at
/// the next step, until the last step.
pub(crate) fn after_recv(d: usize, step: u32) -> Next {
    if step + 1 < steps(d) { Next::Send(step + 1) } else { Next::Done }
}

/// Where a chunk goes after it was sent at `step`: a segment sent during the reduce-scatter comes
/// back, summed, `d - 1` steps later; one sent during the all-gather is final.
pub(crate) fn after_send(d: usize, step: u32) -> Next {
    if (step as usize) + 1 < d { Next::Recv(step + d as u32 - 1) } else { Next::Done }
}

/// The first operation on segment `segment` of rank `rank`'s buffer: the rank's own segment is
/// sent at step 0, every other one is first added into.
pub(crate) fn first_op(rank: usize, d: usize, segment: usize) -> Next {
    if segment == rank { Next::Send(0) } else { Next::Recv(((rank + d - 1 - segment) % d) as u32) }
}

/// Elements of segment `j` of a `len`-element buffer split over `d` ranks.
pub(crate) fn segment(len: usize, d: usize, j: usize) -> Range<usize> {
    let base = len / d;
    let extra = len % d;
    let start = j * base + j.min(extra);
    start..start + base + usize::from(j < extra)
}

/// How one bucket is cut: `d` segments, each into chunks of at most `chunk_elems` elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Elements in the buffer.
    pub len: usize,
    /// Logical ranks.
    pub d: usize,
    /// Largest chunk, in elements (at least 1).
    pub chunk_elems: usize,
}

impl Layout {
    /// A layout; `chunk_elems` is clamped to at least one element.
    pub fn new(len: usize, d: usize, chunk_elems: usize) -> Layout {
        Layout { len, d, chunk_elems: chunk_elems.max(1) }
    }

    /// Number of chunks of segment `j`.
    pub fn chunks(&self, j: usize) -> usize {
        segment(self.len, self.d, j).len().div_ceil(self.chunk_elems)
    }

    /// Elements of chunk `c` of segment `j`.
    pub fn chunk(&self, j: usize, c: usize) -> Range<usize> {
        let seg = segment(self.len, self.d, j);
        let start = seg.start + c * self.chunk_elems;
        start..(start + self.chunk_elems).min(seg.end)
    }

    /// Every chunk in buffer order, as `(segment, chunk, elements)`; the chunks tile the buffer.
    pub fn pieces(&self) -> impl Iterator<Item = (usize, usize, Range<usize>)> + '_ {
        (0..self.d).flat_map(move |j| (0..self.chunks(j)).map(move |c| (j, c, self.chunk(j, c))))
    }

    /// Total number of chunks.
    pub fn piece_count(&self) -> usize {
        (0..self.d).map(|j| self.chunks(j)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_tile_the_buffer_and_differ_by_at_most_one() {
        for len in [0, 1, 2, 3, 7, 8, 100, 1001] {
            for d in 1..=9 {
                let mut next = 0;
                for j in 0..d {
                    let s = segment(len, d, j);
                    assert_eq!(s.start, next, "len {len} d {d} segment {j}");
                    assert!(s.len() == len / d || s.len() == len / d + 1);
                    next = s.end;
                }
                assert_eq!(next, len);
            }
        }
        assert_eq!(segment(10, 4, 0), 0..3);
        assert_eq!(segment(10, 4, 1), 3..6);
        assert_eq!(segment(10, 4, 2), 6..8);
        assert_eq!(segment(10, 4, 3), 8..10);
    }

    #[test]
    fn chunks_tile_each_segment() {
        let layout = Layout::new(1003, 3, 100);
        let pieces: Vec<_> = layout.pieces().collect();
        assert_eq!(pieces.len(), layout.piece_count());
        assert_eq!(layout.piece_count(), 4 + 4 + 4);
        let mut next = 0;
        for (j, c, r) in &pieces {
            assert_eq!(r.start, next);
            assert!(r.len() <= 100 && !r.is_empty(), "segment {j} chunk {c}: {r:?}");
            next = r.end;
        }
        assert_eq!(next, 1003);
        assert_eq!(layout.chunk(0, 3), 300..335);
        assert_eq!(Layout::new(2, 4, 8).piece_count(), 2, "empty segments have no chunks");
        assert_eq!(Layout::new(5, 2, 0).chunk_elems, 1);
    }

    /// Walks one segment around the ring with the schedule functions and checks the documented
    /// order: it starts at rank j and visits j+1, ..., j-1, adding, then is copied to everyone.
    #[test]
    fn each_segment_is_summed_in_ring_order_from_its_own_rank() {
        for d in 2..=6 {
            for j in 0..d {
                let mut holders = vec![j];
                for t in 0..steps(d) {
                    let sender = (0..d).find(|&r| send_segment(r, d, t) == j).unwrap();
                    let receiver = (sender + 1) % d;
                    assert_eq!(recv_segment(receiver, d, t), j);
                    if recv_kind(d, t) == RecvKind::Add {
                        holders.push(receiver);
                    }
                }
                let expected: Vec<usize> = (0..d).map(|k| (j + k) % d).collect();
                assert_eq!(holders, expected, "d {d} segment {j}");
            }
        }
    }

    /// Every chunk of every rank alternates between receiver and sender, each operation at the
    /// step the schedule gives, and ends exactly once.
    #[test]
    fn chunk_ownership_alternates_and_ends() {
        for d in 2..=6 {
            for r in 0..d {
                for j in 0..d {
                    let mut ops = Vec::new();
                    let mut next = first_op(r, d, j);
                    loop {
                        match next {
                            Next::Send(t) => {
                                assert_eq!(send_segment(r, d, t), j);
                                ops.push(('s', t));
                                next = after_send(d, t);
                            }
                            Next::Recv(t) => {
                                assert_eq!(recv_segment(r, d, t), j);
                                ops.push(('r', t));
                                next = after_recv(d, t);
                            }
                            Next::Done => break,
                        }
                    }
                    assert!(ops.windows(2).all(|w| w[0].0 != w[1].0 && w[0].1 < w[1].1), "{ops:?}");
                    let sends = (0..steps(d)).filter(|&t| send_segment(r, d, t) == j).count();
                    let recvs = (0..steps(d)).filter(|&t| recv_segment(r, d, t) == j).count();
                    assert_eq!(ops.iter().filter(|o| o.0 == 's').count(), sends);
                    assert_eq!(ops.iter().filter(|o| o.0 == 'r').count(), recvs);
                }
            }
        }
    }

    #[test]
    fn one_rank_has_no_steps() {
        assert_eq!(steps(1), 0);
        assert_eq!(steps(2), 2);
        assert_eq!(steps(4), 6);
    }
}
