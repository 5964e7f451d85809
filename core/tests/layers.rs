//! The layering rule of the crate docs, kept by a test: a module imports only its own layer and
//! the layers below it (error 0; hal and hooks 1; pool 2; runtime 3; the host backend, a backend
//! like the others, above all of them). Inside the typed layer (`runtime`) the same rule holds
//! between its modules, in the order of [`runtime_layer`]. Test modules (`tests.rs`) may use
//! anything.

use std::path::Path;

/// The layer of a source file (by its path under `src/`) or of a top-level module name.
fn layer(module: &str) -> Option<u8> {
    match module {
        "error" => Some(0),
        "hal" | "hooks" => Some(1),
        "pool" => Some(2),
        "runtime" => Some(3),
        "host" => Some(4),
        _ => None,
    }
}

/// The layer of a module of the typed layer (`runtime/`), lowest first: each one's per-thread and
/// per-process state is reached through its own trait (`StateRuntime`, `StreamRuntime`,
/// `AllocatorRuntime`, then `Runtime` over all), so none needs a higher one.
fn runtime_layer(module: &str) -> Option<u8> {
    let order = [
        "state",
        "memory",
        "stream",
        "device",
        "device_allocator",
        "pointer",
        "pinned",
        "pools",
        "allocator",
        "statics",
        "buffer",
        "staging",
        "transfer",
    ];
    order.iter().position(|m| *m == module).map(|i| u8::try_from(i).unwrap())
}

/// The upward imports in `source`, a file of module `module`: `(line number, module it names)`.
fn upward_imports(module: &str, source: &str) -> Vec<(usize, String)> {
    upward_imports_by(layer, "crate::", module, source)
}

/// The imports in `source`, a file of module `module`, of modules named after `prefix` whose
/// `layer` is above `module`'s.
fn upward_imports_by(
    layer: fn(&str) -> Option<u8>,
    prefix: &str,
    module: &str,
    source: &str,
) -> Vec<(usize, String)> {
    let Some(own) = layer(module) else { return Vec::new() };
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices(prefix) {
            let before = code[..i].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let name: String =
                code[i + prefix.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if let Some(l) = layer(&name) {
                if l > own {
                    found.push((n + 1, name));
                }
            }
        }
    }
    found
}

fn module_of(path: &Path, src: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_layer_imports_a_higher_one() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "the scan found the sources");
    let mut violations = Vec::new();
    for path in files {
        // Unit tests may drive a layer through the host backend.
        if path.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let module = module_of(&path, &src);
        let source = std::fs::read_to_string(&path).unwrap();
        for (line, name) in upward_imports(&module, &source) {
            violations.push(format!("{}:{line}: layer `{module}` imports `crate::{name}`", path.display()));
        }
    }
    assert!(violations.is_empty(), "upward imports:\n{}", violations.join("\n"));
}

#[test]
fn no_module_of_the_typed_layer_imports_a_higher_one() {
    let runtime = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join("runtime");
    let mut files = Vec::new();
    rust_files(&runtime, &mut files);
    let mut violations = Vec::new();
    let mut seen = 0;
    for path in files {
        let module = module_of(&path, &runtime);
        if path.file_name().is_some_and(|n| n == "tests.rs") || module == "mod" {
            continue;
        }
        assert!(runtime_layer(&module).is_some(), "`runtime/{module}` has a place in `runtime_layer`");
        seen += 1;
        let source = std::fs::read_to_string(&path).unwrap();
        for (line, name) in upward_imports_by(runtime_layer, "crate::runtime::", &module, &source) {
            violations
                .push(format!("{}:{line}: `runtime::{module}` imports `runtime::{name}`", path.display()));
        }
    }
    assert!(seen > 20, "the scan found the typed layer's sources");
    assert!(violations.is_empty(), "upward imports in the typed layer:\n{}", violations.join("\n"));
}

#[test]
fn the_check_sees_an_upward_import() {
    let pool_file = "use crate::error::Result;\nuse crate::runtime::stream::Stream;\n";
    assert_eq!(upward_imports("pool", pool_file), vec![(2, "runtime".to_owned())]);
    assert_eq!(upward_imports("hal", "use crate::pool::Pool; // a comment: crate::runtime\n").len(), 1);
    assert!(upward_imports("runtime", "use crate::pool::Pool;\nuse crate::hal::Api;\n").is_empty());
    assert!(upward_imports("hal", "use crate::error::Result;\nfn f() { $crate::runtime::x() }\n").is_empty());
    let state_file = "use crate::runtime::stream::Stream;\n";
    assert_eq!(upward_imports_by(runtime_layer, "crate::runtime::", "state", state_file).len(), 1);
    assert!(upward_imports_by(
        runtime_layer,
        "crate::runtime::",
        "stream",
        "use crate::runtime::state::X;\n"
    )
    .is_empty());
}
