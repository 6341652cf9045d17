//! Element-wise sums on little-endian byte buffers, with one fixed rounding rule per type.
//!
//! Every add computes `local = incoming + local`, element by element, never reassociated, so a
//! vectorized loop gives the same bits as a scalar one.
//!
//! - f32: one IEEE-754 single-precision add.
//! - bf16: both operands are widened to f32 (exact), added in f32, and the sum is rounded back to
//!   bf16 to nearest, ties to even; a NaN stays a (quiet) NaN with its sign and top payload bits.
//!   The partial sum travels between ranks as bf16, so it is rounded after every add.

/// Element types the ring can sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Elem {
    /// IEEE single precision.
    F32,
    /// Brain float.
    Bf16,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::Bf16 => 2,
        }
    }

    /// `local = incoming + local` element-wise. Both slices hold whole elements, equally many.
    pub fn add_into(self, local: &mut [u8], incoming: &[u8]) {
        match self {
            Elem::F32 => add_f32(local, incoming),
            Elem::Bf16 => add_bf16(local, incoming),
        }
    }
}

fn add_f32(local: &mut [u8], incoming: &[u8]) {
    let (local, _) = local.as_chunks_mut::<4>();
    let (incoming, _) = incoming.as_chunks::<4>();
    for (l, i) in local.iter_mut().zip(incoming) {
        *l = (f32::from_le_bytes(*i) + f32::from_le_bytes(*l)).to_le_bytes();
    }
}

fn add_bf16(local: &mut [u8], incoming: &[u8]) {
    let (local, _) = local.as_chunks_mut::<2>();
    let (incoming, _) = incoming.as_chunks::<2>();
    for (l, i) in local.iter_mut().zip(incoming) {
        let sum = bf16_to_f32(u16::from_le_bytes(*i)) + bf16_to_f32(u16::from_le_bytes(*l));
        *l = f32_to_bf16(sum).to_le_bytes();
    }
}

/// Widens bf16 bits to f32 (exact).
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Rounds f32 to bf16 bits: to nearest, ties to even; NaN is kept quiet. Written without
/// branches so the add loop vectorizes.
pub(crate) fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    let round_bias = 0x7fff + ((bits >> 16) & 1);
    let rounded = (bits.wrapping_add(round_bias) >> 16) as u16;
    let quiet_nan = ((bits >> 16) as u16) | 0x0040;
    if value.is_nan() { quiet_nan } else { rounded }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and its successor (mantissa LSB 0): even.
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        // The successor of 1.0 plus half an ulp ties upward to the even 0x3f82.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        // Just above halfway rounds up, just below rounds down.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_7fff)), 0x3f80);
        // Overflow to infinity, negative values symmetric.
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16(-1.0 - 2f32.powi(-8)), 0xbf80);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_nan_stays_nan() {
        // A NaN whose payload lives only in the low 16 bits would round to infinity if treated as
        // a number.
        let low_payload_nan = f32::from_bits(0x7f80_0001);
        assert!(bf16_to_f32(f32_to_bf16(low_payload_nan)).is_nan());
        assert!(bf16_to_f32(f32_to_bf16(-f32::NAN)).is_sign_negative());
    }

    #[test]
    fn bf16_rounding_agrees_with_the_half_crate() {
        // A deterministic sweep over exponents and mantissas, including every tie pattern.
        let mut x: u32 = 0x1234_5678;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let bits = if i % 4 == 0 { (x & 0xffff_0000) | 0x8000 } else { x };
            let value = f32::from_bits(bits);
            if value.is_nan() {
                continue;
            }
            assert_eq!(f32_to_bf16(value), bf16::from_f32(value).to_bits(), "bits {bits:#010x}");
        }
    }

    #[test]
    fn f32_add_is_incoming_plus_local() {
        let mut local: Vec<u8> = [1.0f32, -2.5, 1e30].iter().flat_map(|v| v.to_le_bytes()).collect();
        let incoming: Vec<u8> = [0.5f32, 2.5, 1e30].iter().flat_map(|v| v.to_le_bytes()).collect();
        Elem::F32.add_into(&mut local, &incoming);
        let sums: Vec<f32> =
            local.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(sums, vec![1.5, 0.0, 2e30]);
    }

    #[test]
    fn bf16_add_rounds_each_sum() {
        let one = bf16::from_f32(1.0).to_bits();
        let tiny = bf16::from_f32(2f32.powi(-9)).to_bits();
        let mut local = one.to_le_bytes().to_vec();
        Elem::Bf16.add_into(&mut local, &tiny.to_le_bytes());
        // 1 + 2^-9 is below half an ulp of bf16 at 1.0, so the sum rounds back to 1.
        assert_eq!(u16::from_le_bytes([local[0], local[1]]), one);
        let three_quarters_ulp = bf16::from_f32(3.0 * 2f32.powi(-9)).to_bits();
        Elem::Bf16.add_into(&mut local, &three_quarters_ulp.to_le_bytes());
        assert_eq!(bf16::from_bits(u16::from_le_bytes([local[0], local[1]])).to_f32(), 1.0 + 2f32.powi(-7));
    }
}
