//! Where a `wgmma` accumulator element lives: the register layout of a 64 × N f32 fragment
//! over the 128 threads of a warpgroup (PTX ISA, "Matrix fragments for wgmma.mma_async",
//! the D matrix).
//!
//! The fragment is cut into 64 × 8 *core blocks* along N. In each, warp `w` owns rows
//! `16w..16w + 15`; lane `l` of it holds two horizontally adjacent elements of row
//! `16w + l/4` and the same two columns of row `16w + l/4 + 8`, at columns `2·(l % 4)` and
//! `2·(l % 4) + 1` of the block. A thread's registers go block by block, four per block:
//! (upper row, left), (upper row, right), (lower row, left), (lower row, right).

/// `(row, col)` in the 64 × N fragment of accumulator register `reg` (`0..N/2`) of thread
/// `thread` (`0..128`) of the warpgroup.
#[inline(always)]
pub const fn accumulator_element(thread: u32, reg: u32) -> (u32, u32) {
    let (warp, lane) = (thread / 32, thread % 32);
    let row = 16 * warp + lane / 4 + 8 * ((reg / 2) % 2);
    let col = 8 * (reg / 4) + 2 * (lane % 4) + reg % 2;
    (row, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_of_a_fragment_is_in_exactly_one_register() {
        for n in [8u32, 16, 32, 64, 256] {
            let mut owner = vec![None; (64 * n) as usize];
            for t in 0..128 {
                for r in 0..n / 2 {
                    let (row, col) = accumulator_element(t, r);
                    assert!(row < 64 && col < n, "n {n}: thread {t} register {r}");
                    let cell = &mut owner[(row * n + col) as usize];
                    assert_eq!(*cell, None, "n {n}: ({row}, {col}) twice");
                    *cell = Some((t, r));
                }
            }
            assert!(owner.iter().all(Option::is_some), "n {n}");
        }
    }

    #[test]
    fn the_documented_corners() {
        // Thread 0 starts the fragment; lane 1 is two columns on; warp 1 sixteen rows down.
        assert_eq!(accumulator_element(0, 0), (0, 0));
        assert_eq!(accumulator_element(0, 1), (0, 1));
        assert_eq!(accumulator_element(0, 2), (8, 0));
        assert_eq!(accumulator_element(0, 4), (0, 8));
        assert_eq!(accumulator_element(1, 0), (0, 2));
        assert_eq!(accumulator_element(4, 0), (1, 0));
        assert_eq!(accumulator_element(32, 3), (24, 1));
        // The last register of the last thread of a 64 × 16 fragment: its bottom-right corner.
        assert_eq!(accumulator_element(127, 7), (63, 15));
    }
}
