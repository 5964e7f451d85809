//! `gpumem-trace`: import, replay, summarise and plot allocation traces.

use std::process::ExitCode;

use gpumem_trace::{cli, Error};

fn main() -> ExitCode {
    match cli::run(std::env::args_os(), &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        // --help and --version are "errors" that print to standard output and succeed.
        Err(Error::Usage(text, false)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(Error::Usage(text, true)) => {
            eprint!("{text}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("gpumem-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
