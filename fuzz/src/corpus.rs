//! Running a target over stored inputs: the corpus replay of `cargo test`, and the targets'
//! plain (not fuzzing) builds, which run the files named on their command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The files of `dir` (not recursive), sorted, so a replay is the same on every machine; none
/// when `dir` does not exist.
///
/// # Panics
///
/// When `dir` exists but cannot be read.
#[must_use]
pub fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// The folder of the stored inputs of `target`: `fuzz/corpus/<target>`, or `fuzz/open/<target>`
/// for the inputs of findings still open.
#[must_use]
pub fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(kind).join(target)
}

/// Runs `target` on every file named on the command line (a folder: on each file in it), saying
/// which file it runs first, so that a panic names its input.
pub fn run_named_files(target: fn(&[u8])) -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if args.is_empty() {
        eprintln!("usage: {} FILE_OR_FOLDER...", std::env::args().next().unwrap_or_default());
        return ExitCode::from(2);
    }
    let mut n = 0;
    for arg in args {
        let files = if arg.is_dir() { files_in(&arg) } else { vec![arg] };
        for file in files {
            match std::fs::read(&file) {
                Ok(data) => {
                    eprintln!("running {}", file.display());
                    target(&data);
                    n += 1;
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    eprintln!("{n} inputs ran without a finding");
    ExitCode::SUCCESS
}
