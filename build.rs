//! With the `bpf` feature, compiles the kernel side of the `postgres.syncs`
//! collector (src/ebpf/syncs.bpf.c) into `$OUT_DIR/syncs.bpf.o`, which the
//! binary embeds. Without it nothing runs, so a machine without clang builds
//! the exporter (the collector then reports `not_built`).

// A build script reports failure by panicking: cargo prints the message.
#![allow(clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_BPF").is_none() {
        return;
    }
    let src = "src/ebpf/syncs.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("syncs.bpf.o");
    let clang = std::env::var("BPF_CLANG").unwrap_or_else(|_| "clang".to_string());
    // <asm/types.h>, which <linux/types.h> includes, lives under the
    // multiarch directory on Debian.
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64",
        Ok("aarch64") => "aarch64",
        Ok(other) => panic!("the bpf feature has no include path for target arch {other}"),
        Err(_) => "x86_64",
    };
    // -g: the BTF the loader relocates field offsets with (CO-RE).
    let status = Command::new(&clang)
        .args(["-g", "-O2", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I/usr/include/{arch}-linux-gnu"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{clang} failed on {src} ({s}): the bpf feature needs clang and libbpf's headers (Debian: apt-get install clang libbpf-dev)"
        ),
        Err(e) => panic!(
            "cannot run {clang}: {e}: the bpf feature needs clang and libbpf's headers (Debian: apt-get install clang libbpf-dev), or build without it"
        ),
    }
}
