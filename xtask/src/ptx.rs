//! Pure functions over PTX text: header facts, the list of `.entry` points, and the two
//! post-processing patches the build applies (launch bounds, and the parameter-space address
//! of an entry's first parameter: neither can rustc express).

use std::fmt;

/// One `.entry` in a PTX module, located by byte offsets into the text it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's symbol name.
    pub name: String,
    /// `.visible .entry` (exported) rather than a plain `.entry`.
    pub visible: bool,
    /// Offset just after the parameter list's `)` (or after the name when there is none):
    /// where performance-tuning directives such as `.maxntid` go.
    pub header_end: usize,
    /// Offset of the body's opening `{`.
    pub body_start: usize,
    /// Offset just after the body's closing `}`.
    pub body_end: usize,
}

impl Entry {
    /// The directives between the parameter list and the body (e.g. `.maxntid 384, 1, 1`).
    pub fn directives<'a>(&self, ptx: &'a str) -> &'a str {
        &ptx[self.header_end..self.body_start]
    }

    /// The body, braces included.
    pub fn body<'a>(&self, ptx: &'a str) -> &'a str {
        &ptx[self.body_start..self.body_end]
    }
}

/// The `.version major.minor` of a module, if present.
pub fn version(ptx: &str) -> Option<(u32, u32)> {
    let rest = directive_arg(ptx, ".version")?;
    let (major, minor) = rest.split_once('.')?;
    Some((major.trim().parse().ok()?, minor.trim().parse().ok()?))
}

/// The first target of the `.target` directive (e.g. `sm_90a` of `.target sm_90a`).
pub fn target(ptx: &str) -> Option<String> {
    let rest = directive_arg(ptx, ".target")?;
    let first = rest.split(',').next()?.trim();
    (!first.is_empty()).then(|| first.to_string())
}

/// The argument text of the first line (outside comments) that starts with `directive`.
fn directive_arg<'a>(ptx: &'a str, directive: &str) -> Option<&'a str> {
    ptx.lines().find_map(|line| {
        let code = strip_comment(line).trim();
        let rest = code.strip_prefix(directive)?;
        rest.starts_with(char::is_whitespace).then(|| rest.trim())
    })
}

fn strip_comment(line: &str) -> &str {
    line.split_once("//").map_or(line, |(code, _)| code)
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'.')
}

/// A malformed PTX text (an `.entry` whose parameter list or body is not closed, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxError(pub String);

impl fmt::Display for PtxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Byte ranges of `//` and `/* */` comments, so scanning can skip them.
fn code_mask(ptx: &str) -> Vec<bool> {
    let b = ptx.as_bytes();
    let mut code = vec![true; b.len()];
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                code[i] = false;
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = ptx[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            code[i..end].iter_mut().for_each(|c| *c = false);
            i = end;
        } else {
            i += 1;
        }
    }
    code
}

/// Every `.entry` of the module, in text order.
pub fn entries(ptx: &str) -> Result<Vec<Entry>, PtxError> {
    let b = ptx.as_bytes();
    let code = code_mask(ptx);
    let mut out = Vec::new();
    let mut search = 0;
    while let Some(found) = ptx[search..].find(".entry") {
        let at = search + found;
        search = at + ".entry".len();
        let boundary_before = at == 0 || b[at - 1].is_ascii_whitespace();
        let boundary_after = b.get(search).is_some_and(|c| c.is_ascii_whitespace());
        if !code[at] || !boundary_before || !boundary_after {
            continue;
        }
        // `.visible` (or `.weak`, ...) linkage precedes `.entry` on the same line.
        let line_start = ptx[..at].rfind('\n').map_or(0, |p| p + 1);
        let visible = ptx[line_start..at]
            .split_whitespace()
            .any(|w| w == ".visible");
        let mut i = search;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let name_start = i;
        while i < b.len() && is_ident_char(b[i]) {
            i += 1;
        }
        let name = &ptx[name_start..i];
        if name.is_empty() {
            return Err(PtxError(format!("`.entry` at byte {at} has no name")));
        }
        let mut j = i;
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        let header_end = if b.get(j) == Some(&b'(') {
            match ptx[j..].find(')') {
                Some(close) => j + close + 1,
                None => {
                    return Err(PtxError(format!(
                        "parameter list of `.entry {name}` is not closed"
                    )));
                }
            }
        } else {
            i
        };
        let body_start =
            match (header_end..b.len()).find(|&k| code[k] && (b[k] == b'{' || b[k] == b';')) {
                Some(k) if b[k] == b'{' => k,
                // A declaration (`.entry k(...);`) has no body and nothing to patch.
                Some(k) => {
                    search = k + 1;
                    continue;
                }
                None => return Err(PtxError(format!("`.entry {name}` has no body"))),
            };
        let mut depth = 0usize;
        let mut body_end = None;
        for k in body_start..b.len() {
            if !code[k] {
                continue;
            }
            match b[k] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        body_end = Some(k + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let body_end =
            body_end.ok_or_else(|| PtxError(format!("body of `.entry {name}` is not closed")))?;
        out.push(Entry {
            name: name.to_string(),
            visible,
            header_end,
            body_start,
            body_end,
        });
        search = body_end;
    }
    Ok(out)
}

/// Launch bounds to write into one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchBounds<'a> {
    /// The entry's name.
    pub kernel: &'a str,
    /// `.maxntid <maxntid>, 1, 1`.
    pub maxntid: u32,
    /// `.minnctapersm <minnctapersm>`.
    pub minnctapersm: u32,
}

/// What [`patch_launch_bounds`] did to one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchAction {
    /// The directives were inserted.
    Inserted {
        kernel: String,
        maxntid: u32,
        minnctapersm: u32,
    },
    /// The entry already carried exactly these directives (PTX patched before, or rustc
    /// learned to emit them); left unchanged.
    AlreadyPresent { kernel: String },
}

/// The token a kernel's inline assembly writes where it needs the symbol of its entry's first
/// parameter (`<entry>_param_0`): `mov.b64 %rd, __ENTRY_PARAM_0__; cvta.param.u64 %rd, %rd;`
/// gives the generic address of the parameter block, which TMA reads tensor maps from.
pub const ENTRY_PARAM_0: &str = "__ENTRY_PARAM_0__";

/// The alignment [`patch_entry_param_0`] gives a first parameter whose address is taken: 128
/// bytes, as nvcc declares a `__grid_constant__ CUtensorMap` (TMA needs 64).
pub const PARAM_0_ALIGN: u32 = 128;

/// In every entry whose body names [`ENTRY_PARAM_0`], replaces the token with the entry's
/// first-parameter symbol and raises that parameter's declared alignment to
/// [`PARAM_0_ALIGN`] (rustc declares a by-value struct with `.align 16` and cannot go
/// higher). Returns the patched text and the entries patched. Fails when the token appears
/// outside an entry body (a non-inlined function cannot know its caller's parameters) or an
/// entry that uses it declares no `.align` on its first parameter.
pub fn patch_entry_param_0(ptx: &str) -> Result<(String, Vec<String>), PtxError> {
    let found = entries(ptx)?;
    let mut out = String::with_capacity(ptx.len());
    let mut patched = Vec::new();
    let mut last = 0;
    for entry in &found {
        let body = entry.body(ptx);
        // From the end of the previous body to this body: the entry's header (and whatever
        // functions lie between).
        let header = &ptx[last..entry.body_start];
        if header.contains(ENTRY_PARAM_0) {
            return Err(PtxError(format!(
                "`{ENTRY_PARAM_0}` outside an entry body (before `.entry {}`)",
                entry.name
            )));
        }
        if !body.contains(ENTRY_PARAM_0) {
            out.push_str(&ptx[last..entry.body_end]);
            last = entry.body_end;
            continue;
        }
        let symbol = format!("{}_param_0", entry.name);
        let decl_at = header
            .find(&symbol)
            .ok_or_else(|| PtxError(format!("`.entry {}` has no first parameter", entry.name)))?;
        let decl_line_start = header[..decl_at].rfind('\n').map_or(0, |p| p + 1);
        let decl = &header[decl_line_start..decl_at];
        let align_at = decl.find(".align ").ok_or_else(|| {
            PtxError(format!(
                "`.entry {}`: its first parameter declares no `.align`",
                entry.name
            ))
        })?;
        let digits_start = decl_line_start + align_at + ".align ".len();
        let digits_len = header[digits_start..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        out.push_str(&header[..digits_start]);
        out.push_str(&PARAM_0_ALIGN.to_string());
        out.push_str(&header[digits_start + digits_len..]);
        out.push_str(&body.replace(ENTRY_PARAM_0, &symbol));
        last = entry.body_end;
        patched.push(entry.name.clone());
    }
    if ptx[last..].contains(ENTRY_PARAM_0) {
        return Err(PtxError(format!(
            "`{ENTRY_PARAM_0}` outside an entry body (after the last entry)"
        )));
    }
    out.push_str(&ptx[last..]);
    Ok((out, patched))
}

/// Inserts `.maxntid n, 1, 1` and `.minnctapersm m` between the parameter list and the body of
/// each listed entry, so ptxas knows the register budget at entry (without it, `setmaxnreg` is
/// ignored with C7508). Fails when a listed kernel is not an `.entry` of the module, or when an
/// entry already carries different launch-bound directives.
pub fn patch_launch_bounds(
    ptx: &str,
    bounds: &[LaunchBounds<'_>],
) -> Result<(String, Vec<PatchAction>), PtxError> {
    let found = entries(ptx)?;
    let mut inserts: Vec<(usize, String)> = Vec::new();
    let mut actions = Vec::new();
    for lb in bounds {
        let entry = found.iter().find(|e| e.name == lb.kernel).ok_or_else(|| {
            PtxError(format!(
                "kernel `{}` has launch bounds in meta but no `.entry` in the PTX",
                lb.kernel
            ))
        })?;
        let directives = entry.directives(ptx);
        let want_ntid = format!(".maxntid {}, 1, 1", lb.maxntid);
        let want_cta = format!(".minnctapersm {}", lb.minnctapersm);
        if directives.contains(".maxntid") || directives.contains(".minnctapersm") {
            let normalized: String = directives.split_whitespace().collect::<Vec<_>>().join(" ");
            if normalized.contains(&want_ntid) && normalized.contains(&want_cta) {
                actions.push(PatchAction::AlreadyPresent {
                    kernel: lb.kernel.to_string(),
                });
                continue;
            }
            return Err(PtxError(format!(
                "`.entry {}` already has launch-bound directives `{}` that differ from meta \
                 (`{want_ntid}`, `{want_cta}`)",
                lb.kernel,
                directives.trim()
            )));
        }
        inserts.push((entry.header_end, format!("\n{want_ntid}\n{want_cta}")));
        actions.push(PatchAction::Inserted {
            kernel: lb.kernel.to_string(),
            maxntid: lb.maxntid,
            minnctapersm: lb.minnctapersm,
        });
    }
    inserts.sort_by_key(|(at, _)| *at);
    let mut out = String::with_capacity(ptx.len() + inserts.len() * 48);
    let mut last = 0;
    for (at, text) in inserts {
        out.push_str(&ptx[last..at]);
        out.push_str(&text);
        last = at;
    }
    out.push_str(&ptx[last..]);
    Ok((out, actions))
}

/// Instruction families the finished GEMM module must contain (issue 2, "Done when").
pub const REQUIRED_PTX: &[(&str, &str)] = &[
    ("wgmma.mma_async", "warpgroup MMA (the GEMM mainloop)"),
    ("cp.async.bulk.tensor", "TMA tensor copies"),
    ("griddepcontrol", "programmatic dependent launch"),
];

/// The entries of `REQUIRED_PTX` that do not occur in the module's code (comments ignored).
pub fn missing_required(ptx: &str) -> Vec<&'static str> {
    let code: String = ptx
        .lines()
        .map(strip_comment)
        .collect::<Vec<_>>()
        .join("\n");
    REQUIRED_PTX
        .iter()
        .filter(|(needle, _)| !code.contains(needle))
        .map(|(n, _)| *n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "\
//
// Generated by LLVM NVPTX Back-End
//

.version 8.6
.target sm_90a
.address_size 64

\t// .globl\tgemm_f16 // -- Begin function gemm_f16
.visible .entry gemm_f16(
\t.param .u64 .ptr .align 1 gemm_f16_param_0,
\t.param .u32 gemm_f16_param_1
)
{
\t.reg .b32 \t%r<9>;
\t{ .reg .pred p; setp.eq.u32 p, %r1, 0; }
\tret;
}
\t// .globl\tgemm // -- Begin function gemm
.visible .entry gemm(
\t.param .u64 .ptr .align 1 gemm_param_0
)
{
\tsetmaxnreg.inc.sync.aligned.u32 232;
\tret;
}
";

    fn lb(kernel: &str, maxntid: u32, minnctapersm: u32) -> LaunchBounds<'_> {
        LaunchBounds {
            kernel,
            maxntid,
            minnctapersm,
        }
    }

    #[test]
    fn header_facts() {
        assert_eq!(version(TWO), Some((8, 6)));
        assert_eq!(target(TWO).as_deref(), Some("sm_90a"));
        assert_eq!(target(".target sm_90a, debug\n").as_deref(), Some("sm_90a"));
        assert_eq!(version("// .version 9.9\n.version 9.0\n"), Some((9, 0)));
        assert_eq!(version(".target sm_90a\n"), None);
        // `.versionx` is not `.version`.
        assert_eq!(version(".versionx 1.0\n"), None);
    }

    #[test]
    fn lists_entries_with_bodies() {
        let e = entries(TWO).expect("parses");
        let names: Vec<_> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["gemm_f16", "gemm"]);
        assert!(e.iter().all(|e| e.visible));
        assert!(
            e[0].body(TWO).contains("setp.eq.u32"),
            "nested braces kept in the body"
        );
        assert!(e[0].body(TWO).ends_with('}'));
        assert!(e[1].body(TWO).contains("setmaxnreg"));
        assert_eq!(e[0].directives(TWO), "\n");
    }

    #[test]
    fn patches_prefix_names_independently() {
        let (out, actions) = patch_launch_bounds(TWO, &[lb("gemm", 384, 1)]).expect("patches");
        assert_eq!(
            actions,
            [PatchAction::Inserted {
                kernel: "gemm".into(),
                maxntid: 384,
                minnctapersm: 1
            }]
        );
        assert!(
            out.contains("gemm_param_0\n)\n.maxntid 384, 1, 1\n.minnctapersm 1\n{\n\tsetmaxnreg")
        );
        // `gemm_f16` (which starts with `gemm`) is untouched.
        assert!(out.contains("gemm_f16_param_1\n)\n{\n"));
        assert_eq!(out.matches(".maxntid").count(), 1);
        let e = entries(&out).expect("patched PTX parses");
        assert!(e[1].directives(&out).contains(".minnctapersm 1"));
    }

    #[test]
    fn patches_several_entries_and_is_idempotent() {
        let bounds = [lb("gemm", 384, 1), lb("gemm_f16", 128, 2)];
        let (once, actions) = patch_launch_bounds(TWO, &bounds).expect("patches");
        assert_eq!(actions.len(), 2);
        assert!(once.contains("gemm_f16_param_1\n)\n.maxntid 128, 1, 1\n.minnctapersm 2\n{"));
        assert!(once.contains("gemm_param_0\n)\n.maxntid 384, 1, 1\n.minnctapersm 1\n{"));
        let (twice, actions) = patch_launch_bounds(&once, &bounds).expect("re-patch is a no-op");
        assert_eq!(twice, once);
        assert!(
            actions
                .iter()
                .all(|a| matches!(a, PatchAction::AlreadyPresent { .. }))
        );
        let err = patch_launch_bounds(&once, &[lb("gemm", 256, 1)]).expect_err("conflict");
        assert!(err.0.contains("differ"), "{err}");
    }

    #[test]
    fn patches_entry_without_params() {
        let ptx = ".version 8.6\n.target sm_90a\n.visible .entry empty()\n{\n\tret;\n}\n\
                   .entry bare\n{\n\tret;\n}\n";
        let (out, _) =
            patch_launch_bounds(ptx, &[lb("empty", 64, 1), lb("bare", 32, 4)]).expect("patches");
        assert!(out.contains(".visible .entry empty()\n.maxntid 64, 1, 1\n.minnctapersm 1\n{"));
        assert!(out.contains(".entry bare\n.maxntid 32, 1, 1\n.minnctapersm 4\n{"));
        let e = entries(&out).expect("parses");
        assert!(e[0].visible && !e[1].visible);
    }

    #[test]
    fn missing_kernel_is_an_error() {
        let err = patch_launch_bounds(TWO, &[lb("gem", 384, 1)]).expect_err("no such entry");
        assert!(err.0.contains("`gem`"), "{err}");
    }

    #[test]
    fn ignores_entries_in_comments_and_reports_malformed() {
        let ptx =
            "// .visible .entry ghost(\n/* .entry ghost2 { */\n.visible .entry real()\n{\n}\n";
        let names: Vec<_> = entries(ptx)
            .expect("parses")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["real"]);
        assert!(entries(".visible .entry k(\n.param .u32 a\n").is_err());
        assert!(entries(".visible .entry k()\n{\nret;\n").is_err());
    }

    #[test]
    fn required_instructions() {
        assert_eq!(missing_required(TWO).len(), REQUIRED_PTX.len());
        let full = "wgmma.mma_async.sync.aligned.m64n256k16\ncp.async.bulk.tensor.2d\n\
                    griddepcontrol.wait;\n";
        assert!(missing_required(full).is_empty());
        assert_eq!(
            missing_required("// griddepcontrol.wait\n").len(),
            REQUIRED_PTX.len()
        );
    }

    #[test]
    fn entry_param_0_is_named_and_aligned() {
        let ptx = ".visible .entry gemm(\n\t.param .align 16 .b8 gemm_param_0[480]\n)\n{\n\
                   \tmov.b64 %rd1, __ENTRY_PARAM_0__;\n\tcvta.param.u64 %rd1, %rd1;\n}\n\
                   .visible .entry add(\n\t.param .u32 add_param_0\n)\n{\nret;\n}\n";
        let (out, patched) = patch_entry_param_0(ptx).expect("patched");
        assert_eq!(patched, ["gemm"]);
        assert!(out.contains(".param .align 128 .b8 gemm_param_0[480]"));
        assert!(out.contains("mov.b64 %rd1, gemm_param_0;"));
        assert!(!out.contains(ENTRY_PARAM_0));
        // Entries without the token are untouched.
        assert!(out.contains(".param .u32 add_param_0\n)\n{\nret;\n}\n"));
        // Idempotent on its output.
        assert_eq!(patch_entry_param_0(&out).expect("again").0, out);
    }

    #[test]
    fn entry_param_0_outside_an_entry_is_an_error() {
        let func = ".func f()\n{\n\tmov.b64 %rd1, __ENTRY_PARAM_0__;\n}\n\
                    .visible .entry k(\n\t.param .u32 k_param_0\n)\n{\nret;\n}\n";
        assert!(patch_entry_param_0(func).is_err());
        let unaligned = ".visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\
                         \tmov.b64 %rd1, __ENTRY_PARAM_0__;\n}\n";
        assert!(patch_entry_param_0(unaligned).is_err());
    }
}
