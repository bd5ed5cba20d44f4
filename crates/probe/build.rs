use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/probe.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    let target_arch = match arch.as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        other => other,
    };
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            format!("-D__TARGET_ARCH_{target_arch}"),
            "-Isrc/bpf".to_string(),
            "-Wall".to_string(),
            // Atomic fetch-and-add with its result (BPF ISA v3, kernels since 5.12).
            "-mcpu=v3".to_string(),
        ])
        .build_and_generate(out.join("probe.skel.rs"))
        .unwrap_or_else(|e| panic!("building the BPF program {SRC} failed (is clang installed? run `make deps`): {e:#}"));
    println!("cargo:rerun-if-changed=src/bpf");
}
