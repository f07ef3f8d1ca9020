//! The layer rule of this crate's top-level modules (see the crate's doc): each may use only
//! modules of lower layers, so the modules form no cycle and the order reads bottom-up.

/// Lowest first; modules in one inner list are one layer and may not use each other.
const LAYERS: &[&[&str]] = &[
    &["error", "sync", "heap"],
    &["cuda"],
    &["context", "intern"],
    &["config"],
    &["storage"],
    &["profiler"],
    &["runtime"],
    &["engine"],
    &["ndarray"],
    &["op"],
    &["autograd"],
    &["symbol"],
    &["executor"],
    &["data", "kvstore"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level modules named by `crate::name` or `crate::{a, b::c}` in `text`.
fn used_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                out.push(name);
            }
        } else {
            out.push(rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_is_in_a_layer_and_uses_only_lower_ones() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_str().unwrap();
        let module = first.trim_end_matches(".rs");
        if module == "lib" || module == "layers" {
            continue;
        }
        let Some(own) = layer_of(module) else {
            wrong.push(format!("{}: module {module} is in no layer of LAYERS", rel.display()));
            continue;
        };
        for used in used_modules(&std::fs::read_to_string(f).unwrap()) {
            let is_module = src.join(&used).is_dir() || src.join(format!("{used}.rs")).is_file();
            if used == module || !is_module {
                continue; // itself, or an item of the crate root (a macro, `Result`)
            }
            match layer_of(&used) {
                Some(l) if l < own => {}
                _ => wrong.push(format!("{}: {module} (layer {own}) uses {used}", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that do not point down:\n{}", wrong.join("\n"));
}

#[test]
fn the_scanner_sees_paths_and_groups() {
    let uses = used_modules("use crate::engine::Var; use crate::{op, ndarray::NDArray}; x = crate::sync::Mutex::new");
    assert_eq!(uses, ["engine", "op", "ndarray", "sync"]);
}
