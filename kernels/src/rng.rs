//! Counter-based random numbers shared by the host and the device.
//!
//! The CUDA kernels in `cuda/mlp.cu` implement exactly these functions (`pk_hash`,
//! `pk_mix`, `pk_unit`), so a value drawn on the device equals the value drawn on the
//! host for the same `(seed, tag, counter)`.

/// Stream tag of the synthetic labels.
pub const TAG_LABEL: u32 = 1;
/// Stream tag of the class prototypes.
pub const TAG_PROTO: u32 = 2;
/// Stream tag of the per-sample noise.
pub const TAG_NOISE: u32 = 3;
/// First stream tag used for parameter initialisation (one tag per tensor).
pub const TAG_PARAM_BASE: u32 = 16;

/// A 32-bit integer hash with good avalanche behaviour.
#[inline]
#[must_use]
pub fn hash(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Hash of `(seed, tag, counter)`.
#[inline]
#[must_use]
pub fn mix(seed: u32, tag: u32, counter: u64) -> u32 {
    let mut h = hash(seed ^ 0x9e37_79b9);
    h = hash(h ^ tag);
    h = hash(h ^ (counter & 0xffff_ffff) as u32);
    hash(h ^ (counter >> 32) as u32)
}

/// Uniform in `[0, 1)` from the top 24 bits of `h` (exact in `f32`).
#[inline]
#[must_use]
pub fn unit(h: u32) -> f32 {
    (h >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_stays_in_half_open_interval() {
        assert_eq!(unit(0), 0.0);
        assert!(unit(u32::MAX) < 1.0);
        assert!(unit(u32::MAX) > 0.999_999);
    }

    #[test]
    fn mix_depends_on_every_input() {
        let base = mix(7, 1, 42);
        assert_ne!(base, mix(8, 1, 42));
        assert_ne!(base, mix(7, 2, 42));
        assert_ne!(base, mix(7, 1, 43));
        assert_ne!(base, mix(7, 1, 42 + (1 << 32)));
        assert_eq!(base, mix(7, 1, 42));
    }

    #[test]
    fn unit_is_roughly_uniform() {
        let n = 100_000u64;
        let mean: f64 = (0..n).map(|i| f64::from(unit(mix(1, 3, i)))).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
