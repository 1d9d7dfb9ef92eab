//! Misuses of `cuda-safe` and `pinned-mem` that must not compile (trybuild):
//! each case in `tests/ui/` is a tiny program with the compiler's expected
//! error beside it (`.stderr`). Regenerate those with `TRYBUILD=overwrite` and
//! review them. The cases in `tests/ui-pass/` must compile and run: what a
//! crate outside the workspace writes instead (the option structs' builders).
//!
//! Skipped (with a note) where there is no Rust toolchain to compile them: when
//! `CUDA_REQUIRED` is set (the GPU machine runs prebuilt test executables) or
//! `cargo` cannot be run.

#[test]
fn misuses_do_not_compile() {
    if std::env::var_os("CUDA_REQUIRED").is_some() {
        eprintln!("note: CUDA_REQUIRED is set (a GPU machine without a toolchain): compile-fail cases skipped");
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let runs = std::process::Command::new(&cargo)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        eprintln!("note: cargo is not on PATH: compile-fail cases skipped");
        return;
    }
    let cases = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/ui"))
        .map(|d| d.filter_map(Result::ok).filter(|e| e.path().extension().is_some_and(|x| x == "rs")).count())
        .unwrap_or(0);
    assert!(cases >= 12, "expected at least 12 compile-fail cases in tests/ui, found {cases}");
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui-pass/*.rs");
}
