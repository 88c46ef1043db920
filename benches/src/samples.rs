//! `hira-bench cuda-samples`: programs of NVIDIA's cuda-samples, built by nvcc 13 the
//! default way (static runtime, `-O2`) from a checkout the operator provides, run
//! natively and through Hira on the same driver, and compared as Rodinia's programs
//! are ([`crate::rodinia`]): exit status, standard output and error with timings
//! masked, every file written. A row counts only where the native run passed the
//! sample's own check ([`Program::expect`]), so a driver that runs nothing cannot pass.
//!
//! The selection: every sample that needs no graphics API, no CUDA library beyond the
//! runtime (cuBLAS, cuFFT, cuRAND's host side, NPP), no NVRTC and no second GPU, and
//! that the CPU test executor runs (see docs/cuda.md for those left out and why).
//! Sizes: where a sample takes no size argument and its fixed size would take the
//! executor many minutes, its size constant is edited down ([`Program::edits`]); both
//! sides run the same edited binary.

use crate::rodinia::Program;

/// Lines whose numbers are measurements: rates, clocks and times, and how much the
/// CPU did while it waited (asyncAPI).
const TIMINGS: &[&str] = &[
    r"(?i)GB/s|gflop|throughput|performance|gsamples|options/s|bandwidth|clocks/block|msec|processing time|elapsed time|mpix/s",
    r"CPU executed \d+ iterations",
];

/// A sample built from `files` in `Samples/DIR`, whose native run prints `expect`.
macro_rules! sample {
    ($dir:literal, $exe:literal, $args:literal, $files:literal, $expect:expr) => {
        sample!($dir, $exe, $args, $files, $expect, "")
    };
    ($dir:literal, $exe:literal, $args:literal, $files:literal, $expect:expr, $flags:literal) => {
        Program {
            timing_lines: TIMINGS,
            expect: $expect,
            ..Program::cuda(
                $dir,
                $exe,
                $args,
                concat!(
                    "$NVCC -O2 -I$SAMPLES_INC ",
                    $flags,
                    " -o ",
                    $exe,
                    " ",
                    $files
                ),
            )
        }
    };
}

/// The selection, by the checkout's categories.
pub const SAMPLES: &[Program] = &[
    // 0_Introduction
    sample!(
        "0_Introduction/asyncAPI",
        "asyncAPI",
        "",
        "asyncAPI.cu",
        Some("CPU executed")
    ),
    sample!(
        "0_Introduction/clock",
        "clock",
        "",
        "clock.cu",
        Some("Average clocks/block")
    ),
    sample!(
        "0_Introduction/cudaOpenMP",
        "cudaOpenMP",
        "",
        "cudaOpenMP.cu",
        Some("CPU thread 0 .* uses CUDA device 0"),
        "-Xcompiler -fopenmp -lgomp"
    ),
    sample!(
        "0_Introduction/matrixMul",
        "matrixMul",
        "-wA=64 -hA=64 -wB=64 -hB=64",
        "matrixMul.cu",
        Some("Result = PASS")
    ),
    Program {
        edits: &[(
            "main.cpp",
            "const uint N         = 4 * 1048576;",
            "const uint N = 65536;",
        )],
        ..sample!(
            "0_Introduction/mergeSort",
            "mergeSort",
            "",
            "bitonic.cu main.cpp mergeSort.cu mergeSort_host.cpp mergeSort_validate.cpp",
            Some("inspecting keys and values array: OK")
        )
    },
    sample!(
        "0_Introduction/simpleAtomicIntrinsics",
        "simpleAtomicIntrinsics",
        "",
        "simpleAtomicIntrinsics.cu simpleAtomicIntrinsics_cpu.cpp",
        Some("completed, returned OK")
    ),
    sample!(
        "0_Introduction/simpleCallback",
        "simpleCallback",
        "",
        "multithreading.cpp simpleCallback.cu",
        Some("workloads finished:\nSuccess")
    ),
    sample!(
        "0_Introduction/simpleCooperativeGroups",
        "simpleCooperativeGroups",
        "",
        "simpleCooperativeGroups.cu",
        Some("tiledPartition16 group is 120 \\(expected 120\\)")
    ),
    sample!(
        "0_Introduction/simpleHyperQ",
        "simpleHyperQ",
        "",
        "simpleHyperQ.cu",
        Some("Measured time for sample")
    ),
    Program {
        edits: &[(
            "simpleMultiCopy.cu",
            "N = (int)((float)N / scale_factor);",
            "N = (int)((float)N / scale_factor) / 16;",
        )],
        ..sample!(
            "0_Introduction/simpleMultiCopy",
            "simpleMultiCopy",
            "",
            "simpleMultiCopy.cu",
            Some("Overlapped using 4 streams")
        )
    },
    sample!(
        "0_Introduction/simpleMultiGPU",
        "simpleMultiGPU",
        "",
        "simpleMultiGPU.cu",
        Some("Relative difference")
    ),
    sample!(
        "0_Introduction/simpleOccupancy",
        "simpleOccupancy",
        "",
        "simpleOccupancy.cu",
        Some("Test PASSED")
    ),
    sample!(
        "0_Introduction/simplePrintf",
        "simplePrintf",
        "",
        "simplePrintf.cu",
        Some("\\[3, 7\\]:\\s+Value is:10")
    ),
    sample!(
        "0_Introduction/simpleTemplates",
        "simpleTemplates",
        "",
        "simpleTemplates.cu",
        Some("Test Results: 0 Failures")
    ),
    sample!(
        "0_Introduction/simpleVoteIntrinsics",
        "simpleVoteIntrinsics",
        "",
        "simpleVoteIntrinsics.cu",
        Some("(?s)Test 3/3.*OK")
    ),
    sample!(
        "0_Introduction/template",
        "template",
        "",
        "template.cu template_cpu.cpp",
        Some("Processing time")
    ),
    sample!(
        "0_Introduction/vectorAdd",
        "vectorAdd",
        "",
        "vectorAdd.cu",
        Some("Test PASSED")
    ),
    // Arrays, texture objects and surface objects.
    sample!(
        "0_Introduction/simpleTexture",
        "simpleTexture",
        "",
        "simpleTexture.cu",
        Some("simpleTexture completed, returned OK")
    ),
    Program {
        timing_lines: TIMINGS,
        // The driver API: its kernels are a fatbin it loads with `cuModuleLoad`,
        // built beside it as its CMake rule builds it; its verdict is its exit
        // status, after it compares its output image with the reference.
        expect: Some("Comparing files"),
        ..Program::cuda(
            "0_Introduction/simpleTextureDrv",
            "simpleTextureDrv",
            "",
            "$NVCC -O2 -I$SAMPLES_INC -fatbin -o simpleTexture_kernel64.fatbin \
             simpleTexture_kernel.cu && $NVCC -O2 -I$SAMPLES_INC -o simpleTextureDrv \
             simpleTextureDrv.cpp -lcuda",
        )
    },
    sample!(
        "0_Introduction/simpleSurfaceWrite",
        "simpleSurfaceWrite",
        "",
        "simpleSurfaceWrite.cu",
        Some("simpleSurfaceWrite completed, returned OK")
    ),
    Program {
        edits: &[
            (
                "simplePitchLinearTexture.cu",
                "const int nx = 2048;",
                "const int nx = 256;",
            ),
            (
                "simplePitchLinearTexture.cu",
                "const int ny = 2048;",
                "const int ny = 256;",
            ),
            (
                "simplePitchLinearTexture.cu",
                "#define NUM_REPS 100",
                "#define NUM_REPS 2",
            ),
        ],
        ..sample!(
            "0_Introduction/simplePitchLinearTexture",
            "simplePitchLinearTexture",
            "",
            "simplePitchLinearTexture.cu",
            Some("simplePitchLinearTexture completed, returned OK")
        )
    },
    // No verdict line: its exit status says whether the comparison passed.
    sample!(
        "0_Introduction/simpleLayeredTexture",
        "simpleLayeredTexture",
        "",
        "simpleLayeredTexture.cu",
        Some("Comparing kernel output to expected data")
    ),
    // 1_Utilities
    sample!(
        "1_Utilities/deviceQuery",
        "deviceQuery",
        "",
        "deviceQuery.cpp",
        Some("Result = PASS")
    ),
    sample!(
        "1_Utilities/deviceQueryDrv",
        "deviceQueryDrv",
        "",
        "deviceQueryDrv.cpp",
        Some("Result = PASS"),
        "-lcuda"
    ),
    sample!(
        "1_Utilities/topologyQuery",
        "topologyQuery",
        "",
        "topologyQuery.cu",
        Some("Atomic Supported")
    ),
    // 2_Concepts_and_Techniques
    Program {
        edits: &[(
            "main.cpp",
            "const int imageW     = 3072;\n    const int imageH     = 3072;\n    const int iterations = 16;",
            "const int imageW     = 384;\n    const int imageH     = 384;\n    const int iterations = 1;",
        )],
        ..sample!(
            "2_Concepts_and_Techniques/convolutionSeparable",
            "convolutionSeparable",
            "",
            "convolutionSeparable.cu convolutionSeparable_gold.cpp main.cpp",
            Some("Test passed")
        )
    },
    Program {
        edits: &[(
            "main.cpp",
            "const int          imageW     = 3072;\n    const int          imageH     = 3072 / 2;\n    const unsigned int iterations = 10;",
            "const int          imageW     = 384;\n    const int          imageH     = 192;\n    const unsigned int iterations = 1;",
        )],
        ..sample!(
            "2_Concepts_and_Techniques/convolutionTexture",
            "convolutionTexture",
            "",
            "convolutionTexture.cu convolutionTexture_gold.cpp main.cpp",
            Some("Test passed")
        )
    },
    sample!(
        "2_Concepts_and_Techniques/dct8x8",
        "dct8x8",
        "",
        "dct8x8.cu BmpUtil.cpp DCT8x8_Gold.cpp",
        Some("Test passed")
    ),
    sample!(
        "2_Concepts_and_Techniques/eigenvalues",
        "eigenvalues",
        "--iters-timing=1",
        "bisect_large.cu bisect_small.cu bisect_util.cu gerschgorin.cpp main.cu matlab.cpp",
        Some("Test Succeeded")
    ),
    Program {
        edits: &[
            (
                "main.cpp",
                "const int          numRuns    = 16;",
                "const int          numRuns    = 1;",
            ),
            (
                "main.cpp",
                "uint                byteCount    = 64 * 1048576;",
                "uint                byteCount    = 1048576;",
            ),
        ],
        ..sample!(
            "2_Concepts_and_Techniques/histogram",
            "histogram",
            "",
            "histogram256.cu histogram64.cu histogram_gold.cpp main.cpp",
            Some("Test passed")
        )
    },
    sample!(
        "2_Concepts_and_Techniques/inlinePTX",
        "inlinePTX",
        "",
        "inlinePTX.cu",
        Some("Test Successful")
    ),
    sample!(
        "2_Concepts_and_Techniques/reduction",
        "reduction",
        "--n=65536",
        "reduction.cpp reduction_kernel.cu",
        Some("Test passed")
    ),
    sample!(
        "2_Concepts_and_Techniques/scalarProd",
        "scalarProd",
        "",
        "scalarProd.cu scalarProd_cpu.cpp",
        Some("Test passed")
    ),
    Program {
        edits: &[
            (
                "main.cpp",
                "const uint          N      = 13 * 1048576 / 2;",
                "const uint          N      = 262144;",
            ),
            (
                "main.cpp",
                "const int iCycles = 100;",
                "const int iCycles = 1;",
            ),
        ],
        ..sample!(
            "2_Concepts_and_Techniques/scan",
            "scan",
            "",
            "main.cpp scan.cu scan_gold.cpp",
            Some("(?s)Validating the results.*Results Match")
        )
    },
    sample!(
        "2_Concepts_and_Techniques/shfl_scan",
        "shfl_scan",
        "",
        "shfl_scan.cu",
        Some("CheckSum: 2073600, \\(expect 1920x1080=2073600\\)")
    ),
    Program {
        edits: &[(
            "main.cpp",
            "const uint N             = 1048576;",
            "const uint N             = 65536;",
        )],
        ..sample!(
            "2_Concepts_and_Techniques/sortingNetworks",
            "sortingNetworks",
            "",
            "bitonicSort.cu main.cpp oddEvenMergeSort.cu sortingNetworks_validate.cpp",
            Some("inspecting keys and values array: OK")
        )
    },
    sample!(
        "2_Concepts_and_Techniques/threadFenceReduction",
        "threadFenceReduction",
        "--n=65536",
        "threadFenceReduction.cu",
        // No verdict printed: its exit status is the comparison of the two results.
        Some("CPU result = ")
    ),
    sample!(
        "2_Concepts_and_Techniques/streamOrderedAllocation",
        "streamOrderedAllocation",
        "",
        "streamOrderedAllocation.cu",
        Some("streamOrderedAllocationPostSync PASSED")
    ),
    // 3_CUDA_Features
    sample!(
        "3_CUDA_Features/binaryPartitionCG",
        "binaryPartitionCG",
        "",
        "binaryPartitionCG.cu",
        Some("Num of Odds = \\d+ Sum of Odds")
    ),
    Program {
        edits: &[(
            "graphMemoryFootprint.cu",
            "size_t bytes  = 64 * 1024 * 1024;",
            "size_t bytes = 64 * 1024;",
        )],
        ..sample!(
            "3_CUDA_Features/graphMemoryFootprint",
            "graphMemoryFootprint",
            "",
            "graphMemoryFootprint.cu",
            Some("Check confirms all graphs use a different virtual address.")
        )
    },
    Program {
        edits: &[("jacobi.h", "#define N_ROWS 512", "#define N_ROWS 128")],
        ..sample!(
            "3_CUDA_Features/jacobiCudaGraphs",
            "jacobiCudaGraphs",
            "",
            "main.cpp jacobi.cu",
            Some("jacobiCudaGraphs PASSED")
        )
    },
    sample!(
        "3_CUDA_Features/simpleCudaGraphs",
        "simpleCudaGraphs",
        "",
        "simpleCudaGraphs.cu",
        Some("Num of nodes in the graph created using stream capture API = 7")
    ),
    Program {
        edits: &[
            (
                "StreamPriorities.cu",
                "#define TOTAL_SIZE 256 * 1024 * 1024",
                "#define TOTAL_SIZE 16 * 1024 * 1024",
            ),
            (
                "StreamPriorities.cu",
                "#define EACH_SIZE  128 * 1024 * 1024",
                "#define EACH_SIZE  8 * 1024 * 1024",
            ),
        ],
        ..sample!(
            "3_CUDA_Features/StreamPriorities",
            "StreamPriorities",
            "",
            "StreamPriorities.cu",
            Some("HI  priority stream")
        )
    },
    Program {
        edits: &[(
            "warpAggregatedAtomicsCG.cu",
            "#define NUM_ELEMS             10000000",
            "#define NUM_ELEMS             1024000",
        )],
        ..sample!(
            "3_CUDA_Features/warpAggregatedAtomicsCG",
            "warpAggregatedAtomicsCG",
            "",
            "warpAggregatedAtomicsCG.cu",
            Some("Warp Aggregated Atomics PASSED")
        )
    },
    // 5_Domain_Specific
    Program {
        edits: &[(
            "binomialOptions_common.h",
            "#define MAX_OPTIONS 1024",
            "#define MAX_OPTIONS 64",
        )],
        ..sample!(
            "5_Domain_Specific/binomialOptions",
            "binomialOptions",
            "",
            "binomialOptions.cpp binomialOptions_gold.cpp binomialOptions_kernel.cu",
            Some("Test passed")
        )
    },
    Program {
        edits: &[
            (
                "BlackScholes.cu",
                "const int OPT_N          = 4000000;",
                "const int OPT_N          = 40000;",
            ),
            (
                "BlackScholes.cu",
                "const int NUM_ITERATIONS = 512;",
                "const int NUM_ITERATIONS = 1;",
            ),
        ],
        ..sample!(
            "5_Domain_Specific/BlackScholes",
            "BlackScholes",
            "",
            "BlackScholes.cu BlackScholes_gold.cpp",
            Some("Test passed")
        )
    },
    sample!(
        "5_Domain_Specific/dwtHaar1D",
        "dwtHaar1D",
        "",
        "dwtHaar1D.cu",
        Some("Test success")
    ),
    Program {
        edits: &[(
            "fastWalshTransform.cu",
            "const int log2Data   = 23;",
            "const int log2Data   = 18;",
        )],
        ..sample!(
            "5_Domain_Specific/fastWalshTransform",
            "fastWalshTransform",
            "",
            "fastWalshTransform.cu fastWalshTransform_gold.cpp",
            Some("Test passed")
        )
    },
    sample!(
        "5_Domain_Specific/FDTD3d",
        "FDTD3d",
        "--dimx=96 --dimy=96 --dimz=96 --timesteps=2",
        "src/FDTD3d.cpp src/FDTD3dGPU.cu src/FDTD3dReference.cpp",
        Some("CompareData"),
        "-Iinc"
    ),
    Program {
        edits: &[(
            "main.cpp",
            "const int nSolverIters = 500;",
            "const int nSolverIters = 20;",
        )],
        // Its verdict is its exit status: the flow's L1 error against the CPU's.
        ..sample!(
            "5_Domain_Specific/HSOpticalFlow",
            "HSOpticalFlow",
            "",
            "flowCUDA.cu flowGold.cpp main.cpp",
            Some("L1 error : ")
        )
    },
    Program {
        edits: &[
            (
                "quasirandomGenerator.cpp",
                "const int N = 1048576;",
                "const int N = 65536;",
            ),
            (
                "quasirandomGenerator.cpp",
                "int numIterations = 20;",
                "int numIterations = 1;",
            ),
        ],
        ..sample!(
            "5_Domain_Specific/quasirandomGenerator",
            "quasirandomGenerator",
            "",
            "quasirandomGenerator.cpp quasirandomGenerator_gold.cpp quasirandomGenerator_kernel.cu",
            Some("L1 norm")
        )
    },
    sample!(
        "5_Domain_Specific/SobolQRNG",
        "SobolQRNG",
        "--vectors=10000 --dimensions=10",
        "sobol.cpp sobol_gold.cpp sobol_gpu.cu sobol_primitives.cpp",
        Some("L1-Error: 0")
    ),
    // 6_Performance
    Program {
        edits: &[
            (
                "alignedTypes.cu",
                "const int MEM_SIZE       = 50000000;",
                "const int MEM_SIZE       = 1000000;",
            ),
            (
                "alignedTypes.cu",
                "const int NUM_ITERATIONS = 32;",
                "const int NUM_ITERATIONS = 1;",
            ),
        ],
        ..sample!(
            "6_Performance/alignedTypes",
            "alignedTypes",
            "",
            "alignedTypes.cu",
            Some("Test passed")
        )
    },
    sample!(
        "6_Performance/LargeKernelParameter",
        "LargeKernelParameter",
        "",
        "LargeKernelParameter.cu",
        Some("Test passed")
    ),
    sample!(
        "6_Performance/transpose",
        "transpose",
        "--dimX=256 --dimY=256",
        "transpose.cu",
        Some("Test passed")
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selection_has_forty_samples_each_with_its_own_verdict() {
        assert!(SAMPLES.len() >= 40, "{}", SAMPLES.len());
        let mut dirs: Vec<&str> = SAMPLES.iter().map(|p| p.dir).collect();
        dirs.sort_unstable();
        dirs.dedup();
        assert_eq!(dirs.len(), SAMPLES.len(), "a sample is listed twice");
        for p in SAMPLES {
            let want = p.expect.unwrap_or("");
            regex::Regex::new(want).unwrap_or_else(|e| panic!("{}: {e}", p.dir));
            assert!(
                p.build
                    .is_some_and(|b| b.contains(&format!("-o {} ", p.exe))),
                "{}",
                p.dir
            );
        }
    }
}
