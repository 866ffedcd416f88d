//! The 64-bit shared-memory matrix descriptor that `wgmma.mma_async` takes for an operand in
//! shared memory (PTX ISA, "Matrix Descriptor Format").
//!
//! ```text
//!  bits 0..14   start address  >> 4   (shared-window byte address)
//!  bits 16..30  leading-dimension byte offset (LBO) >> 4
//!  bits 32..46  stride-dimension byte offset (SBO) >> 4
//!  bits 49..52  base offset (0 when the swizzle pattern starts 1024-byte aligned)
//!  bits 62..64  swizzle mode: 0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B
//! ```
//!
//! For a K-major tile written by TMA with the 128-byte swizzle (rows of 64 elements = 128 B),
//! the leading offset is unused (encoded as 1) and the stride offset is the distance between
//! consecutive groups of 8 rows: 8 × 128 B = 1024 B. Advancing along K by one `k16` step
//! (16 elements = 32 bytes) inside the 128-byte row is done by adding 32 B to the start address;
//! the hardware applies the XOR swizzle to the final address.

/// Swizzle modes of the descriptor (bits 62..63).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Swizzle {
    None = 0,
    B128 = 1,
    B64 = 2,
    B32 = 3,
}

/// Encodes a byte quantity into a 14-bit descriptor field (`(x & 0x3FFFF) >> 4`).
#[inline(always)]
const fn field(bytes: u32) -> u64 {
    ((bytes & 0x3FFFF) >> 4) as u64
}

/// Builds a descriptor from its parts. `start` is a 32-bit shared-memory address.
#[inline(always)]
pub const fn encode(start: u32, lbo_bytes: u32, sbo_bytes: u32, swizzle: Swizzle) -> u64 {
    field(start) | (field(lbo_bytes) << 16) | (field(sbo_bytes) << 32) | ((swizzle as u64) << 62)
}

/// Descriptor of a K-major operand tile stored by TMA with the 128-byte swizzle (rows of
/// 128 bytes, 8-row groups 1024 bytes apart), starting at shared address `start`.
#[inline(always)]
pub const fn k_major_sw128(start: u32) -> u64 {
    encode(start, 16, 1024, Swizzle::B128)
}

/// Byte step of the start address for one `k16` wgmma step of a 2-byte element type.
pub const K16_STEP_BYTES: u32 = 32;

/// `desc` with its start address moved `bytes` further inside its 1024-byte swizzle atom.
/// Every operand tile starts 1024-byte aligned, so the start field (the address in 16-byte
/// units, in the low bits) has its low 6 bits clear and a move of less than 1024 bytes is an
/// OR: no carry into the other fields, and ptxas only touches the low word. The `k16` steps of
/// a 64-wide k-block move 0, 32, 64 and 96 bytes.
#[inline(always)]
pub const fn offset_in_atom(desc: u64, bytes: u32) -> u64 {
    desc | (bytes >> 4) as u64
}

/// `desc` with its start address moved `bytes` further, a whole number of 1024-byte swizzle
/// atoms (the next 64-row slab of a K-major tile is 8 KiB on). An add on the start field: the
/// shared window is below 256 KiB, so the field (address / 16, 14 bits) cannot overflow into
/// the leading-offset field above it. Commutes with [`offset_in_atom`].
#[inline(always)]
pub const fn advance_atoms(desc: u64, bytes: u32) -> u64 {
    desc + (bytes >> 4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_major_sw128_matches_the_ptx_reference_constant() {
        // LBO field 1, SBO field 64, swizzle 1 => 0x4000_0040_0001_0000 plus the address.
        assert_eq!(k_major_sw128(0), 0x4000_0040_0001_0000);
        assert_eq!(k_major_sw128(0x400), 0x4000_0040_0001_0040);
        // Advancing one k16 step adds 2 to the encoded address.
        assert_eq!(
            k_major_sw128(0x400 + K16_STEP_BYTES) - k_major_sw128(0x400),
            2
        );
        // `offset_in_atom` is re-encoding at the moved address, for aligned tiles anywhere in
        // the shared window.
        for start in [0x400, 0x1_0000, 0x3_8000] {
            for step in [
                0,
                K16_STEP_BYTES,
                2 * K16_STEP_BYTES,
                3 * K16_STEP_BYTES,
                1008,
            ] {
                assert_eq!(
                    offset_in_atom(k_major_sw128(start), step),
                    k_major_sw128(start + step)
                );
            }
        }
    }

    #[test]
    fn advance_atoms_is_reencoding_at_the_later_slab() {
        for start in [0x400, 0x1_0000, 0x2_4000] {
            for slab in 0..3 {
                let bytes = slab * 8192;
                let moved = advance_atoms(k_major_sw128(start), bytes);
                assert_eq!(moved, k_major_sw128(start + bytes));
                // And a k16 step inside the atom on top of it.
                assert_eq!(
                    offset_in_atom(moved, 3 * K16_STEP_BYTES),
                    k_major_sw128(start + bytes + 3 * K16_STEP_BYTES)
                );
            }
        }
    }

    #[test]
    fn fields_are_masked_to_the_shared_window() {
        // Bits above 18 of the address are dropped, as the hardware does.
        assert_eq!(encode(0x4_0010, 0, 0, Swizzle::None), 1);
        assert_eq!(encode(0, 0, 0, Swizzle::B32), 3 << 62);
    }
}
