//! Data that proves a copy happened: a seeded pseudo-random fill that differs
//! per run, a poison value written into destinations first, and a comparison
//! that names the first wrong word. All of it runs outside timed regions,
//! spread over the host's cores.

use crate::error::{LabError, Result};
use rayon::prelude::*;

/// What a destination holds before a copy writes it.
pub const POISON: u64 = 0xDEAD_BEEF_DEAD_BEEF;
const CHUNK: usize = 1 << 16;

/// splitmix64: a cheap, well-mixed word for index `i` under `seed`.
pub fn word(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let w = z ^ (z >> 31);
    if w == POISON {
        !w
    } else {
        w
    }
}

/// A fresh seed for each run, so no stale result can pass for a new one.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// Where written words end up: in the CPU's caches (ordinary stores) or
/// straight in DRAM (non-temporal stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Cached,
    /// Bypasses the caches, so a DMA that follows does not have to snoop
    /// freshly written (dirty) lines out of CPU caches. The labs write their
    /// inputs this way so they measure the link, not the cache.
    Streaming,
}

fn write_words(words: &mut [u64], store: Store, f: impl Fn(u64) -> u64 + Sync) {
    words.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let base = (c * CHUNK) as u64;
        match store {
            #[cfg(target_arch = "x86_64")]
            Store::Streaming => {
                use std::arch::x86_64::{_mm_sfence, _mm_stream_si64};
                for (j, w) in chunk.iter_mut().enumerate() {
                    // SAFETY: w is a valid, aligned u64 we hold exclusively; SSE2 is baseline on x86_64.
                    unsafe { _mm_stream_si64(w as *mut u64 as *mut i64, f(base + j as u64) as i64) };
                }
                // SAFETY: orders the streaming stores before anything that follows.
                unsafe { _mm_sfence() };
            }
            _ => {
                for (j, w) in chunk.iter_mut().enumerate() {
                    *w = f(base + j as u64);
                }
            }
        }
    });
}

/// Fills with the pattern for `seed`, bypassing CPU caches.
pub fn fill(words: &mut [u64], seed: u64) {
    fill_with(words, seed, Store::Streaming)
}

pub fn fill_with(words: &mut [u64], seed: u64, store: Store) {
    write_words(words, store, |i| word(seed, i))
}

/// Writes the poison everywhere, bypassing CPU caches.
pub fn poison(words: &mut [u64]) {
    write_words(words, Store::Streaming, |_| POISON)
}

/// Checks `words` against the fill for `seed`; the error names the first bad
/// word and whether it still holds the poison (never written).
pub fn verify(words: &[u64], seed: u64, what: &str) -> Result<()> {
    let bad = words.par_chunks(CHUNK).enumerate().find_map_first(|(c, chunk)| {
        let base = c * CHUNK;
        chunk.iter().enumerate().find_map(|(j, &got)| {
            let i = base + j;
            let want = word(seed, i as u64);
            (got != want).then_some((i, want, got))
        })
    });
    match bad {
        None => Ok(()),
        Some((i, want, got)) => Err(LabError::wrong_data(
            what,
            i,
            format!("64-bit word at byte {} is {got:#018x}, expected {want:#018x}{}", i * 8, if got == POISON { " (still poison: never written)" } else { "" }),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_round_trips() {
        let mut v = vec![0u64; 3 * CHUNK + 17];
        fill(&mut v, 42);
        verify(&v, 42, "roundtrip").unwrap();
        assert!(verify(&v, 43, "other seed").is_err(), "a different seed must not verify");
    }

    #[test]
    fn verify_names_first_bad_word_and_poison() {
        let mut v = vec![0u64; 2 * CHUNK];
        fill(&mut v, 7);
        v[CHUNK + 5] = POISON;
        let e = verify(&v, 7, "h2d 1 MiB").unwrap_err();
        assert!(matches!(e, LabError::Verification { element, .. } if element == CHUNK + 5), "{e}");
        let e = e.to_string();
        assert!(e.starts_with(&format!("data verification failed: h2d 1 MiB, element {}: 64-bit word at byte {}", CHUNK + 5, 8 * (CHUNK + 5))), "{e}");
        assert!(e.contains("never written"), "{e}");
        poison(&mut v);
        assert!(v.iter().all(|&w| w == POISON));
        assert!(verify(&v, 7, "poisoned").unwrap_err().to_string().contains("element 0: 64-bit word at byte 0 "));
    }

    #[test]
    fn streaming_copy_copies_any_alignment() {
        let src: Vec<u64> = (0..CHUNK as u64 * 2 + 5).collect();
        for off in [0usize, 1] {
            let mut dst = vec![0u64; src.len() + 1];
            copy_streaming(&mut dst[off..off + src.len()], &src);
            assert_eq!(&dst[off..off + src.len()], &src[..]);
        }
    }

    #[test]
    fn cached_and_streaming_fills_agree() {
        let mut a = vec![0u64; CHUNK + 3];
        let mut b = vec![1u64; CHUNK + 3];
        fill_with(&mut a, 9, Store::Cached);
        fill_with(&mut b, 9, Store::Streaming);
        assert_eq!(a, b);
    }

    #[test]
    fn seeds_differ_and_words_never_equal_poison() {
        assert_ne!(fresh_seed(), fresh_seed());
        assert!((0..100_000u64).all(|i| word(1, i) != POISON));
    }
}

/// Views 64-bit words as f32 (two per word).
pub fn as_f32(words: &[u64]) -> &[f32] {
    // SAFETY: u64 alignment exceeds f32's; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const f32, words.len() * 2) }
}

/// Mutable f32 view of 64-bit words.
pub fn as_f32_mut(words: &mut [u64]) -> &mut [f32] {
    // SAFETY: as above, exclusive.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut f32, words.len() * 2) }
}

/// An f32 in [-1, 1) from 24 random bits.
fn unit_f32(bits: u32) -> f32 {
    (bits >> 8) as f32 / (1u32 << 23) as f32 - 1.0
}

/// Fills with random f32 in [-1, 1) for `seed`, bypassing caches; element
/// `i` is [`f32_at`]`(seed, i)`.
pub fn fill_f32(words: &mut [u64], seed: u64) {
    write_words(words, Store::Streaming, |i| {
        let [lo, hi] = f32_pair_at(seed, i as usize);
        (lo.to_bits() as u64) | ((hi.to_bits() as u64) << 32)
    })
}

/// Elements `2w` and `2w + 1` of [`fill_f32`]'s output (one word's hash).
pub fn f32_pair_at(seed: u64, w: usize) -> [f32; 2] {
    let w = word(seed, w as u64);
    [unit_f32(w as u32), unit_f32((w >> 32) as u32)]
}

/// Element `i` of [`fill_f32`]'s output, computed alone.
pub fn f32_at(seed: u64, i: usize) -> f32 {
    f32_pair_at(seed, i / 2)[i % 2]
}

#[cfg(test)]
mod f32_tests {
    use super::*;

    #[test]
    fn f32_fill_matches_elementwise_and_stays_in_range() {
        let mut w = vec![0u64; 1000];
        fill_f32(&mut w, 5);
        let f = as_f32(&w);
        assert_eq!(f.len(), 2000);
        for (i, &x) in f.iter().enumerate() {
            assert_eq!(x.to_bits(), f32_at(5, i).to_bits(), "element {i}");
            assert!((-1.0..1.0).contains(&x));
        }
        assert!(f.iter().any(|&x| x < -0.5) && f.iter().any(|&x| x > 0.5));
    }

    #[test]
    fn poison_is_never_a_valid_f32_output() {
        let mut w = vec![0u64; 4];
        poison(&mut w);
        assert!(as_f32(&w).iter().all(|x| x.abs() > 1e18));
        as_f32_mut(&mut w)[1] = 0.5;
        assert_eq!(as_f32(&w)[1], 0.5);
    }
}

/// Copies `src` into `dst` with streaming stores (the destination is about
/// to be DMA'd: keep it out of the CPU caches).
pub fn copy_streaming(dst: &mut [u64], src: &[u64]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    dst.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(d, s)| copy_chunk_streaming(d, s));
}

#[cfg(target_arch = "x86_64")]
fn copy_chunk_streaming(d: &mut [u64], s: &[u64]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128, _mm_stream_si64};
    // 16-byte streaming stores need 16-byte aligned destinations: 8-byte
    // words up to the first aligned one, then pairs, then a last word.
    let head = if (d.as_ptr() as usize) % 16 == 0 { 0 } else { 1.min(d.len()) };
    // SAFETY: indices stay in bounds; SSE2 is baseline on x86_64; stores to
    // d (exclusive) are aligned where _mm_stream_si128 requires it.
    unsafe {
        for (i, &w) in s.iter().enumerate().take(head) {
            _mm_stream_si64(d.as_mut_ptr().add(i) as *mut i64, w as i64);
        }
        let pairs = (d.len() - head) / 2;
        for k in 0..pairs {
            let i = head + 2 * k;
            let v = _mm_loadu_si128(s.as_ptr().add(i) as *const __m128i);
            _mm_stream_si128(d.as_mut_ptr().add(i) as *mut __m128i, v);
        }
        for (i, &w) in s.iter().enumerate().take(d.len()).skip(head + 2 * pairs) {
            _mm_stream_si64(d.as_mut_ptr().add(i) as *mut i64, w as i64);
        }
        _mm_sfence();
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn copy_chunk_streaming(d: &mut [u64], s: &[u64]) {
    d.copy_from_slice(s);
}
