//! Pure parsers for `ptxas -v` output and `cuobjdump --dump-sass` listings.

/// Resource usage of one entry function, from `ptxas -v`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: Option<u32>,
    pub barriers: Option<u32>,
    /// Static shared memory (dynamic shared memory is sized at launch and not reported).
    pub smem_bytes: u64,
    pub stack_frame: u64,
    pub spill_stores: u64,
    pub spill_loads: u64,
}

/// A ptxas message carrying a `(Cxxxx)` code, e.g. `(C7508) ... 'setmaxnreg' ignored ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// `C7508`, ...
    pub code: String,
    /// The kernel it concerns when the message names it or is printed while that entry is
    /// being compiled.
    pub kernel: Option<String>,
    /// The whole line, trimmed.
    pub line: String,
}

/// What `ptxas -v` said about a module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// Entry functions in the order ptxas compiled them.
    pub kernels: Vec<KernelResources>,
    pub diagnostics: Vec<Diagnostic>,
}

impl PtxasReport {
    pub fn kernel(&self, name: &str) -> Option<&KernelResources> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// The first `'quoted'` string after `marker` in `line`.
fn quoted_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let start = rest.find('\'')? + 1;
    let len = rest[start..].find('\'')?;
    Some(&rest[start..start + len])
}

/// Every `'quoted'` string in `line`.
fn quoted(line: &str) -> impl Iterator<Item = &str> {
    line.split('\'').skip(1).step_by(2)
}

/// The leading unsigned number of `s` (after trimming).
fn leading_number(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// The `(Cdddd)` code in a line, if any.
fn diagnostic_code(line: &str) -> Option<String> {
    line.match_indices("(C").find_map(|(at, _)| {
        let code = line.get(at + 1..at + 6)?;
        let digits_ok = code[1..].bytes().all(|c| c.is_ascii_digit());
        (digits_ok && line[at + 6..].starts_with(')')).then(|| code.to_string())
    })
}

/// Parses the text `ptxas -v` prints (stdout and stderr together). `known_kernels` helps
/// attribute diagnostics that name a kernel in quotes.
pub fn parse_ptxas_verbose(text: &str, known_kernels: &[&str]) -> PtxasReport {
    let mut report = PtxasReport::default();
    // Index into `report.kernels` of the entry being compiled, and the function whose
    // "Function properties" line came last (may be a non-entry `.func`).
    let mut current: Option<usize> = None;
    let mut properties_for: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(code) = diagnostic_code(line) {
            let named = quoted(line)
                .find(|q| known_kernels.contains(q) || report.kernel(q).is_some())
                .map(str::to_string);
            let kernel = named.or_else(|| current.map(|i| report.kernels[i].name.clone()));
            report.diagnostics.push(Diagnostic {
                code,
                kernel,
                line: line.to_string(),
            });
            continue;
        }
        if line.contains("Compiling entry function") {
            if let Some(name) = quoted_after(line, "Compiling entry function") {
                let idx = match report.kernels.iter().position(|k| k.name == name) {
                    Some(i) => i,
                    None => {
                        report.kernels.push(KernelResources {
                            name: name.to_string(),
                            ..Default::default()
                        });
                        report.kernels.len() - 1
                    }
                };
                current = Some(idx);
                properties_for = None;
            }
            continue;
        }
        if let Some(rest) = line.split_once("Function properties for ").map(|(_, r)| r) {
            properties_for = Some(rest.trim().trim_matches('\'').to_string());
            continue;
        }
        if line.contains("bytes stack frame") {
            let target = properties_for
                .as_deref()
                .and_then(|n| report.kernels.iter().position(|k| k.name == n));
            if let Some(i) = target {
                let k = &mut report.kernels[i];
                for item in line.split(',') {
                    let n = leading_number(item).unwrap_or(0);
                    if item.contains("stack frame") {
                        k.stack_frame = n;
                    } else if item.contains("spill stores") {
                        k.spill_stores = n;
                    } else if item.contains("spill loads") {
                        k.spill_loads = n;
                    }
                }
            }
            continue;
        }
        if let Some(rest) = line.split_once("Used ").map(|(_, r)| r)
            && line.contains("registers")
            && let Some(i) = current
        {
            let k = &mut report.kernels[i];
            for item in rest.split(',') {
                let item = item.trim();
                let n = leading_number(item.trim_start_matches("used "));
                if item.ends_with("registers") {
                    k.registers = n.and_then(|n| u32::try_from(n).ok());
                } else if item.ends_with("barriers") {
                    k.barriers = n.and_then(|n| u32::try_from(n).ok());
                } else if item.ends_with("bytes smem") {
                    k.smem_bytes = n.unwrap_or(0);
                }
            }
        }
    }
    report
}

/// Splits a `cuobjdump --dump-sass` listing into `(function name, its SASS text)`.
pub fn split_sass(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.trim().strip_prefix("Function : ") {
            out.push((name.trim().to_string(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// How many warpgroup MMA instructions a SASS listing contains: `HGMMA` (the 16-bit types'
/// `wgmma`) and `QGMMA` (the 8-bit ones').
pub fn gmma_count(sass: &str) -> usize {
    sass.lines()
        .filter(|l| {
            // The mnemonic follows the `/*addr*/` column (and an optional predicate).
            let code = l.split_once("*/").map_or("", |(_, c)| c);
            code.split_whitespace().take(2).any(|w| {
                ["HGMMA", "QGMMA"]
                    .iter()
                    .any(|m| w == *m || w.strip_prefix(m).is_some_and(|r| r.starts_with('.')))
            })
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from ptxas 13.0.88 (`-arch=sm_90a -v`) on a hand-written module.
    const PTXAS_V: &str = "\
ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at entry.
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_bounds' for 'sm_90a'
ptxas info    : Function properties for k_bounds
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 0 barriers
ptxas info    : Compile time = 7.187 ms
ptxas info    : Compiling entry function 'k_local' for 'sm_90a'
ptxas info    : Function properties for k_local
    512 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 512 bytes cumulative stack size, 4096 bytes smem
ptxas info    : Compile time = 1.916 ms
ptxas info    : Compiling entry function 'k_setmax' for 'sm_90a'
ptxas info    : (C7517) Potential Performance Loss: warpgroup.wait is injected in order to allow use of registers defined by GMMA
ptxas info    : Function properties for k_setmax
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
ptxas info    : Compile time = 0.698 ms
ptxas warning : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function 'k_bounds'
";

    #[test]
    fn parses_resources_per_kernel() {
        let r = parse_ptxas_verbose(PTXAS_V, &["k_bounds", "k_local", "k_setmax"]);
        let names: Vec<_> = r.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["k_bounds", "k_local", "k_setmax"]);
        let b = r.kernel("k_bounds").expect("k_bounds");
        assert_eq!(
            (b.registers, b.barriers, b.smem_bytes, b.stack_frame),
            (Some(168), Some(0), 0, 0)
        );
        let l = r.kernel("k_local").expect("k_local");
        assert_eq!(l.registers, Some(12));
        assert_eq!(l.barriers, Some(1));
        assert_eq!(l.smem_bytes, 4096);
        assert_eq!((l.stack_frame, l.spill_stores, l.spill_loads), (512, 8, 12));
    }

    #[test]
    fn attributes_diagnostics() {
        let r = parse_ptxas_verbose(PTXAS_V, &["k_bounds", "k_local", "k_setmax"]);
        let d: Vec<_> = r
            .diagnostics
            .iter()
            .map(|d| (d.code.as_str(), d.kernel.as_deref()))
            .collect();
        assert_eq!(
            d,
            [
                ("C7508", None),
                ("C7517", Some("k_setmax")),
                ("C7510", Some("k_bounds"))
            ],
            "parse-time C7508 names no kernel; C7517 is inside k_setmax; C7510 quotes k_bounds"
        );
        assert!(r.diagnostics[0].line.contains("setmaxnreg"));
    }

    #[test]
    fn older_used_line_format_and_non_entry_functions() {
        let text = "\
ptxas info    : Function properties for helper
    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 2048 bytes smem, 368 bytes cmem[0]
";
        let r = parse_ptxas_verbose(text, &["k"]);
        assert_eq!(r.kernels.len(), 1, "the non-entry `helper` is not a kernel");
        let k = &r.kernels[0];
        assert_eq!(
            (k.registers, k.smem_bytes, k.stack_frame, k.barriers),
            (Some(40), 2048, 0, None)
        );
        assert!(r.diagnostics.is_empty());
        assert_eq!(diagnostic_code("(C75) x"), None);
        assert_eq!(diagnostic_code("x (C7511) y").as_deref(), Some("C7511"));
    }

    /// Shape of `cuobjdump --dump-sass` (13.x) output, shortened.
    const SASS: &str = "
\tcode for sm_90a
\t.target\tsm_90a

\t\tFunction : gemm_f16
\t.headerflags\t@\"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"
        /*0000*/                   LDC R1, c[0x0][0x28] ;              /* 0x00000a00ff017b82 */
                                                                       /* 0x000ff00000000800 */
        /*0100*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;  /* 0x0be00000041879f0 */
        /*0110*/               @P0 HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;  /* 0x0be00008081879f0 */
        /*0120*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;     /* 0x00000000000079af */
        /*0130*/                   QGMMA.64x256x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24, gsb0 ;  /* 0x0be00000041879f0 */
        /*0140*/                   HGMMAX R1, R2 ;  /* not a wgmma mnemonic */
\t\t..........



\t\tFunction : gemm
\t.headerflags\t@\"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"
        /*0000*/                   LDC R1, c[0x0][0x28] ;              /* 0x00000a00ff017b82 */
        /*0010*/                   EXIT ;  /* HGMMA in a comment is not an instruction */
";

    #[test]
    fn splits_sass_and_counts_warpgroup_mmas() {
        let f = split_sass(SASS);
        let names: Vec<_> = f.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["gemm_f16", "gemm"]);
        assert_eq!(gmma_count(&f[0].1), 3);
        assert_eq!(gmma_count(&f[1].1), 0);
        assert!(split_sass("no functions here").is_empty());
    }
}
