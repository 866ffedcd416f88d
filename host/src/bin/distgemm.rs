//! The `distgemm` binary: see [`distgemm::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = distgemm::cli::main_with(
        std::env::args_os(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}
