//! The 128-byte swizzle that TMA (`CU_TENSOR_MAP_SWIZZLE_128B`) applies when it writes a tile
//! into shared memory, and that `wgmma` descriptors with swizzle mode 1 undo when they read it.
//!
//! A tile stored with this swizzle is a stack of 128-byte rows (64 bf16/f16 elements). Each
//! row is eight 16-byte chunks; chunk `j` of row `r` is stored at chunk position
//! `j ^ (r % 8)`. The pattern repeats every 8 rows = 1024 bytes, which is why such tiles must
//! start on a 1024-byte boundary (then the hardware's phase, taken from address bits `[7:9]`,
//! equals `r % 8`).

/// Bytes in one swizzled row: the swizzle span.
pub const ROW_BYTES: u32 = 128;
/// Bytes in one full swizzle pattern (8 rows); SW128 tiles are aligned to this.
pub const ATOM_BYTES: u32 = 1024;
/// 2-byte elements per swizzled row.
pub const ROW_ELEMS_16BIT: u32 = ROW_BYTES / 2;

/// Byte offset of the 2-byte element at (`row`, `col`) in a tile of 64-element rows stored
/// with the 128-byte swizzle, measured from the tile's 1024-byte aligned start.
///
/// `col` must be below 64. Layout: `row * 128 + ((col / 8) ^ (row % 8)) * 16 + (col % 8) * 2`.
#[inline(always)]
pub const fn sw128_offset_16bit(row: u32, col: u32) -> u32 {
    let chunk = (col / 8) ^ (row % 8);
    row * ROW_BYTES + chunk * 16 + (col % 8) * 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_permutations_of_their_chunks() {
        for row in 0..16 {
            let mut seen = [false; 64];
            for col in 0..64 {
                let off = sw128_offset_16bit(row, col);
                assert!(off >= row * ROW_BYTES && off < (row + 1) * ROW_BYTES);
                let slot = ((off - row * ROW_BYTES) / 2) as usize;
                assert!(!seen[slot], "row {row} col {col} collides");
                seen[slot] = true;
            }
        }
    }

    #[test]
    fn row_zero_is_identity_and_pattern_repeats_every_eight_rows() {
        for col in 0..64 {
            assert_eq!(sw128_offset_16bit(0, col), col * 2);
            for row in 0..8 {
                assert_eq!(
                    sw128_offset_16bit(row + 8, col),
                    sw128_offset_16bit(row, col) + ATOM_BYTES
                );
            }
        }
        // Row 1 swaps chunks pairwise: element 0 lands in chunk 1.
        assert_eq!(sw128_offset_16bit(1, 0), 128 + 16);
        // Row 7, element 63: chunk 7 ^ 7 = 0, element 7 of it.
        assert_eq!(sw128_offset_16bit(7, 63), 7 * 128 + 14);
    }
}
