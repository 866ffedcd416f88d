//! `cargo xtask check-ptx`: assembles the PTX with CUDA 13.0 `ptxas -arch=sm_90a -v`, prints
//! each kernel's resources and gates on the things rustc's PTX gets wrong silently.

use std::time::Instant;

use kernels_gpu::meta::{KERNELS, KernelInfo};

use crate::ptx;
use crate::ptxas::{self, PtxasReport};
use crate::util::{self, Result};
use crate::{bail, build_ptx, tools};

/// ptxas diagnostics that mean the kernel will not run at the speed it was written for:
/// setmaxnreg ignored (C7508), wgmma serialized or waits injected (C7510/C7511/C7515/C7517).
pub const FATAL_DIAGNOSTICS: &[&str] = &["C7508", "C7510", "C7511", "C7515", "C7517"];

/// Where check-ptx writes the cubin, the ptxas log and the SASS listing.
pub const CHECK_DIR_REL: &str = "target/ptx-check";

pub struct Options {
    /// Skip `build-ptx` and check the existing `target/ptx/kernels_gpu.ptx`.
    pub no_build: bool,
}

pub fn check_ptx(opts: &Options) -> Result<()> {
    let root = util::workspace_root();
    let ptx_path = if opts.no_build {
        root.join(util::PTX_REL_PATH)
    } else {
        build_ptx::build_ptx()?
    };
    if !ptx_path.is_file() {
        bail!(
            "{} does not exist: run `cargo xtask build-ptx` first",
            ptx_path.display()
        );
    }
    let ptx_text = util::read_to_string(&ptx_path)?;
    let tools = tools::find_or_install()?;
    println!(
        "xtask check-ptx: ptxas {} ({}); cuobjdump {}; nvdisasm {}",
        tools.ptxas_version,
        util::rel(&tools.ptxas),
        util::rel(&tools.cuobjdump),
        util::rel(&tools.nvdisasm)
    );

    let started = Instant::now();
    // Outputs go next to, not into, target/ptx: host/build.rs watches that folder and would
    // rebuild the host crate whenever a file in it changes.
    let out_dir = root.join(CHECK_DIR_REL);
    util::create_dir_all(&out_dir)?;
    let cubin = out_dir.join("kernels_gpu.cubin");
    let mut cmd = tools.command(&tools.ptxas);
    cmd.args([&format!("-arch={}", build_ptx::SM), "-v", "-o"])
        .arg(&cubin)
        .arg(&ptx_path);
    println!("xtask: $ {}", util::display_cmd(&cmd));
    let out = util::capture(&mut cmd)?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let log_path = out_dir.join("kernels_gpu.ptxas.log");
    util::write(&log_path, &log)?;
    if !out.status.success() {
        bail!(
            "ptxas rejected {} ({}):\n{log}",
            util::rel(&ptx_path),
            out.status
        );
    }
    let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
    let report = ptxas::parse_ptxas_verbose(&log, &names);

    let mut cmd = tools.command(&tools.cuobjdump);
    cmd.arg("--dump-sass").arg(&cubin);
    let sass = util::stdout_of(&mut cmd)?;
    let sass_path = out_dir.join("kernels_gpu.sass");
    util::write(&sass_path, &sass)?;
    let functions = ptxas::split_sass(&sass);
    let hgmma = |name: &str| {
        functions
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, body)| ptxas::gmma_count(body))
    };
    println!(
        "xtask check-ptx: ptxas + cuobjdump took {:.1}s; full log {}, SASS {}",
        started.elapsed().as_secs_f64(),
        util::rel(&log_path),
        util::rel(&sass_path)
    );

    print_table(&report, &hgmma, KERNELS);
    let mut failures = failures(&report, &ptx_text, &hgmma, KERNELS);
    failures.extend(build_ptx::committed_ptx_mismatch(&root, &ptx_text)?);
    if failures.is_empty() {
        println!(
            "xtask check-ptx: OK ({} kernels, {})",
            KERNELS.len(),
            util::rel(&cubin)
        );
        Ok(())
    } else {
        for f in &failures {
            eprintln!("xtask check-ptx: FAIL: {f}");
        }
        bail!(
            "check-ptx found {} problem(s) (see FAIL lines above)",
            failures.len()
        )
    }
}

fn flags(k: &KernelInfo) -> String {
    let mut f = Vec::new();
    if let Some((n, m)) = k.launch_bounds {
        f.push(format!("bounds {n}x{m}"));
    }
    if k.register_resident {
        f.push("reg-resident".into());
    }
    if k.uses_wgmma {
        f.push("wgmma".into());
    }
    f.join(", ")
}

fn print_table(
    report: &PtxasReport,
    hgmma: &dyn Fn(&str) -> Option<usize>,
    kernels: &[KernelInfo],
) {
    let width = kernels
        .iter()
        .map(|k| k.name.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!();
    println!(
        "{:<width$}  {:>4}  {:>8}  {:>6}  {:>8}  {:>8}  {:>5}  meta",
        "kernel", "regs", "smem", "stack", "spill-st", "spill-ld", "GMMA"
    );
    for k in kernels {
        let hg = hgmma(k.name).map_or("-".to_string(), |n| n.to_string());
        match report.kernel(k.name) {
            Some(r) => println!(
                "{:<width$}  {:>4}  {:>8}  {:>6}  {:>8}  {:>8}  {:>5}  {}",
                k.name,
                r.registers.map_or("?".into(), |n| n.to_string()),
                r.smem_bytes,
                r.stack_frame,
                r.spill_stores,
                r.spill_loads,
                hg,
                flags(k)
            ),
            None => println!("{:<width$}  (not in ptxas output)", k.name),
        }
    }
    println!("(smem = static shared memory in bytes; dynamic shared memory is set at launch)");
    for d in &report.diagnostics {
        println!(
            "ptxas {}: {} [{}]",
            d.code,
            d.line,
            d.kernel.as_deref().unwrap_or("module")
        );
    }
    println!();
}

fn failures(
    report: &PtxasReport,
    ptx_text: &str,
    hgmma: &dyn Fn(&str) -> Option<usize>,
    kernels: &[KernelInfo],
) -> Vec<String> {
    let mut out = Vec::new();
    for d in report
        .diagnostics
        .iter()
        .filter(|d| FATAL_DIAGNOSTICS.contains(&d.code.as_str()))
    {
        let whom = match &d.kernel {
            Some(k) => format!("kernel `{k}`"),
            None => suspects(&d.code, ptx_text),
        };
        out.push(format!("ptxas {} in {whom}: {}", d.code, d.line));
    }
    for k in kernels {
        let Some(r) = report.kernel(k.name) else {
            out.push(format!(
                "kernel `{}` (in meta::KERNELS) was not compiled by ptxas",
                k.name
            ));
            continue;
        };
        if k.register_resident && (r.stack_frame > 0 || r.spill_stores > 0 || r.spill_loads > 0) {
            out.push(format!(
                "kernel `{}` must be register-resident but has a {}-byte stack frame, {} bytes \
                 spill stores, {} bytes spill loads (an array indexed at run time or a loop LLVM \
                 did not unroll puts accumulators in local memory; see kernels-gpu/NOTES.md)",
                k.name, r.stack_frame, r.spill_stores, r.spill_loads
            ));
        }
        if k.uses_wgmma {
            match hgmma(k.name) {
                Some(n) if n > 0 => {}
                Some(_) => out.push(format!(
                    "kernel `{}` uses wgmma (meta) but its SASS has no HGMMA/QGMMA instruction",
                    k.name
                )),
                None => out.push(format!("kernel `{}` has no SASS in the cubin", k.name)),
            }
        }
    }
    out.extend(unacquired_tensor_maps(ptx_text, kernels));
    let missing = ptx::missing_required(ptx_text);
    if !missing.is_empty() {
        let what: Vec<String> = ptx::REQUIRED_PTX
            .iter()
            .filter(|(n, _)| missing.contains(n))
            .map(|(n, why)| format!("`{n}` ({why})"))
            .collect();
        out.push(format!(
            "the PTX lacks {}: issue 2 requires the module to contain them (expected to fail \
             until the kernels that use them are written)",
            what.join(", ")
        ));
    }
    out
}

/// The tensormap-proxy acquire a GEMM entry must execute before it uses a tensor map.
const TENSORMAP_ACQUIRE: &str = "fence.proxy.tensormap::generic.acquire";

/// GEMM entries (kernels that issue `wgmma` and use tensor maps) in which a tensor map is used
/// (`prefetch.tensormap`, `cp.async.bulk.tensor`) before any
/// `fence.proxy.tensormap::generic.acquire`, in text order. Tensor maps live in global memory
/// and the tensormap proxy is not acquired at kernel start; the kernels acquire each map in
/// the thread that uses it, before its first use. Text order is a proxy for program order
/// that holds for the kernels' straight-line prologues; a body with no acquire at all always
/// fails.
fn unacquired_tensor_maps(ptx_text: &str, kernels: &[KernelInfo]) -> Vec<String> {
    let Ok(entries) = ptx::entries(ptx_text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in &entries {
        if !kernels.iter().any(|k| k.name == e.name && k.uses_wgmma) {
            continue;
        }
        let body = e.body(ptx_text);
        let first_use = ["prefetch.tensormap", "cp.async.bulk.tensor"]
            .iter()
            .filter_map(|op| body.find(op))
            .min();
        let Some(first_use) = first_use else {
            continue;
        };
        if body.find(TENSORMAP_ACQUIRE).is_none_or(|at| at > first_use) {
            out.push(format!(
                "kernel `{}` uses a tensor map before any `{TENSORMAP_ACQUIRE}` (tensor maps \
                 live in global memory; acquire each in the thread that uses it, before its \
                 first use)",
                e.name
            ));
        }
    }
    out
}

/// For a diagnostic ptxas printed without naming a kernel, the entries most likely at fault.
fn suspects(code: &str, ptx_text: &str) -> String {
    let Ok(entries) = ptx::entries(ptx_text) else {
        return "the module".into();
    };
    let likely: Vec<&str> = entries
        .iter()
        .filter(|e| match code {
            "C7508" => {
                e.body(ptx_text).contains("setmaxnreg")
                    && !e.directives(ptx_text).contains(".maxntid")
            }
            _ => e.body(ptx_text).contains("wgmma"),
        })
        .map(|e| e.name.as_str())
        .collect();
    if likely.is_empty() {
        "the module (ptxas named no kernel)".into()
    } else if code == "C7508" {
        format!(
            "the module (ptxas named no kernel; setmaxnreg without .maxntid in: {} — give it \
             `launch_bounds` in meta.rs)",
            likely.join(", ")
        )
    } else {
        format!(
            "the module (ptxas named no kernel; kernels using wgmma: {})",
            likely.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn info(name: &'static str, resident: bool, wgmma: bool) -> KernelInfo {
        KernelInfo {
            name,
            launch_bounds: None,
            register_resident: resident,
            uses_wgmma: wgmma,
        }
    }

    const PTX: &str = ".version 8.6\n.target sm_90a\n\
        .visible .entry gemm()\n{\nsetmaxnreg.inc.sync.aligned.u32 232;\n\
        wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 ...;\n\
        fence.proxy.tensormap::generic.acquire.sys [%rd1], 128;\n\
        cp.async.bulk.tensor.2d ...;\ngriddepcontrol.wait;\n}\n\
        .visible .entry add()\n{\nret;\n}\n";

    fn report(gemm_stack: u64, diag: Option<&str>) -> PtxasReport {
        let mut text = String::new();
        if let Some(code) = diag {
            text.push_str(&format!(
                "ptxas info    : ({code}) Potential Performance Loss: x\n"
            ));
        }
        for (name, stack) in [("gemm", gemm_stack), ("add", 0)] {
            text.push_str(&format!(
                "ptxas info    : Compiling entry function '{name}' for 'sm_90a'\n\
                 ptxas info    : Function properties for {name}\n\
                 \x20   {stack} bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                 ptxas info    : Used 168 registers, used 1 barriers\n"
            ));
        }
        ptxas::parse_ptxas_verbose(&text, &["gemm", "add"])
    }

    const TABLE: [KernelInfo; 2] = [info("gemm", true, true), info("add", false, false)];

    #[test]
    fn clean_module_passes() {
        let hg = |n: &str| Some(if n == "gemm" { 4 } else { 0 });
        assert_eq!(
            failures(&report(0, None), PTX, &hg, &TABLE),
            Vec::<String>::new()
        );
    }

    #[test]
    fn gates() {
        let hg = |_: &str| Some(0);
        let f = failures(&report(512, Some("C7508")), PTX, &hg, &TABLE);
        assert_eq!(f.len(), 3, "{f:#?}");
        assert!(f[0].contains("C7508") && f[0].contains("setmaxnreg without .maxntid in: gemm"));
        assert!(f[1].contains("`gemm` must be register-resident") && f[1].contains("512-byte"));
        assert!(f[2].contains("no HGMMA"));
        // Diagnostics outside the gated set are only printed.
        let hg4 = |_: &str| Some(4);
        assert!(failures(&report(0, Some("C7777")), PTX, &hg4, &TABLE).is_empty());
    }

    #[test]
    fn tensor_maps_must_be_acquired_before_use() {
        let hg = |n: &str| Some(if n == "gemm" { 4 } else { 0 });
        let unacquired = PTX.replace(
            "fence.proxy.tensormap::generic.acquire.sys [%rd1], 128;\n",
            "",
        );
        let f = failures(&report(0, None), &unacquired, &hg, &TABLE);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert!(f[0].contains("`gemm` uses a tensor map before"), "{f:#?}");
        // An acquire after the first use does not count.
        let late = unacquired.replace(
            "griddepcontrol.wait;",
            "fence.proxy.tensormap::generic.acquire.sys [%rd1], 128;\ngriddepcontrol.wait;",
        );
        assert_eq!(failures(&report(0, None), &late, &hg, &TABLE).len(), 1);
    }

    #[test]
    fn missing_kernel_and_required_instructions() {
        let hg = |_: &str| Some(4);
        let table = [
            info("gemm", true, true),
            info("add", false, false),
            info("gone", false, false),
        ];
        let f = failures(&report(0, None), ".version 8.6\n", &hg, &table);
        assert!(
            f.iter()
                .any(|m| m.contains("`gone`") && m.contains("not compiled")),
            "{f:#?}"
        );
        assert!(
            f.iter()
                .any(|m| m.contains("wgmma.mma_async") && m.contains("griddepcontrol"))
        );
    }
}
