//! Generates the C header from the Rust sources with cbindgen (pinned in Cargo.toml) into
//! OUT_DIR; the `header_is_fresh` test compares it with the committed include/mxnet/c_api.h.
//! Also gives libmxnet.so its SONAME so consumers record `libmxnet.so`, not a build path.

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("c_api.h");
    // cbindgen parses the whole crate, so any source change may change the header.
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml must parse");
    match cbindgen::generate_with_config(&crate_dir, config) {
        Ok(bindings) => {
            bindings.write_to_file(&out);
        }
        Err(e) => panic!("cbindgen failed: {e}"),
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmxnet.so");
    }
}
