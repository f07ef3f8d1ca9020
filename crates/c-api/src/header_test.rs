//! The committed header must equal what cbindgen generates from the current sources.

#[test]
fn header_is_fresh() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/c_api.h"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include/mxnet/c_api.h");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != generated {
        if std::env::var_os("MXNET_RT_BLESS").is_some() {
            std::fs::write(path, generated).unwrap();
        } else {
            panic!("include/mxnet/c_api.h is stale: run MXNET_RT_BLESS=1 cargo test -p mxnet-rt --lib header_is_fresh");
        }
    }
}
