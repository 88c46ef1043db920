//! `hira-bench cuda-samples` end to end on a real cuda-samples checkout: a few of
//! NVIDIA's samples built by nvcc 13 (one with a size edit, one linking the driver API
//! directly), run natively and through Hira on the CPU test executor, compared, and
//! each counted only where it passed its own check natively.
//!
//! The samples are not vendored and CI cannot fetch them (no network): the test runs
//! when `HIRA_CUDA_SAMPLES` names a checkout and says so when it skips.

mod common;

#[test]
fn cuda_samples_give_identical_output_through_hira() {
    let Some(src) = std::env::var_os("HIRA_CUDA_SAMPLES") else {
        eprintln!(
            "skipped: set HIRA_CUDA_SAMPLES to a cuda-samples checkout (not vendored; CI has no network)"
        );
        return;
    };
    common::assert_all_identical(
        &[
            "cuda-samples",
            "--only",
            "vectorAdd,simpleVoteIntrinsics,reduction,deviceQueryDrv,mergeSort,SobolQRNG",
        ],
        &src,
        6,
        "| yes | exit 0 | exit 0 |",
    );
}
