//! What the GEMM kernel can run, checked on the host with messages that name the rule.
use super::{GemmArgs, MatrixView};

/// Why a GEMM cannot run on the stage kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GemmError {
    #[error("GEMM shape mismatch: {0}")]
    Shape(String),
    #[error("GEMM dimension {name}={value} is out of range: {rule}")]
    Range {
        name: &'static str,
        value: u64,
        rule: &'static str,
    },
    #[error("GEMM operand {operand}: {rule}")]
    Alignment { operand: &'static str, rule: String },
    #[error("GEMM with beta={beta} needs a C operand")]
    MissingC { beta: f32 },
}

/// Largest M, N or K the kernel's 32-bit index arithmetic supports.
const MAX_DIM: u64 = 1 << 31;

/// Checks `args` against what the kernel supports:
/// - A is M×K, B is N×K, C (when given) and D are M×N; all dimensions in 1..2³¹;
/// - K a multiple of 8 and every leading dimension a multiple of 8 elements, every base
///   pointer 16-byte aligned (TMA moves 16-byte units; the epilogue stores element pairs);
/// - `beta != 0` needs C.
pub fn check(args: &GemmArgs) -> Result<(), GemmError> {
    let (m, n, k) = args.shape();
    for (name, value) in [("M", m), ("N", n), ("K", k)] {
        if value == 0 || value >= MAX_DIM {
            return Err(GemmError::Range {
                name,
                value,
                rule: "must be in 1..2^31",
            });
        }
    }
    if !k.is_multiple_of(8) {
        return Err(GemmError::Range {
            name: "K",
            value: k,
            rule: "must be a multiple of 8 (16-byte rows)",
        });
    }
    if args.b.cols != k {
        return Err(GemmError::Shape(format!(
            "A is {m}x{k} but B is {}x{} (B must be N x K)",
            args.b.rows, args.b.cols
        )));
    }
    if (args.d.rows, args.d.cols) != (m, n) {
        return Err(GemmError::Shape(format!(
            "D is {}x{}, expected M x N = {m}x{n}",
            args.d.rows, args.d.cols
        )));
    }
    match &args.c {
        Some(c) if (c.rows, c.cols) != (m, n) => {
            return Err(GemmError::Shape(format!(
                "C is {}x{}, expected M x N = {m}x{n}",
                c.rows, c.cols
            )));
        }
        None if args.beta != 0.0 => return Err(GemmError::MissingC { beta: args.beta }),
        _ => {}
    }
    let views = [
        ("A", Some(&args.a)),
        ("B", Some(&args.b)),
        ("C", args.c.as_ref()),
        ("D", Some(&args.d)),
    ];
    for (operand, view) in views {
        if let Some(view) = view {
            check_view(operand, view)?;
        }
    }
    Ok(())
}

/// Largest leading dimension, in elements: TMA row pitches must be below 2^40 bytes, and both
/// element types are 2 bytes wide. Checked here because `ld · 2` of an ld ≥ 2^63 would wrap to
/// a small pitch and read overlapping rows.
const MAX_LD: u64 = 1 << 39;

fn check_view(operand: &'static str, v: &MatrixView) -> Result<(), GemmError> {
    if v.ld >= MAX_LD {
        return Err(GemmError::Alignment {
            operand,
            rule: format!(
                "leading dimension {} is 2^39 elements or more (a row pitch of 2^40 bytes or \
                 more, beyond what TMA addresses)",
                v.ld
            ),
        });
    }
    if v.ld < v.cols {
        return Err(GemmError::Alignment {
            operand,
            rule: format!(
                "leading dimension {} is smaller than its {} columns",
                v.ld, v.cols
            ),
        });
    }
    if !v.ld.is_multiple_of(8) {
        return Err(GemmError::Alignment {
            operand,
            rule: format!(
                "leading dimension {} is not a multiple of 8 elements (16 bytes)",
                v.ld
            ),
        });
    }
    if !v.ptr.is_multiple_of(16) {
        return Err(GemmError::Alignment {
            operand,
            rule: format!("address {:#x} is not 16-byte aligned", v.ptr),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;

    fn args(m: u64, n: u64, k: u64) -> GemmArgs {
        GemmArgs {
            dtype: Dtype::Bf16,
            a: MatrixView::dense(0x1000, m, k),
            b: MatrixView::dense(0x2000, n, k),
            c: None,
            d: MatrixView {
                ptr: 0x3000,
                rows: m,
                cols: n,
                ld: n.next_multiple_of(8),
            },
            alpha: 1.0,
            beta: 0.0,
        }
    }

    #[test]
    fn accepts_ragged_m_and_n() {
        assert_eq!(check(&args(129, 257, 64)), Ok(()));
        assert_eq!(check(&args(1000, 1000, 1024)), Ok(()));
    }

    #[test]
    fn rejects_what_the_kernel_cannot_do() {
        let e = check(&args(64, 64, 100)).unwrap_err();
        assert!(
            e.to_string().contains("K=100") && e.to_string().contains("multiple of 8"),
            "{e}"
        );
        assert!(matches!(
            check(&args(0, 64, 64)),
            Err(GemmError::Range { name: "M", .. })
        ));
        let mut a = args(64, 64, 64);
        a.beta = 1.0;
        assert_eq!(check(&a), Err(GemmError::MissingC { beta: 1.0 }));
        let mut a = args(64, 64, 64);
        a.b.cols = 32;
        assert!(matches!(check(&a), Err(GemmError::Shape(_))));
        let mut a = args(64, 64, 64);
        a.a.ptr += 2;
        assert!(
            check(&a)
                .unwrap_err()
                .to_string()
                .contains("16-byte aligned")
        );
        let mut a = args(64, 60, 64);
        a.d.ld = 60;
        assert!(check(&a).unwrap_err().to_string().contains("multiple of 8"));
        // 2^63 + 8: a multiple of 8 whose byte pitch wraps to 16 in u64.
        let mut a = args(64, 64, 64);
        a.a.ld = (1 << 63) + 8;
        assert!(check(&a).unwrap_err().to_string().contains("2^39 elements"));
    }
}
