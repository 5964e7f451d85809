//! `include/gpumem.h` is kept in step with the code by this test: every exported function of
//! `src/lib.rs` and the files of its other entry points must be declared in the header with the C types of its Rust signature, nothing
//! else may be declared, and `gpumem_stats` must have `GpumemStats`'s fields, in order, with the
//! matching C types.
//!
//! Both files are embedded at compile time, so the test also runs where the sources are not.

const RUST: &str = include_str!("../src/lib.rs");
/// The files with entry points besides `lib.rs`.
const MORE_RUST: [&str; 6] = [
    include_str!("../src/summary.rs"),
    include_str!("../src/snapshot.rs"),
    include_str!("../src/recorder.rs"),
    include_str!("../src/oom.rs"),
    include_str!("../src/record_stream.rs"),
    include_str!("../src/step.rs"),
];
const HEADER: &str = include_str!("../include/gpumem.h");

/// The C spelling of each Rust type the ABI uses.
fn c_type(rust: &str) -> String {
    let rust = rust.trim();
    let mapped = match rust {
        "" | "()" => "void",
        "c_int" => "int",
        "c_double" => "double",
        "usize" => "size_t",
        "isize" => "ssize_t",
        "u64" => "uint64_t",
        "i64" => "int64_t",
        "*mut c_char" => "char*",
        "GpumemOomObserver" => "gpumem_oom_observer",
        "CudaStream" => "cudaStream_t",
        "*mut c_void" => "void*",
        "*const c_char" => "const char*",
        "*mut usize" => "size_t*",
        "*mut GpumemStats" => "gpumem_stats*",
        other => panic!("no C spelling for the Rust type {other:?}: add it to this table and the header"),
    };
    mapped.to_owned()
}

/// A C type with spaces normalised: `const char *` and `const char*` compare equal.
fn normalise(c: &str) -> String {
    let words: Vec<&str> = c.split_whitespace().collect();
    words.join(" ").replace(" *", "*").replace("* ", "*")
}

#[derive(Debug, PartialEq, Eq)]
struct Signature {
    name: String,
    ret: String,
    params: Vec<String>,
}

/// The text between the first `(` at or after `from` and its matching `)`, and the index after it.
fn parenthesised(text: &str, from: usize) -> (&str, usize) {
    let open = from + text[from..].find('(').expect("an opening parenthesis");
    let mut depth = 0;
    for (i, ch) in text[open..].char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return (&text[open + 1..open + i], open + i + 1);
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses");
}

fn rust_signatures() -> Vec<Signature> {
    std::iter::once(RUST).chain(MORE_RUST).flat_map(signatures_in).collect()
}

fn signatures_in(source: &'static str) -> Vec<Signature> {
    let mut out = Vec::new();
    let mut rest = 0;
    while let Some(at) = source[rest..].find("extern \"C\" fn ") {
        let start = rest + at + "extern \"C\" fn ".len();
        let name_end = start + source[start..].find('(').expect("a parameter list");
        let name = source[start..name_end].trim().to_owned();
        let (params, after) = parenthesised(source, name_end);
        let body = after + source[after..].find('{').expect("a body");
        let ret = source[after..body].trim().trim_start_matches("->").trim();
        let params = params
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| c_type(p.split_once(':').expect("name: type").1))
            .collect();
        out.push(Signature { name, ret: c_type(ret), params });
        rest = body;
    }
    out
}

fn header_signatures() -> Vec<Signature> {
    let mut out = Vec::new();
    for line in HEADER.lines() {
        let line = line.trim();
        let Some(open) = line.find("(") else { continue };
        if !line.ends_with(");")
            || line.starts_with('#')
            || line.starts_with('/')
            || line.starts_with('*')
            || line.starts_with("typedef")
        {
            continue;
        }
        let head = &line[..open];
        let name_start = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let name = head[name_start..].to_owned();
        assert!(name.starts_with("gpumem_"), "a declaration that is not gpumem's: {line}");
        let (params, _) = parenthesised(line, open);
        let params: Vec<String> = if params.trim() == "void" {
            Vec::new()
        } else {
            params
                .split(',')
                .map(|p| {
                    let p = p.trim();
                    let cut =
                        p.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).expect("a type and a name");
                    normalise(&p[..=cut])
                })
                .collect()
        };
        out.push(Signature { name, ret: normalise(&head[..name_start]), params });
    }
    out
}

#[test]
fn every_exported_function_is_declared_with_its_c_types() {
    let rust = rust_signatures();
    let header = header_signatures();
    assert!(rust.len() >= 15, "the scan found only {} exported functions", rust.len());
    for r in &rust {
        let h = header
            .iter()
            .find(|h| h.name == r.name)
            .unwrap_or_else(|| panic!("{} is not in gpumem.h", r.name));
        assert_eq!(h, r, "gpumem.h declares {} differently from src/lib.rs", r.name);
    }
    for h in &header {
        assert!(
            rust.iter().any(|r| r.name == h.name),
            "gpumem.h declares {}, which src/lib.rs does not export",
            h.name
        );
    }
    // Every exported function is `#[no_mangle]`, else the header's name would not link.
    let no_mangle: usize =
        std::iter::once(RUST).chain(MORE_RUST).map(|s| s.matches("#[no_mangle]").count()).sum();
    assert_eq!(no_mangle, rust.len());
}

#[test]
fn stats_struct_matches() {
    let start =
        RUST.find("pub struct GpumemStats {").expect("GpumemStats") + "pub struct GpumemStats {".len();
    let end = start + RUST[start..].find("\n}").expect("end of GpumemStats");
    let rust: Vec<(String, String)> = RUST[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("pub "))
        .map(|l| {
            let (name, ty) =
                l.trim_start_matches("pub ").trim_end_matches(',').split_once(':').expect("field");
            (name.trim().to_owned(), c_type(ty))
        })
        .collect();
    let start = HEADER.find("typedef struct gpumem_stats {").expect("gpumem_stats")
        + "typedef struct gpumem_stats {".len();
    let end = start + HEADER[start..].find("} gpumem_stats;").expect("end of gpumem_stats");
    let header: Vec<(String, String)> = HEADER[start..end]
        .lines()
        .filter_map(|l| l.split_once(';'))
        .map(|(decl, _)| {
            let (ty, name) = decl.trim().rsplit_once(' ').expect("type and name");
            (name.to_owned(), normalise(ty))
        })
        .collect();
    assert_eq!(rust.len(), 15);
    assert_eq!(header, rust);
}
