//! Create arrays, invoke operators, wait, read back and profile, through the safe binding.
//!
//!     cargo run --manifest-path bindings/rust/Cargo.toml --example demo [trace.json]

use mxnet::{invoke, profiler, wait_all, NDArray};

fn main() -> Result<(), mxnet::Error> {
    let trace = std::env::args().nth(1).unwrap_or_else(|| "rust_demo_profile.json".to_string());
    println!("libmxnet implements MXNet {}", mxnet::version()?);
    profiler::set_config(&[("filename", &trace), ("profile_all", "true"), ("aggregate_stats", "true")])?;
    profiler::set_running(true)?;

    let x = NDArray::from_slice(&[2, 3], &[1.0, -2.0, 3.0, -4.0, 5.0, -6.0])?;
    let w = NDArray::from_slice(&[4, 3], &[0.5; 12])?;
    let b = NDArray::from_slice(&[4], &[0.0, 1.0, 2.0, 3.0])?;
    // y = relu(x · wᵀ + b), queued on the engine.
    let y = invoke("FullyConnected", &[&x, &w, &b], &[("num_hidden", "4")])?.remove(0);
    let y = invoke("Activation", &[&y], &[("act_type", "relu")])?.remove(0);
    wait_all()?;
    let values = y.to_vec()?;
    println!("relu(x·wᵀ + b) of shape {:?}: {values:?}", y.shape()?);
    assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.5]);

    // A library error arrives as a Result with its class.
    match invoke("dot", &[&x, &x], &[]) {
        Err(e) => println!(
            "as expected, dot of (2, 3) by (2, 3) fails: {:?}: {}",
            e.kind,
            e.message.lines().next().unwrap_or("")
        ),
        Ok(_) => panic!("dot of mismatched shapes succeeded"),
    }

    profiler::set_running(false)?;
    profiler::dump(true)?;
    let summary = profiler::summary()?;
    assert!(summary.contains("FullyConnected"), "the profile lists the operators:\n{summary}");
    println!("profile written to {trace}; aggregate table has {} lines", summary.lines().count());
    Ok(())
}
