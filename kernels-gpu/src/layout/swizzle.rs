//! The 128-byte swizzle that TMA (`CU_TENSOR_MAP_SWIZZLE_128B`) applies when it writes a tile
//! into shared memory, and that `wgmma` descriptors with swizzle mode 1 undo when they read it;
//! and its 64-byte sibling, in which the GEMM epilogue stages 32-column output chunks.
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
    offset_16bit(ROW_BYTES, row, col)
}

/// Byte offset of the 2-byte element at (`row`, `col`) in a tile of `span`-byte rows stored
/// with the `span`-byte swizzle (`span` = 64 or 128), from the tile's aligned start.
///
/// Both swizzles XOR the 16-byte chunk index (address bits `[4:…]`) with address bits
/// `[7:…]`, as many bits as a row has chunk-index bits: with 128-byte rows that is `row % 8`
/// (above), with 64-byte rows (four chunks) `(row / 2) % 4` — the pattern then repeats every
/// 8 rows = 512 bytes. `col` must be below `span / 2`.
#[inline(always)]
pub const fn offset_16bit(span: u32, row: u32, col: u32) -> u32 {
    let phase = (row * span / 128) % (span / 16);
    row * span + ((col / 8) ^ phase) * 16 + (col % 8) * 2
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
    fn the_64_byte_swizzle_pairs_rows_and_permutes_their_chunks() {
        for row in 0..16 {
            let mut seen = [false; 32];
            for col in 0..32 {
                let off = offset_16bit(64, row, col);
                assert!(off >= row * 64 && off < (row + 1) * 64);
                let slot = ((off - row * 64) / 2) as usize;
                assert!(!seen[slot], "row {row} col {col} collides");
                seen[slot] = true;
            }
        }
        // Rows 0 and 1 are unswizzled; rows 2 and 3 swap chunks pairwise; rows 6, 7 reverse
        // them (XOR 3); row 8 starts the pattern again.
        assert_eq!(offset_16bit(64, 1, 9), 64 + 18);
        assert_eq!(offset_16bit(64, 2, 0), 2 * 64 + 16);
        assert_eq!(offset_16bit(64, 7, 0), 7 * 64 + 48);
        assert_eq!(offset_16bit(64, 8, 5), 8 * 64 + 10);
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
