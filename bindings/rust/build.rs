//! Links libmxnet.so: from `MXNET_RT_LIB_DIR`, else the checkout's `target/release` (build it
//! first with `cargo build --release --lib` at the top). The directory is also put in the
//! executables' run path, so examples and tests run without `LD_LIBRARY_PATH`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=MXNET_RT_LIB_DIR");
    let dir = match std::env::var_os("MXNET_RT_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../target/release"),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    if !dir.join("libmxnet.so").is_file() {
        println!(
            "cargo:warning=libmxnet.so not found in {}: build it with `cargo build --release --lib` at the \
             repository's top, or set MXNET_RT_LIB_DIR",
            dir.display()
        );
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=mxnet");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
}
