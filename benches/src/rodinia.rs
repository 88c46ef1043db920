//! `hira-bench rodinia`: the OpenCL or the CUDA programs of the Rodinia suite, built
//! from a checkout the operator provides, run natively and through Hira on the same
//! inputs, and compared: exit status, standard output and error with timings masked,
//! and every file a program writes, byte for byte.
//!
//! Rodinia is not vendored (its licence and size), and its 3.1 layout is assumed:
//! `opencl/<program>/` or `cuda/<program>/` built by the program's own Makefile (or,
//! where a Makefile names a long-gone architecture, the one nvcc line it would run),
//! `opencl/util/`, `common/make.config`, and `data/`. CUDA programs are built by nvcc
//! 13 with its default static runtime, as users build theirs. Inputs that the checkout lacks (large inputs are
//! kept out of most public copies) are generated here, deterministically and small
//! enough for a CPU device.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use regex::Regex;

use crate::env::BenchEnv;
use crate::migrate::Move;

/// An input the harness writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generated {
    /// b+tree: a count, then that many distinct keys in a shuffled order.
    BTreeKeys,
    /// cfd: an unstructured mesh in the Rodinia domain format.
    CfdMesh,
    /// heartwall and leukocyte: an uncompressed 8-bit AVI of moving bright rings.
    Video {
        width: u32,
        height: u32,
        frames: u32,
    },
}

/// One Rodinia OpenCL program: where it lives, how it is run, what is a timing.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// Directory under `opencl/`.
    pub dir: &'static str,
    /// Executable the Makefile produces.
    pub exe: &'static str,
    /// Arguments, separated by white space; `{data}` is the checkout's `data/`,
    /// `{gen}` the generated inputs.
    pub args: &'static str,
    /// Inputs generated before the run, as `(file name under {gen}, what)`.
    pub generated: &'static [(&'static str, Generated)],
    /// The program seeds its random input from `time()`: run it with a fixed clock
    /// (an `LD_PRELOAD` of `time()` only; elapsed-time measurement is untouched).
    pub clock_seeded: bool,
    /// Regular expressions of further output lines whose numbers are timings.
    pub timing_lines: &'static [&'static str],
    /// The program's output is not determined natively (why, as observed): only its
    /// exit status and the names of the files it writes are compared.
    pub undetermined: Option<&'static str>,
    /// Edits made to the private copy before building, as `(file, from, to)`: only
    /// to let a program run at all here (a GPU-only device query, a bug that today's
    /// compilers turn into a crash); both sides run the same edited binary.
    pub edits: &'static [(&'static str, &'static str, &'static str)],
    /// How it is built, as a shell command in its directory (`None`: `make`, with
    /// the OpenCL SDK's paths). CUDA builds see `$MAKE` (make with the CUDA paths
    /// of `common/make.config` pointed at nvcc 13), `$NVCC` and `$SAMPLES_INC`.
    pub build: Option<&'static str>,
    /// What the native run must print on stdout (a regular expression), beside
    /// exiting with 0, for the row to count: a sample's own verdict, so that a
    /// driver that runs nothing (two runs that agree on a failure) is not a pass.
    pub expect: Option<&'static str>,
}

/// Which of Rodinia's halves, or NVIDIA's cuda-samples (`hira-bench cuda-samples`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    Opencl,
    Cuda,
    #[value(skip)]
    Samples,
}

impl Api {
    /// The checkout's directory of the programs.
    pub fn tree(self) -> &'static str {
        match self {
            Api::Opencl => "opencl",
            Api::Cuda => "cuda",
            Api::Samples => "Samples",
        }
    }

    /// The checkout's directory of shared code (headers, utilities).
    fn common(self) -> &'static str {
        match self {
            Api::Samples => "Common",
            _ => "common",
        }
    }

    pub fn programs(self) -> &'static [Program] {
        match self {
            Api::Opencl => PROGRAMS,
            Api::Cuda => CUDA_PROGRAMS,
            Api::Samples => crate::samples::SAMPLES,
        }
    }
}

impl Program {
    /// `exe ARGS` in `opencl/DIR` (arguments separated by white space; none has a space
    /// in it), with nothing generated, masked, edited or undetermined.
    pub(crate) const fn new(dir: &'static str, exe: &'static str, args: &'static str) -> Program {
        Program {
            dir,
            exe,
            args,
            generated: &[],
            clock_seeded: false,
            timing_lines: &[],
            undetermined: None,
            edits: &[],
            build: None,
            expect: None,
        }
    }

    /// A CUDA program built by `build`.
    pub(crate) const fn cuda(
        dir: &'static str,
        exe: &'static str,
        args: &'static str,
        build: &'static str,
    ) -> Program {
        Program {
            build: Some(build),
            ..Program::new(dir, exe, args)
        }
    }
}

/// leukocyte's input, for its OpenCL and CUDA programs alike.
const LEUKOCYTE_VIDEO: &[(&str, Generated)] = &[(
    "leuko.avi",
    Generated::Video {
        width: 640,
        height: 480,
        frames: 3,
    },
)];

/// The suite, in Rodinia's alphabetical order. Sizes are the small end of what each
/// program accepts, so that a CPU device runs the whole suite in minutes.
pub const PROGRAMS: &[Program] = &[
    Program {
        generated: &[("btree.txt", Generated::BTreeKeys)],
        timing_lines: &[r"(?i)took"],
        ..Program::new(
            "b+tree",
            "b+tree.out",
            "file {gen}/btree.txt command {data}/b+tree/command.txt",
        )
    },
    Program::new("backprop", "backprop.out", "-n 65536"),
    Program::new("bfs", "bfs.out", "{data}/bfs/graph4096.txt"),
    Program {
        generated: &[("cfd.domn", Generated::CfdMesh)],
        ..Program::new("cfd", "euler3d.out", "{gen}/cfd.domn")
    },
    Program::new(
        "dwt2d",
        "dwt2d.out",
        "192.bmp -i {data}/dwt2d -D 192x192 -f -5 -l 3",
    ),
    Program {
        // The row under "Matrix Size Write(s) ... Total(s)" is all timings.
        timing_lines: &[r"^\d+x\d+\s"],
        ..Program::new(
            "gaussian",
            "gaussian.out",
            "-f {data}/gaussian/matrix208.txt",
        )
    },
    Program {
        generated: &[(
            "heart.avi",
            Generated::Video {
                width: 609,
                height: 590,
                frames: 4,
            },
        )],
        ..Program::new(
            "heartwall",
            "heartwall.out",
            "-f {gen}/heart.avi -i {data}/heartwall/input.txt -n 3",
        )
    },
    Program::new(
        "hotspot",
        "hotspot.out",
        "64 2 20 {data}/hotspot/temp_64 {data}/hotspot/power_64 output.txt",
    ),
    Program::new(
        "hotspot3D",
        "hotspot3D.out",
        "-n 64 -l 8 -i 20 -f {data}/hotspot3D/power_64x8 {data}/hotspot3D/temp_64x8 output.txt",
    ),
    Program::new("hybridsort", "hybridsort.out", "r"),
    Program {
        // `allocate` is declared `int` and falls off its end: today's g++ takes that
        // path as unreachable and runs into the next function (a jump to 0 natively).
        edits: &[(
            "kmeans.cpp",
            "membership_OCL = (int*) malloc(n_points * sizeof(int));",
            "membership_OCL = (int*) malloc(n_points * sizeof(int)); return 0;",
        )],
        ..Program::new("kmeans", "kmeans.out", "-o -i {data}/kmeans/100 -p 0 -d 0")
    },
    Program {
        clock_seeded: true,
        ..Program::new("lavaMD", "lavaMD.out", "-boxes1d 4")
    },
    Program {
        generated: LEUKOCYTE_VIDEO,
        // It insists on a GPU; any device will do for comparing outputs.
        edits: &[(
            "OpenCL/find_ellipse_opencl.c",
            "CL_DEVICE_TYPE_GPU",
            "CL_DEVICE_TYPE_ALL",
        )],
        ..Program::new("leukocyte", "leukocyte.out", "{gen}/leuko.avi 2")
    },
    Program::new("lud", "lud.out", "-i {data}/lud/256.dat -v"),
    Program {
        // The time table: "0.000528 s, 0.0577 % : GPU: OTHER", then the total alone.
        timing_lines: &[r"\bs,\s.*%\s*:", r"^\s*[0-9.]+ s$"],
        undetermined: Some(
            "it computes from memory it never wrote (valgrind: conditional jumps on \
             uninitialised values in master() and in the kernel)",
        ),
        ..Program::new("myocyte", "myocyte.out", "-time 10 -r {data}/myocyte")
    },
    Program::new(
        "nn",
        "nn.out",
        "{data}/nn/filelist.txt -r 5 -lat 30 -lng 90 -f {data}/nn -p 0 -d 0",
    ),
    Program::new("nw", "nw.out", "256 10 ./nw.cl"),
    Program {
        // Its stage times: "SEND ARRAY X BACK: 0.000010", "FREE TIME: ...".
        timing_lines: &[r"^(SEND .* BACK|SEND TO SEND BACK|FREE TIME): "],
        undetermined: Some(
            "its estimates vary from one native run to the next (its sum kernel's launch \
             reports a different garbage status each run)",
        ),
        ..Program::new(
            "particlefilter",
            "OCL_particlefilter_double.out",
            "-x 128 -y 128 -z 10 -np 1000",
        )
    },
    Program::new("pathfinder", "pathfinder.out", "-c 1000 -r 100 -h 20"),
    Program::new("srad", "srad.out", "-n 20 -l 0.5 -s 502 458"),
    Program::new(
        "streamcluster",
        "streamcluster.out",
        "10 20 16 1024 1024 100 none output.txt 1 -p 0 -d 0",
    ),
];

/// Rodinia 3.1's CUDA programs that nvcc 13 builds, in the suite's order, with the
/// fewest edits (docs/rodinia.md lists each and why). hybridsort's, kmeans' and
/// leukocyte's texture references, gone since CUDA 12, are ported to texture
/// objects. Not here: mummergpu, whose texture references are not ported yet.
/// Removed runtime calls are mapped by the build's `NVCC_APPEND_FLAGS`
/// (`cudaThreadSynchronize`, `cudaThreadExit`).
pub const CUDA_PROGRAMS: &[Program] = &[
    Program {
        generated: &[("btree.txt", Generated::BTreeKeys)],
        timing_lines: &[r"(?i)took"],
        // `CUDA_FLAG=`: the Makefile asks for sm_20, which nvcc 13 no longer has.
        ..Program::cuda(
            "b+tree",
            "b+tree.out",
            "file {gen}/btree.txt command {data}/b+tree/command.txt",
            "$MAKE CUDA_FLAG=",
        )
    },
    Program::cuda("backprop", "backprop", "65536", "$MAKE"),
    Program::cuda("bfs", "bfs.out", "{data}/bfs/graph4096.txt", "$MAKE"),
    Program {
        generated: &[("cfd.domn", Generated::CfdMesh)],
        // 10 iterations rather than 2000 (minutes on the CPU test executor): the
        // count becomes a build option.
        edits: &[(
            "euler3d.cu",
            "#define iterations 2000",
            "#ifndef iterations\n#define iterations 2000\n#endif",
        )],
        // The Makefile asks for compute_20; this is its nvcc line otherwise.
        ..Program::cuda(
            "cfd",
            "euler3d",
            "{gen}/cfd.domn",
            "$NVCC -O3 -Diterations=10 -I$SAMPLES_INC euler3d.cu -o euler3d",
        )
    },
    Program::cuda(
        "dwt2d",
        "dwt2d",
        "192.bmp -d 192x192 -f -5 -l 3",
        "$MAKE NVCCFLAGS='-I. -O2' LDFLAGS=-lcudart",
    ),
    Program {
        // CUDA 13's cudaDeviceProp has neither field.
        edits: &[
            (
                "gaussian.cu",
                "deviceProp.clockRate",
                "0 /* clockRate: gone in CUDA 13 */",
            ),
            (
                "gaussian.cu",
                "deviceProp. deviceOverlap",
                "deviceProp.asyncEngineCount",
            ),
        ],
        timing_lines: &[r"^\d+x\d+\s"],
        ..Program::cuda(
            "gaussian",
            "gaussian",
            "-f {data}/gaussian/matrix208.txt -q",
            "$MAKE",
        )
    },
    Program {
        generated: &[(
            "heart.avi",
            Generated::Video {
                width: 609,
                height: 590,
                frames: 4,
            },
        )],
        ..Program::cuda("heartwall", "heartwall", "{gen}/heart.avi 1", "$MAKE")
    },
    Program::cuda(
        "hotspot",
        "hotspot",
        "64 2 20 {data}/hotspot/temp_64 {data}/hotspot/power_64 output.out",
        "$MAKE",
    ),
    // Its Makefile includes a make.config of Rodinia 3.0's home directory.
    Program::cuda(
        "hotspot3D",
        "3D",
        "64 8 20 {data}/hotspot3D/power_64x8 {data}/hotspot3D/temp_64x8 output.out",
        "$NVCC -O3 3D.cu -o 3D",
    ),
    Program {
        edits: &[("hist.cu", "prop.deviceOverlap", "prop.asyncEngineCount")],
        // `NVCC_OPTS`: the Makefile's sm_35 and device debugging (-G).
        ..Program::cuda(
            "huffman",
            "pavle",
            "{data}/huffman/test1024_H2.206587175259.in",
            "$MAKE NVCC_OPTS=-O3",
        )
    },
    Program {
        // Texture references went with CUDA 12: its two 1D textures over linear
        // memory (a third is declared and never used) become texture objects in
        // `__constant__` variables, made where the references were bound. Its GL
        // headers are included and never used; its own helper_cuda.h reads fields
        // CUDA 13's cudaDeviceProp lacks, so the samples' is taken. 65536 floats
        // rather than 4M (minutes on the CPU test executor); checked against the CPU's
        // sort (`VERIFY`) and written out (`OUTPUT`).
        edits: &[
            (
                "bucketsort.cu",
                "#include <GL/glew.h>",
                "/* GLEW: not used */",
            ),
            (
                "bucketsort.cu",
                "#include <GL/glut.h>",
                "/* GLUT: not used */",
            ),
            (
                "bucketsort.cu",
                "#include <cuda_gl_interop.h>",
                "/* OpenGL interoperation: not used */",
            ),
            (
                "bucketsort.cu",
                "#include \"helper_cuda.h\"",
                "#include <helper_cuda.h>",
            ),
            (
                "main.cu",
                "#include \"helper_cuda.h\"",
                "#include <helper_cuda.h>",
            ),
            (
                "main.cu",
                "#include \"helper_timer.h\"",
                "#include <helper_timer.h>",
            ),
            (
                "main.cu",
                "#define SIZE\t(1 << 22)",
                "#define SIZE\t(1 << 16)",
            ),
            (
                "bucketsort_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> texPivot;",
                HYBRIDSORT_PIVOTS,
            ),
            (
                "bucketsort_kernel.cu",
                "tex1Dfetch(texPivot,",
                "tex1Dfetch<float>(texPivot,",
            ),
            (
                "bucketsort.cu",
                "cudaBindTexture(0, texPivot, l_pivotpoints, DIVISIONS * sizeof(int))",
                "hira_bind_linear(texPivot, l_pivotpoints, cudaCreateChannelDesc<float>(), \
                 DIVISIONS * sizeof(int))",
            ),
            (
                "mergesort_kernel.cu",
                "texture<float4, 1, cudaReadModeElementType> tex;",
                HYBRIDSORT_LIST,
            ),
            (
                "mergesort_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> txt;",
                "/* txt: never read */",
            ),
            (
                "mergesort_kernel.cu",
                "tex1Dfetch(tex,",
                "tex1Dfetch<float4>(tex,",
            ),
            (
                "mergesort.cu",
                "tex.addressMode[0] = cudaAddressModeWrap;",
                "/* addressing, filtering: set when the object is made */",
            ),
            (
                "mergesort.cu",
                "tex.addressMode[1] = cudaAddressModeWrap;",
                "/* (as the one before) */",
            ),
            (
                "mergesort.cu",
                "tex.filterMode = cudaFilterModePoint;",
                "/* (point sampling: the object's) */",
            ),
            (
                "mergesort.cu",
                "tex.normalized = false;",
                "/* (unnormalised) */",
            ),
            (
                "mergesort.cu",
                "cudaBindTexture(0,tex, d_origList, channelDesc, listsize*sizeof(float));",
                "hira_bind_linear(tex, d_origList, channelDesc, listsize*sizeof(float));",
            ),
        ],
        expect: Some("Checking result...PASSED."),
        ..Program::cuda(
            "hybridsort",
            "hybridsort",
            "r",
            "$NVCC -O3 -I$SAMPLES_INC -DVERIFY -DOUTPUT bucketsort.cu mergesort.cu main.cu \
             -o hybridsort",
        )
    },
    Program {
        // Texture references went with CUDA 12: the three 1D textures over linear
        // memory become texture objects in `__constant__` variables (made where the
        // references were bound), and the constant symbol is named, not spelled.
        edits: &[
            (
                "kmeans_cuda_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> t_features;",
                "__constant__ cudaTextureObject_t t_features;",
            ),
            (
                "kmeans_cuda_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> t_features_flipped;",
                "__constant__ cudaTextureObject_t t_features_flipped;",
            ),
            (
                "kmeans_cuda_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> t_clusters;",
                "__constant__ cudaTextureObject_t t_clusters;",
            ),
            (
                "kmeans_cuda_kernel.cu",
                "tex1Dfetch(t_features,",
                "tex1Dfetch<float>(t_features,",
            ),
            (
                "kmeans_cuda_kernel.cu",
                "tex1Dfetch(t_features_flipped,",
                "tex1Dfetch<float>(t_features_flipped,",
            ),
            ("kmeans_cuda.cu", KMEANS_BINDS, KMEANS_OBJECTS),
            (
                "kmeans_cuda.cu",
                "cudaMemcpyToSymbol(\"c_clusters\",",
                "cudaMemcpyToSymbol(c_clusters,",
            ),
        ],
        ..Program::cuda("kmeans", "kmeans", "-o -i {data}/kmeans/100", "$MAKE")
    },
    Program {
        clock_seeded: true,
        // Its link line names /usr/local/cuda/lib64 first, whose shared runtime
        // would then be linked without the C++ library: the workspace's first.
        ..Program::cuda(
            "lavaMD",
            "lavaMD",
            "-boxes1d 4",
            "$MAKE CUDA_FLAG= C_C=\"gcc -L$LIBRARY_PATH\"",
        )
    },
    Program {
        generated: LEUKOCYTE_VIDEO,
        // Texture references went with CUDA 12: its three 1D textures over linear
        // memory become texture objects in `__constant__` variables, made where the
        // references were bound and destroyed where they were unbound (as kmeans').
        edits: &[
            (
                "CUDA/find_ellipse_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> t_grad_x;",
                LEUKOCYTE_OBJECTS,
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> t_grad_y;",
                "__constant__ cudaTextureObject_t t_grad_y;",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "texture<float, 1, cudaReadModeElementType> t_img;",
                "__constant__ cudaTextureObject_t t_img;",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "tex1Dfetch(t_grad_x,",
                "tex1Dfetch<float>(t_grad_x,",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "tex1Dfetch(t_grad_y,",
                "tex1Dfetch<float>(t_grad_y,",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "tex1Dfetch(t_img,",
                "tex1Dfetch<float>(t_img,",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "cudaBindTexture(0, t_grad_x,",
                "HIRA_BIND_LINEAR(t_grad_x,",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "cudaBindTexture(0, t_grad_y,",
                "HIRA_BIND_LINEAR(t_grad_y,",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "cudaBindTexture(0, t_img,",
                "HIRA_BIND_LINEAR(t_img,",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "cudaUnbindTexture(t_grad_x);",
                "HIRA_UNBIND(t_grad_x);",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "cudaUnbindTexture(t_grad_y);",
                "HIRA_UNBIND(t_grad_y);",
            ),
            (
                "CUDA/find_ellipse_kernel.cu",
                "cudaUnbindTexture(t_img);",
                "HIRA_UNBIND(t_img);",
            ),
        ],
        // One frame tracked (each takes minutes on the CPU test executor).
        ..Program::cuda("leukocyte", "CUDA/leukocyte", "{gen}/leuko.avi 1", "$MAKE")
    },
    Program::cuda(
        "lud",
        "cuda/lud_cuda",
        "-i {data}/lud/256.dat",
        "cd cuda && $MAKE NVCCFLAGS='-I../common -O3 -use_fast_math'",
    ),
    Program {
        // Its summary of where the time went ("0.000001000000 s, 0.000189466431 % :
        // SETUP VARIABLES"), zero natively on a fast run and not through a network.
        timing_lines: &[r"\bs,\s.*%\s*:"],
        ..Program::cuda("myocyte", "myocyte.out", "10 1 0", "$MAKE")
    },
    Program::cuda("nn", "nn", "filelist_4 -r 5 -lat 30 -lng 90", "$MAKE nn"),
    Program::cuda("nw", "needle", "256 10", "$MAKE"),
    Program {
        clock_seeded: true,
        ..Program::cuda(
            "particlefilter",
            "particlefilter_naive",
            "-x 128 -y 128 -z 10 -np 1000",
            "$NVCC -O3 -use_fast_math ex_particle_CUDA_naive_seq.cu -o particlefilter_naive",
        )
    },
    Program::cuda("pathfinder", "pathfinder", "1000 100 20", "$MAKE"),
    Program::cuda(
        "srad/srad_v1",
        "srad",
        "2 0.5 502 458",
        "$NVCC -O3 main.cu -o srad",
    ),
    Program::cuda("srad/srad_v2", "srad", "256 256 0 127 0 127 0.5 2", "$MAKE"),
    Program::cuda(
        "streamcluster",
        "sc_gpu",
        "10 20 16 1024 1024 100 none output.txt 1",
        "$MAKE",
    ),
];

/// kmeans' binding of its three texture references, as Rodinia 3.1 has it (CRLF line
/// ends, as its files have).
const KMEANS_BINDS: &str = concat!(
    "\t/* set up texture */\r\n",
    "    cudaChannelFormatDesc chDesc0 = cudaCreateChannelDesc<float>();\r\n",
    "    t_features.filterMode = cudaFilterModePoint;   \r\n",
    "    t_features.normalized = false;\r\n",
    "    t_features.channelDesc = chDesc0;\r\n",
    "\r\n",
    "\tif(cudaBindTexture(NULL, &t_features, feature_d, &chDesc0, npoints*nfeatures*sizeof(float)) != CUDA_SUCCESS)\r\n",
    "        printf(\"Couldn't bind features array to texture!\\n\");\r\n",
    "\r\n",
    "\tcudaChannelFormatDesc chDesc1 = cudaCreateChannelDesc<float>();\r\n",
    "    t_features_flipped.filterMode = cudaFilterModePoint;   \r\n",
    "    t_features_flipped.normalized = false;\r\n",
    "    t_features_flipped.channelDesc = chDesc1;\r\n",
    "\r\n",
    "\tif(cudaBindTexture(NULL, &t_features_flipped, feature_flipped_d, &chDesc1, npoints*nfeatures*sizeof(float)) != CUDA_SUCCESS)\r\n",
    "        printf(\"Couldn't bind features_flipped array to texture!\\n\");\r\n",
    "\r\n",
    "\tcudaChannelFormatDesc chDesc2 = cudaCreateChannelDesc<float>();\r\n",
    "    t_clusters.filterMode = cudaFilterModePoint;   \r\n",
    "    t_clusters.normalized = false;\r\n",
    "    t_clusters.channelDesc = chDesc2;\r\n",
    "\r\n",
    "\tif(cudaBindTexture(NULL, &t_clusters, clusters_d, &chDesc2, nclusters*nfeatures*sizeof(float)) != CUDA_SUCCESS)\r\n",
    "        printf(\"Couldn't bind clusters array to texture!\\n\");\r\n",
    "\r\n",
);

/// The same as texture objects over the same memory (point sampling, unnormalised
/// coordinates, floats), each stored in its `__constant__` variable; the previous
/// call's objects are destroyed first, as a rebinding replaced the references'.
const KMEANS_OBJECTS: &str = "\t/* set up texture objects (texture references went with CUDA 12) */
\t{
\t\tstatic cudaTextureObject_t objs[3];
\t\tfloat *bases[3] = {feature_d, feature_flipped_d, clusters_d};
\t\tsize_t sizes[3] = {npoints*nfeatures*sizeof(float), npoints*nfeatures*sizeof(float), nclusters*nfeatures*sizeof(float)};
\t\tconst char *names[3] = {\"features\", \"features_flipped\", \"clusters\"};
\t\tfor (int i = 0; i < 3; i++) {
\t\t\tif (objs[i]) cudaDestroyTextureObject(objs[i]);
\t\t\tcudaResourceDesc res = {};
\t\t\tres.resType = cudaResourceTypeLinear;
\t\t\tres.res.linear.devPtr = bases[i];
\t\t\tres.res.linear.desc = cudaCreateChannelDesc<float>();
\t\t\tres.res.linear.sizeInBytes = sizes[i];
\t\t\tcudaTextureDesc td = {};
\t\t\ttd.filterMode = cudaFilterModePoint;
\t\t\ttd.readMode = cudaReadModeElementType;
\t\t\tif (cudaCreateTextureObject(&objs[i], &res, &td, NULL) != cudaSuccess)
\t\t\t\tprintf(\"Couldn't bind %s array to texture!\\n\", names[i]);
\t\t}
\t\tcudaMemcpyToSymbol(t_features, &objs[0], sizeof objs[0]);
\t\tcudaMemcpyToSymbol(t_features_flipped, &objs[1], sizeof objs[1]);
\t\tcudaMemcpyToSymbol(t_clusters, &objs[2], sizeof objs[2]);
\t}
";

/// leukocyte's first texture reference, become a texture object in a `__constant__`
/// variable, with what binds and unbinds the three: a texture object over the same
/// linear memory (point sampling, unnormalised coordinates, floats, as a reference
/// bound with `cudaBindTexture` reads), stored in the variable, and destroyed.
const LEUKOCYTE_OBJECTS: &str = "__constant__ cudaTextureObject_t t_grad_x;
/* Texture references went with CUDA 12: texture objects in their place. */
#define HIRA_BIND_LINEAR(sym, ptr, size) do { \\
	cudaResourceDesc r_ = {}; \\
	r_.resType = cudaResourceTypeLinear; \\
	r_.res.linear.devPtr = (ptr); \\
	r_.res.linear.desc = cudaCreateChannelDesc<float>(); \\
	r_.res.linear.sizeInBytes = (size); \\
	cudaTextureDesc t_ = {}; \\
	t_.filterMode = cudaFilterModePoint; \\
	t_.readMode = cudaReadModeElementType; \\
	cudaTextureObject_t o_ = 0; \\
	cudaCreateTextureObject(&o_, &r_, &t_, NULL); \\
	cudaMemcpyToSymbol(sym, &o_, sizeof o_); \\
} while (0)
#define HIRA_UNBIND(sym) do { \\
	cudaTextureObject_t o_ = 0; \\
	cudaMemcpyFromSymbol(&o_, sym, sizeof o_); \\
	cudaDestroyTextureObject(o_); \\
} while (0)";

/// What binds hybridsort's textures, in each of its two compilation units: a texture
/// object over the same linear memory (point sampling, unnormalised coordinates,
/// element reads, as a reference bound with `cudaBindTexture` reads) stored in the
/// variable that replaces the reference, the one it held before destroyed.
macro_rules! hybridsort_binder {
    ($decl:literal) => {
        concat!(
            $decl,
            "
/* Texture references went with CUDA 12: texture objects in their place. */
static cudaError_t hira_bind_linear(const cudaTextureObject_t &sym, const void *ptr,
                                    cudaChannelFormatDesc desc, size_t size) {
    cudaTextureObject_t old = 0;
    cudaMemcpyFromSymbol(&old, sym, sizeof old);
    if (old) cudaDestroyTextureObject(old);
    cudaResourceDesc r = {};
    r.resType = cudaResourceTypeLinear;
    r.res.linear.devPtr = (void *)ptr;
    r.res.linear.desc = desc;
    r.res.linear.sizeInBytes = size;
    cudaTextureDesc t = {};
    t.filterMode = cudaFilterModePoint;
    t.readMode = cudaReadModeElementType;
    cudaTextureObject_t o = 0;
    cudaError_t e = cudaCreateTextureObject(&o, &r, &t, NULL);
    if (e != cudaSuccess) return e;
    return cudaMemcpyToSymbol(sym, &o, sizeof o);
}"
        )
    };
}

/// hybridsort's pivot texture, as a texture object, with its binder.
const HYBRIDSORT_PIVOTS: &str = hybridsort_binder!("__constant__ cudaTextureObject_t texPivot;");

/// hybridsort's list texture, as a texture object, with its binder.
const HYBRIDSORT_LIST: &str = hybridsort_binder!("__constant__ cudaTextureObject_t tex;");

/// Lines whose numbers are timings in every Rodinia program: the suite's common
/// `Init: ... Total:` breakdown, and lines that speak of time.
const COMMON_TIMING_LINES: &[&str] = &[
    r"^\s*(Init|MemAlloc|HtoD|Exec|DtoH|DtoD|Close|Total|Compile|Kernel|GPU Execution)\s*:",
    r"(?i)\btime\b|\btook\b|\belapsed\b|\bseconds?\b|\bms\b|\(s\)|\bsec\b",
];

/// Masks the numbers of timing lines, so that outputs compare on results only.
#[derive(Debug)]
pub struct Normalizer {
    timing: Vec<Regex>,
    number: Regex,
}

impl Normalizer {
    pub fn new(extra: &[&str]) -> Result<Normalizer> {
        let timing = COMMON_TIMING_LINES
            .iter()
            .chain(extra)
            .map(|r| Regex::new(r).with_context(|| format!("timing pattern {r}")))
            .collect::<Result<_>>()?;
        Ok(Normalizer {
            timing,
            number: Regex::new(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")?,
        })
    }

    /// `text` with the numbers of its timing lines replaced by `#` and their spacing
    /// made single.
    pub fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for line in text.lines() {
            if self.timing.iter().any(|r| r.is_match(line)) {
                // Numbers go, and so does the padding printf gave them.
                let masked = self.number.replace_all(line, "#");
                out.push_str(&masked.split_whitespace().collect::<Vec<_>>().join(" "));
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        out
    }
}

/// A deterministic generator (SplitMix64), so that generated inputs are the same on
/// every machine without a dependency for a dozen lines.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// b+tree's input: the key count, then keys 1..=n shuffled.
pub fn btree_keys(n: u32) -> String {
    let mut keys: Vec<u32> = (1..=n).collect();
    let mut rng = SplitMix(0x0062_7472_6565);
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut s = format!("{n}\n");
    for k in keys {
        let _ = writeln!(s, "{k}");
    }
    s
}

/// cfd's input: `nel` elements on a ring, each with four faces: its two ring
/// neighbours, a wall (-1) and the far field (-2), as in Rodinia's meshes (element
/// numbers from 1, Fortran style), with an area and one normal per face.
pub fn cfd_mesh(nel: u32) -> String {
    let mut rng = SplitMix(0x0063_6664);
    let mut s = format!("{nel}\n");
    for i in 0..nel {
        let prev = (i + nel - 1) % nel + 1;
        let next = (i + 1) % nel + 1;
        let area = 0.5 + rng.unit();
        let _ = write!(s, "{area:.6}");
        for nb in [prev as i64, next as i64, -1, -2] {
            let (x, y, z) = (rng.unit() - 0.5, rng.unit() - 0.5, (rng.unit() - 0.5) * 0.1);
            let _ = write!(s, " {nb} {x:.6} {y:.6} {z:.6}");
        }
        s.push('\n');
    }
    s
}

/// The C source of the video generator, compiled against the program's own avilib
/// (so the file is what that reader expects): 8-bit frames of a dim gradient with
/// bright rings that move a little from frame to frame, for the trackers to follow.
const VIDEO_GENERATOR: &str = r#"
#include <stdlib.h>
#include <math.h>
#include "avilib.h"
int main(int argc, char **argv) {
    int w = atoi(argv[2]), h = atoi(argv[3]), n = atoi(argv[4]);
    avi_t *avi = AVI_open_output_file(argv[1]);
    if (!avi) return 1;
    AVI_set_video(avi, w, h, 30.0, "RGB");
    unsigned char *f = malloc((size_t)w * h);
    for (int k = 0; k < n; k++) {
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                double v = 40.0 + 40.0 * x / w;
                for (int c = 0; c < 6; c++) {
                    double cx = w * (0.2 + 0.12 * c) + 2.0 * k, cy = h * (0.3 + 0.07 * c) + k;
                    double r = hypot(x - cx, y - cy);
                    if (fabs(r - 12.0) < 2.5) v = 220.0;
                }
                f[(size_t)y * w + x] = (unsigned char)v;
            }
        if (AVI_write_frame(avi, (char *)f, (long)w * h, 1)) return 2;
    }
    return AVI_close(avi) ? 3 : 0;
}
"#;

/// A `time()` that always answers 2020-01-01, for programs that seed from the clock.
const FIXED_TIME: &str = r#"
#include <time.h>
time_t time(time_t *t) { if (t) *t = 1577836800; return 1577836800; }
"#;

/// The driver API's entry points (cuda.h of CUDA 12.9 and 13.0).
const DRIVER_API: &str = include_str!("../../cuda/driver-api.txt");

/// Where the suite is prepared and run.
#[derive(Debug)]
pub struct Workspace {
    /// The checkout.
    pub src: PathBuf,
    /// A private copy of `opencl/`, `common/` and the build products.
    pub build: PathBuf,
    /// Generated inputs.
    pub inputs: PathBuf,
    /// The compiler wrappers (flags that let 2009-era code build with today's gcc).
    pub tools: PathBuf,
    pub fixed_time: PathBuf,
    pub api: Api,
    /// For CUDA: the toolkit nvcc is in (its `bin/`, `lib/`, `include/`).
    pub cuda: Option<CudaTools>,
}

/// What CUDA programs are built with.
#[derive(Debug, Clone)]
pub struct CudaTools {
    /// The toolkit's top directory: `bin/nvcc`, `lib/libcudart_static.a` (or `lib64`).
    pub top: PathBuf,
    /// NVIDIA's cuda-samples `Common/` (`helper_cuda.h`), which cfd includes.
    pub samples_inc: Option<PathBuf>,
}

impl CudaTools {
    fn lib(&self) -> PathBuf {
        ["lib64", "lib"]
            .iter()
            .map(|d| self.top.join(d))
            .find(|d| d.join("libcudart_static.a").exists())
            .unwrap_or_else(|| self.top.join("lib"))
    }
}

fn write_exec(path: &Path, body: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .context("cp runs")?;
    ensure!(st.success(), "copying {} failed", from.display());
    Ok(())
}

impl Workspace {
    /// Copies the checkout's sources into `work` and writes the compiler wrappers.
    pub fn prepare(
        src: &Path,
        work: &Path,
        api: Api,
        cuda: Option<CudaTools>,
    ) -> Result<Workspace> {
        let (needs, what): (&[&str], _) = match api {
            Api::Samples => (&["Samples", "Common"], "NVIDIA cuda-samples"),
            _ => (&[api.tree(), "common", "data"], "Rodinia 3.1"),
        };
        for need in needs {
            ensure!(
                src.join(need).is_dir(),
                "{} has no {need}/: give the root of a {what} checkout",
                src.display()
            );
        }
        if work.exists() {
            std::fs::remove_dir_all(work)?;
        }
        let build = work.join("tree");
        let inputs = work.join("gen");
        let tools = work.join("tools");
        for d in [&build, &inputs, &tools] {
            std::fs::create_dir_all(d)?;
        }
        copy_tree(&src.join(api.tree()), &build)?;
        copy_tree(&src.join(api.common()), &build)?;
        if src.join("data").is_dir() {
            std::os::unix::fs::symlink(src.join("data").canonicalize()?, build.join("data"))?;
        }
        // Rodinia's code predates C++11 and GCC 10: dynamic exception
        // specifications, `ifstream == NULL`, tentative definitions in headers, and a
        // prebuilt non-PIC meschach archive. These flags restore the compilers it
        // was written for; warnings are silenced because they are not ours to fix.
        write_exec(
            &tools.join("gcc"),
            "#!/bin/sh\nexec /usr/bin/gcc -fcommon -no-pie -w \"$@\"\n",
        )?;
        std::fs::copy(tools.join("gcc"), tools.join("cc"))?;
        write_exec(
            &tools.join("g++"),
            "#!/bin/sh\nexec /usr/bin/g++ -std=gnu++98 -fcommon -no-pie -w \"$@\"\n",
        )?;
        let fixed_time = tools.join("fixed_time.so");
        let c = tools.join("fixed_time.c");
        std::fs::write(&c, FIXED_TIME)?;
        let st = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&fixed_time)
            .arg(&c)
            .status()?;
        ensure!(st.success(), "building the fixed clock failed");
        if let Some(c) = &cuda {
            ensure!(
                c.top.join("bin/nvcc").is_file(),
                "no nvcc in {}/bin (scripts/test installs nvcc 13 from PyPI under target/nvcc13)",
                c.top.display()
            );
            // Makefiles that link with gcc say `-lcudart`: the static runtime, as nvcc
            // links it (with the C++ library it needs), not the shared one beside it.
            let lib = tools.join("lib");
            std::fs::create_dir_all(&lib)?;
            std::fs::write(
                lib.join("libcudart.so"),
                format!(
                    "INPUT({} -lstdc++ -ldl -lpthread -lrt)\n",
                    c.lib().join("libcudart_static.a").display()
                ),
            )?;
            // `-lcuda` at link time: the runtime finds the driver when it runs, as
            // with the toolkit's stub library, which PyPI's toolkit lacks. Like
            // NVIDIA's stub it defines every entry point of cuda.h, for programs that
            // call the driver API themselves (deviceQueryDrv).
            let stub = tools.join("cuda_stub.c");
            let mut text = String::from("/* libcuda.so for linking only */\n");
            for name in DRIVER_API
                .lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
            {
                let _ = writeln!(text, "void {name}(void) {{}}");
            }
            std::fs::write(&stub, text)?;
            let st = Command::new("gcc")
                .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
                .arg(lib.join("libcuda.so"))
                .arg(&stub)
                .status()?;
            ensure!(st.success(), "building the link-time libcuda.so failed");
        }
        Ok(Workspace {
            src: src.to_path_buf(),
            build,
            inputs,
            tools,
            fixed_time,
            api,
            cuda,
        })
    }

    fn program_dir(&self, p: &Program) -> PathBuf {
        self.build.join(self.api.tree()).join(p.dir)
    }

    /// Builds one program with its own Makefile, serially (several Makefiles have
    /// rules that race under `-j`). Returns the build log on failure.
    pub fn build(&self, p: &Program) -> Result<(), String> {
        let path = format!(
            "{}:{}",
            self.tools.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        for (file, from, to) in p.edits {
            let path = self.program_dir(p).join(file);
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{file}: {e}"))?;
            if text.contains(to) {
                continue;
            }
            if !text.contains(from) {
                return Err(format!("{file} has no `{from}` to replace"));
            }
            std::fs::write(&path, text.replace(from, to)).map_err(|e| e.to_string())?;
        }
        if let Some(script) = p.build {
            return self.build_cuda(p, script);
        }
        let mut cmd = Command::new("make");
        cmd.current_dir(self.program_dir(p))
            .env("PATH", path)
            .env("CPATH", self.build.join("opencl/util"))
            .stdin(Stdio::null());
        // The Makefiles look for NVIDIA's or Intel's SDK; the ICD loader and the
        // Khronos headers are where Debian puts them.
        for var in ["NV_OPENCL", "INTEL_OPENCL", "OPENCL"] {
            cmd.arg(format!("{var}_INC=/usr/include"))
                .arg(format!("{var}_LIB=/usr/lib/x86_64-linux-gnu"));
        }
        let out = cmd.output().map_err(|e| format!("make: {e}"))?;
        let exe = self.program_dir(p).join(p.exe);
        if out.status.success() && exe.is_file() {
            Ok(())
        } else {
            let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
            log.push_str(&String::from_utf8_lossy(&out.stderr));
            Err(log)
        }
    }

    /// Builds a CUDA program with its command: nvcc 13 first on the path (Makefiles
    /// call it by name), `$MAKE` pointing `common/make.config`'s CUDA paths at it, and
    /// the runtime calls CUDA 13 removed mapped to their replacements.
    fn build_cuda(&self, p: &Program, script: &str) -> Result<(), String> {
        let c = self
            .cuda
            .as_ref()
            .ok_or("no CUDA toolkit given for a CUDA program")?;
        let lib = self.tools.join("lib");
        let samples = c
            .samples_inc
            .as_ref()
            .map_or_else(|| self.tools.join("no-cuda-samples"), |p| p.to_path_buf());
        let path = format!(
            "{}:{}",
            c.top.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let make = format!(
            "make CUDA_DIR={} CUDA_LIB_DIR={} SDK_DIR={}",
            c.top.display(),
            lib.display(),
            samples.parent().unwrap_or(&samples).display()
        );
        let out = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(self.program_dir(p))
            .env("PATH", path)
            .env("MAKE", make)
            .env("NVCC", c.top.join("bin/nvcc"))
            .env("SAMPLES_INC", &samples)
            .env("LIBRARY_PATH", &lib)
            .env("NVCC_PREPEND_FLAGS", format!("-L{}", lib.display()))
            .env(
                "NVCC_APPEND_FLAGS",
                "-DcudaThreadSynchronize=cudaDeviceSynchronize -DcudaThreadExit=cudaDeviceReset",
            )
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("sh: {e}"))?;
        let exe = self.program_dir(p).join(p.exe);
        if out.status.success() && exe.is_file() {
            Ok(())
        } else {
            let mut log = format!("{script}\n");
            log.push_str(&String::from_utf8_lossy(&out.stdout));
            log.push_str(&String::from_utf8_lossy(&out.stderr));
            if c.samples_inc.is_none() && log.contains("helper_cuda.h") {
                log.push_str("\n(needs NVIDIA cuda-samples' Common/: --cuda-samples)");
            }
            Err(log)
        }
    }

    /// Writes the program's generated inputs.
    pub fn generate(&self, p: &Program) -> Result<()> {
        for (name, what) in p.generated {
            let path = self.inputs.join(name);
            if path.exists() {
                continue;
            }
            match *what {
                Generated::BTreeKeys => std::fs::write(&path, btree_keys(10_000))?,
                Generated::CfdMesh => std::fs::write(&path, cfd_mesh(4096))?,
                Generated::Video {
                    width,
                    height,
                    frames,
                } => self.video(p, &path, width, height, frames)?,
            }
        }
        Ok(())
    }

    fn video(&self, p: &Program, path: &Path, w: u32, h: u32, n: u32) -> Result<()> {
        let dir = self.program_dir(p);
        let avilib = [
            "util/avi/avilib.c",
            "OpenCL/avilib.c",
            "CUDA/avilib.c",
            "AVI/avilib.c",
        ]
        .iter()
        .map(|f| dir.join(f))
        .find(|f| f.is_file())
        .with_context(|| format!("no avilib.c in {}", dir.display()))?;
        let c = self.inputs.join("videogen.c");
        std::fs::write(&c, VIDEO_GENERATOR)?;
        let exe = self.inputs.join(format!("videogen-{}", p.dir));
        let st = Command::new("gcc")
            .args(["-O2", "-w", "-o"])
            .arg(&exe)
            .arg(&c)
            .arg(&avilib)
            .arg("-I")
            .arg(avilib.parent().expect("avilib.c has a directory"))
            .arg("-lm")
            .status()?;
        ensure!(st.success(), "building the video generator failed");
        let st = Command::new(&exe)
            .arg(path)
            .args([w.to_string(), h.to_string(), n.to_string()])
            .status()?;
        ensure!(st.success(), "writing {} failed", path.display());
        Ok(())
    }

    /// The program's arguments with `{data}` and `{gen}` filled in.
    pub fn args(&self, p: &Program) -> Vec<String> {
        let data = self.src.join("data");
        p.args
            .split_whitespace()
            .map(|a| {
                a.replace("{data}", &data.to_string_lossy())
                    .replace("{gen}", &self.inputs.to_string_lossy())
            })
            .collect()
    }
}

/// What one run left behind.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// "exit 0", "signal 11", "timeout".
    pub status: String,
    pub seconds: f64,
    pub stdout: String,
    pub stderr: String,
    /// Files the run created or changed in the program's directory.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Moves of its session while it ran (`--moves`), and those refused with why.
    pub moves: Vec<Move>,
    pub refused: Vec<String>,
}

/// Moves of each program's session while it runs through Hira (`--moves`): at
/// `points` random times within its native run time, to a new API server of the
/// daemon at `control`, or with `other` between the two daemons.
pub struct Moving {
    pub control: PathBuf,
    pub other: Option<PathBuf>,
    pub points: usize,
    /// Seeded: a run can be repeated.
    pub rng: std::sync::Mutex<rand::rngs::StdRng>,
}

impl Moving {
    /// `points` sorted random times within 5-95% of `span`.
    fn times(&self, span: Duration) -> Vec<Duration> {
        use rand::RngExt;
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut at: Vec<Duration> = (0..self.points)
            .map(|_| span.mul_f64(rng.random_range(0.05..0.95)))
            .collect();
        at.sort();
        at
    }
}

fn snapshot(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let ty = e.file_type()?;
            if ty.is_dir() {
                stack.push(e.path());
            } else if ty.is_file() {
                let rel = e.path().strip_prefix(dir)?.to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(e.path())?);
            }
        }
    }
    Ok(out)
}

/// Which run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Native,
    /// Native with `MALLOC_PERTURB_`, to tell what the program leaves undetermined.
    Perturbed,
    Hira,
}

/// Runs the built program once in a fresh copy of its directory (so outputs of one
/// side never meet the other's), laid out like the checkout so that relative paths
/// such as srad's `../../data/` resolve.
pub fn run_once(
    ws: &Workspace,
    env: &BenchEnv,
    p: &Program,
    side: Side,
    scratch: &Path,
    timeout: Duration,
    moving: Option<(&Moving, Duration)>,
) -> Result<Outcome> {
    let root = scratch.join(match side {
        Side::Native => "native",
        Side::Perturbed => "perturbed",
        Side::Hira => "hira",
    });
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(root.join(ws.api.tree()))?;
    std::os::unix::fs::symlink(ws.build.join("data"), root.join("data"))?;
    let dir = root.join(ws.api.tree()).join(p.dir);
    std::fs::create_dir_all(dir.parent().expect("a program's directory has a parent"))?;
    copy_tree(&ws.program_dir(p), &dir)?;
    let before = snapshot(&dir)?;

    let out_path = root.join("stdout");
    let err_path = root.join("stderr");
    let mut cmd = env.command(side == Side::Hira, &dir.join(p.exe), &ws.args(p));
    if side == Side::Perturbed {
        // glibc fills every allocation with this byte: a program whose output
        // depends on memory it never wrote shows it here.
        cmd.env("MALLOC_PERTURB_", "165");
    }
    cmd.current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?);
    if p.clock_seeded {
        cmd.env("LD_PRELOAD", &ws.fixed_time);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("{} starts", p.exe))?;
    let pid = child.id();
    // Bounded wait on the child's exit (a pidfd would do; std's wait with a watchdog
    // thread that kills a hung program is enough and portable).
    let (tx, rx) = std::sync::mpsc::channel();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(timeout).is_err() {
            // SAFETY: `pid` is our child, not yet reaped: the main thread reaps it
            // only after this thread is told to stop or has sent the signal.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return true;
        }
        false
    });
    let ended = std::sync::atomic::AtomicBool::new(false);
    let (status, moved) = std::thread::scope(|scope| {
        let mover = moving.map(|(m, span)| {
            let at = m.times(span);
            let ended = &ended;
            scope.spawn(move || {
                crate::migrate::move_at(&m.control, m.other.as_deref(), pid, start, &at, &|| {
                    ended.load(std::sync::atomic::Ordering::Acquire)
                })
            })
        });
        let status = child.wait();
        ended.store(true, std::sync::atomic::Ordering::Release);
        let moved = mover.map(|h| h.join().unwrap_or_else(|_| bail!("the mover panicked")));
        (status, moved)
    });
    let status = status?;
    let (moves, refused) = moved.transpose()?.unwrap_or_default();
    let _ = tx.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    let seconds = start.elapsed().as_secs_f64();

    let status = if timed_out {
        "timeout".to_string()
    } else if let Some(code) = status.code() {
        format!("exit {code}")
    } else {
        use std::os::unix::process::ExitStatusExt;
        format!("signal {}", status.signal().unwrap_or(0))
    };
    let mut files = snapshot(&dir)?;
    files.retain(|name, data| before.get(name) != Some(data));
    // Programs that print their own path (cuda-samples print argv[0]) print the
    // side's private directory: the same placeholder stands for it on every side.
    let root_text = root.to_string_lossy().into_owned();
    let text = |p: &Path| -> Result<String> {
        let t = String::from_utf8_lossy(&std::fs::read(p)?).into_owned();
        Ok(t.replace(&root_text, "{run}"))
    };
    Ok(Outcome {
        status,
        seconds,
        stdout: text(&out_path)?,
        stderr: text(&err_path)?,
        files,
        moves,
        refused,
    })
}

/// One program's row.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: &'static str,
    /// `None` when it built; the tail of the build log otherwise.
    pub build_error: Option<String>,
    /// The plain native run, and the one with glibc's `MALLOC_PERTURB_`.
    pub native: Option<Outcome>,
    pub hira: Option<Outcome>,
    pub comparison: Comparison,
}

impl Row {
    pub fn identical(&self) -> bool {
        self.build_error.is_none() && self.native.is_some() && self.comparison.same()
    }
}

/// Hira's run against the native runs.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// What differs between Hira's run and what the native runs agree on.
    pub differences: Vec<String>,
    /// What the two native runs did not agree on, so that no run can be held to it:
    /// the program reads memory it never wrote (the perturbed run fills fresh
    /// allocations with a pattern) or prints something else that varies.
    pub undetermined: Vec<String>,
}

impl Comparison {
    pub fn same(&self) -> bool {
        self.differences.is_empty()
    }
}

fn split_lines(b: &[u8]) -> Vec<&[u8]> {
    b.split(|c| *c == b'\n').collect()
}

/// Compares `hira` with native runs `a` and `b` line by line; lines on which the
/// native runs differ are not compared but counted.
fn compare_text(what: &str, a: &[u8], b: &[u8], hira: &[u8], c: &mut Comparison) {
    if a == b {
        if a != hira {
            let (la, lh) = (split_lines(a), split_lines(hira));
            let detail = la.iter().zip(&lh).position(|(x, y)| x != y).map_or_else(
                || format!("{} lines natively, {} through Hira", la.len(), lh.len()),
                |i| {
                    format!(
                        "line {}: `{}` / `{}`",
                        i + 1,
                        String::from_utf8_lossy(la[i]).trim(),
                        String::from_utf8_lossy(lh[i]).trim()
                    )
                },
            );
            c.differences.push(format!("{what}: {detail}"));
        }
        return;
    }
    let (la, lb, lh) = (split_lines(a), split_lines(b), split_lines(hira));
    if la.len() != lb.len() {
        c.undetermined
            .push(format!("{what}: native runs differ in length"));
        return;
    }
    let varying = la.iter().zip(&lb).filter(|(x, y)| x != y).count();
    c.undetermined.push(format!(
        "{what}: {varying} of {} lines vary natively",
        la.len()
    ));
    // When most of an output varies natively, the lines that happen to agree were
    // computed from the same undetermined values: nothing in it can be held to.
    if varying * 2 > la.len() {
        return;
    }
    if lh.len() != la.len() {
        c.differences.push(format!(
            "{what}: {} lines natively, {} through Hira",
            la.len(),
            lh.len()
        ));
        return;
    }
    if let Some(i) = (0..la.len()).find(|&i| la[i] == lb[i] && la[i] != lh[i]) {
        c.differences.push(format!(
            "{what}: line {}: `{}` / `{}`",
            i + 1,
            String::from_utf8_lossy(la[i]).trim(),
            String::from_utf8_lossy(lh[i]).trim()
        ));
    }
}

/// Compares Hira's run of `p` with two native runs.
pub fn compare(p: &Program, a: &Outcome, b: &Outcome, hira: &Outcome) -> Result<Comparison> {
    let norm = Normalizer::new(p.timing_lines)?;
    let mut c = Comparison::default();
    if let Some(want) = p.expect {
        let re = Regex::new(want).with_context(|| format!("expected output {want}"))?;
        if a.status != "exit 0" || !re.is_match(&a.stdout) {
            c.differences.push(format!(
                "the native run did not pass ({}; `{want}` expected on stdout)",
                a.status
            ));
        }
    }
    if let Some(why) = p.undetermined {
        c.undetermined.push(format!("all output: {why}"));
        if a.status != hira.status {
            c.differences
                .push(format!("status: {} / {}", a.status, hira.status));
        }
        let names = |o: &Outcome| o.files.keys().cloned().collect::<Vec<_>>();
        if names(a) != names(hira) {
            c.differences
                .push(format!("files written: {:?} / {:?}", names(a), names(hira)));
        }
        return Ok(c);
    }
    if a.status != b.status {
        c.undetermined
            .push(format!("status: {} / {} natively", a.status, b.status));
    } else if a.status != hira.status {
        c.differences
            .push(format!("status: {} / {}", a.status, hira.status));
    }
    for (what, x, y, h) in [
        ("stdout", &a.stdout, &b.stdout, &hira.stdout),
        ("stderr", &a.stderr, &b.stderr, &hira.stderr),
    ] {
        let (x, y, h) = (norm.normalize(x), norm.normalize(y), norm.normalize(h));
        compare_text(what, x.as_bytes(), y.as_bytes(), h.as_bytes(), &mut c);
    }
    let names: std::collections::BTreeSet<&String> = a
        .files
        .keys()
        .chain(b.files.keys())
        .chain(hira.files.keys())
        .collect();
    for name in names {
        match (a.files.get(name), b.files.get(name), hira.files.get(name)) {
            (Some(x), Some(y), Some(h)) => compare_text(name, x, y, h, &mut c),
            (Some(_), Some(_), None) => c.differences.push(format!("{name}: only natively")),
            (None, None, Some(_)) => c.differences.push(format!("{name}: only through Hira")),
            _ => c
                .undetermined
                .push(format!("{name}: written by one native run only")),
        }
    }
    Ok(c)
}

/// Builds, runs and compares the programs named in `only` (all when empty).
#[allow(clippy::too_many_arguments)]
pub fn run(
    src: &Path,
    work: &Path,
    env: &BenchEnv,
    api: Api,
    cuda: Option<CudaTools>,
    only: &[String],
    timeout: Duration,
    moving: Option<&Moving>,
) -> Result<Vec<Row>> {
    let programs = api.programs();
    // A sample may be named by its directory alone.
    let named = |p: &Program, name: &str| p.dir == name || p.dir.rsplit('/').next() == Some(name);
    for name in only {
        if !programs.iter().any(|p| named(p, name)) {
            bail!("no {} program {name}", api.tree());
        }
    }
    let ws = Workspace::prepare(src, work, api, cuda)?;
    let selected: Vec<&Program> = programs
        .iter()
        .filter(|p| only.is_empty() || only.iter().any(|o| named(p, o)))
        .collect();
    let total = selected.len();
    let mut rows = vec![];
    for (i, p) in selected.into_iter().enumerate() {
        eprint!("\r\x1b[2K[{}/{total}] {}: building", i + 1, p.dir);
        let mut row = Row {
            name: p.dir,
            build_error: None,
            native: None,
            hira: None,
            comparison: Comparison::default(),
        };
        if let Err(log) = ws.build(p) {
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            row.build_error = Some(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            rows.push(row);
            continue;
        }
        ws.generate(p)?;
        let scratch = work.join("runs").join(p.dir.replace('/', "-"));
        eprint!("\r\x1b[2K[{}/{total}] {}: native", i + 1, p.dir);
        let native = run_once(&ws, env, p, Side::Native, &scratch, timeout, None)?;
        eprint!("\r\x1b[2K[{}/{total}] {}: native, perturbed", i + 1, p.dir);
        let perturbed = run_once(&ws, env, p, Side::Perturbed, &scratch, timeout, None)?;
        eprint!("\r\x1b[2K[{}/{total}] {}: through Hira", i + 1, p.dir);
        let span = Duration::from_secs_f64(native.seconds);
        let hira = run_once(
            &ws,
            env,
            p,
            Side::Hira,
            &scratch,
            timeout,
            moving.map(|m| (m, span)),
        )?;
        row.comparison = compare(p, &native, &perturbed, &hira)?;
        row.native = Some(native);
        row.hira = Some(hira);
        rows.push(row);
    }
    eprint!("\r\x1b[2K");
    Ok(rows)
}

/// The Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| program | builds | native | through Hira | output | not determined natively | native s | Hira s |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (ns, hs, nt, ht) = match (&r.native, &r.hira) {
            (Some(n), Some(h)) => (
                n.status.clone(),
                h.status.clone(),
                format!("{:.2}", n.seconds),
                format!("{:.2}", h.seconds),
            ),
            _ => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let output = if r.build_error.is_some() {
            "-".to_string()
        } else if r.comparison.same()
            && r.comparison
                .undetermined
                .iter()
                .any(|u| u.starts_with("all output:"))
        {
            "same exit status and files written".to_string()
        } else if r.comparison.same() {
            let files = r.native.as_ref().map_or(0, |n| n.files.len());
            let scope = if r.comparison.undetermined.is_empty() {
                ""
            } else {
                " where determined natively"
            };
            format!("identical{scope} (stdout, stderr, {files} files)")
        } else {
            format!("differs: {}", r.comparison.differences.join("; "))
        };
        let undetermined = if r.comparison.undetermined.is_empty() {
            "-".to_string()
        } else {
            r.comparison.undetermined.join("; ")
        };
        let _ = writeln!(
            s,
            "| {} | {} | {ns} | {hs} | {output} | {undetermined} | {nt} | {ht} |",
            r.name,
            if r.build_error.is_some() { "no" } else { "yes" },
        );
    }
    s
}

/// The moves made while the programs ran through Hira (`--moves`), as Markdown.
pub fn moves_markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| program | moves | other asks (why) | pause ms, median (max) | capture ms, median | snapshot, largest |\n\
         |---|---:|---|---:|---:|---:|\n",
    );
    for r in rows {
        let Some(h) = &r.hira else { continue };
        let mut pauses: Vec<f64> = h.moves.iter().map(|m| m.pause_ms).collect();
        let mut captures: Vec<f64> = h.moves.iter().map(|m| m.capture_ms).collect();
        let most = pauses.iter().copied().fold(0.0, f64::max);
        let largest = h.moves.iter().map(|m| m.snapshot_bytes).max().unwrap_or(0);
        let mut why: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &h.refused {
            *why.entry(r.as_str()).or_default() += 1;
        }
        let refused = if why.is_empty() {
            "-".to_string()
        } else {
            why.iter()
                .map(|(w, n)| format!("{n}: {}", w.replace('|', "/")))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let (pause, capture, snapshot) = if h.moves.is_empty() {
            ("-".to_string(), "-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.1} ({most:.1})", crate::migrate::median(&mut pauses)),
                format!("{:.1}", crate::migrate::median(&mut captures)),
                format!("{:.1} MiB", largest as f64 / f64::from(1 << 20)),
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} | {refused} | {pause} | {capture} | {snapshot} |",
            r.name,
            h.moves.len()
        );
    }
    s
}

/// The results as JSON (without outputs).
pub fn json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                let side = |o: &Option<Outcome>| {
                    o.as_ref().map(|o| {
                        serde_json::json!({
                            "status": o.status,
                            "seconds": o.seconds,
                            "files": o.files.keys().collect::<Vec<_>>(),
                            "moves": o.moves.len(),
                            "pauses_ms": o.moves.iter().map(|m| m.pause_ms).collect::<Vec<_>>(),
                            "refused": o.refused,
                        })
                    })
                };
                serde_json::json!({
                    "program": r.name,
                    "builds": r.build_error.is_none(),
                    "build_log_tail": r.build_error,
                    "native": side(&r.native),
                    "hira": side(&r.hira),
                    "identical": r.identical(),
                    "differences": r.comparison.differences,
                    "undetermined_natively": r.comparison.undetermined,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_are_masked_and_results_are_not() {
        let n = Normalizer::new(&[r"^\d+x\d+\s"]).unwrap();
        let a =
            "Init: 609.375977\nresult 1.5 2.5\nKernel time: 3.2 ms\n208x208  0.02 [0.35MB] 3.5\n";
        let b = "Init: 11.0\nresult 1.5 2.5\nKernel time: 9.9 ms\n208x208  0.03 [0.35MB] 4.5\n";
        assert_eq!(n.normalize(a), n.normalize(b));
        let c = "Init: 11.0\nresult 1.5 2.6\nKernel time: 9.9 ms\n208x208  0.03 [0.35MB] 4.5\n";
        // printf's padding of a timing follows its width.
        let m = Normalizer::new(&[r"\bs,\s.*%\s*:"]).unwrap();
        assert_eq!(
            m.normalize(" 0.0475 s,  4.14 % : GPU: OTHER\n"),
            m.normalize(" 0.0475 s, 23.87 % : GPU: OTHER\n")
        );
        assert_ne!(n.normalize(a), n.normalize(c));
        // A result that merely follows a colon is still compared.
        assert_ne!(
            n.normalize("Distance=0.41\n"),
            n.normalize("Distance=0.42\n")
        );
    }

    #[test]
    fn generated_inputs_are_deterministic_and_well_formed() {
        let keys = btree_keys(100);
        assert_eq!(keys, btree_keys(100));
        let mut nums: Vec<u32> = keys.lines().skip(1).map(|l| l.parse().unwrap()).collect();
        assert_eq!(keys.lines().next(), Some("100"));
        assert_ne!(nums, (1..=100).collect::<Vec<_>>(), "keys are shuffled");
        nums.sort_unstable();
        assert_eq!(nums, (1..=100).collect::<Vec<_>>());

        let mesh = cfd_mesh(8);
        assert_eq!(mesh, cfd_mesh(8));
        let lines: Vec<&str> = mesh.lines().collect();
        assert_eq!(lines[0], "8");
        assert_eq!(lines.len(), 9);
        for l in &lines[1..] {
            // area + 4 faces x (neighbour + 3 normal components)
            assert_eq!(l.split_whitespace().count(), 1 + 4 * 4);
        }
        // Element 1's neighbours are 8 and 2 (numbered from 1).
        let f: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!((f[1], f[5], f[9], f[13]), ("8", "2", "-1", "-2"));
    }

    fn outcome(status: &str, stdout: &str, file: &[u8]) -> Outcome {
        Outcome {
            status: status.into(),
            seconds: 1.0,
            stdout: stdout.into(),
            stderr: String::new(),
            files: BTreeMap::from([("output.txt".to_string(), file.to_vec())]),
            moves: Vec::new(),
            refused: Vec::new(),
        }
    }

    #[test]
    fn comparison_reports_status_output_and_files() {
        let p = &PROGRAMS[0];
        let base = outcome("exit 0", "Total: 1.0\nfound 42\n", b"1 2 3");
        let same = outcome("exit 0", "Total: 7.0\nfound 42\n", b"1 2 3");
        let c = compare(p, &base, &base, &same).unwrap();
        assert!(c.same() && c.undetermined.is_empty(), "{c:?}");

        let mut other = outcome("signal 11", "Total: 1.0\nfound 43\n", b"1 2 4");
        other.files.insert("extra".into(), vec![]);
        let c = compare(p, &base, &base, &other).unwrap();
        assert_eq!(c.differences.len(), 4, "{c:?}");
    }

    #[test]
    fn lines_that_vary_natively_are_not_held_against_hira() {
        let p = &PROGRAMS[0];
        let a = outcome("exit 0", "ok\n", b"1\n2 garbage 77\n3\n");
        let b = outcome("exit 0", "ok\n", b"1\n2 garbage 91\n3\n");
        // Hira's garbage differs too, on the one undetermined line only.
        let h = outcome("exit 0", "ok\n", b"1\n2 garbage 5\n3\n");
        let c = compare(p, &a, &b, &h).unwrap();
        assert!(c.same(), "{c:?}");
        assert_eq!(c.undetermined, ["output.txt: 1 of 4 lines vary natively"]);
        // A difference on a line both native runs agree on still counts.
        let h = outcome("exit 0", "ok\n", b"1\n2 garbage 5\n4\n");
        let c = compare(p, &a, &b, &h).unwrap();
        assert_eq!(c.differences, ["output.txt: line 3: `3` / `4`"]);
        // An output that mostly varies natively is not compared at all.
        let a = outcome("exit 0", "ok\n", b"1\n2\n3");
        let b = outcome("exit 0", "ok\n", b"5\n6\n3");
        let h = outcome("exit 0", "ok\n", b"7\n8\n9");
        let c = compare(p, &a, &b, &h).unwrap();
        assert!(c.same(), "{c:?}");
        assert_eq!(c.undetermined, ["output.txt: 2 of 3 lines vary natively"]);
        let a = outcome("exit 0", "ok\n", b"1\n2 garbage 77\n3\n");
        // So does a status the native runs agree on.
        let h = outcome("signal 6", "ok\n", b"1\n2 garbage 77\n3\n");
        assert!(!compare(p, &a, &b, &h).unwrap().same());
    }

    #[test]
    fn a_program_undetermined_natively_is_held_to_its_status_and_files_only() {
        let p = PROGRAMS.iter().find(|p| p.undetermined.is_some()).unwrap();
        let a = outcome("exit 0", "XE: 60.5\n", b"1");
        let h = outcome("exit 0", "XE: 62.3\n", b"2");
        let c = compare(p, &a, &a, &h).unwrap();
        assert!(c.same() && c.undetermined.len() == 1, "{c:?}");
        let h = outcome("signal 11", "XE: 60.5\n", b"1");
        assert!(!compare(p, &a, &a, &h).unwrap().same());
        let mut h = outcome("exit 0", "XE: 60.5\n", b"1");
        h.files.clear();
        assert!(!compare(p, &a, &a, &h).unwrap().same());
    }

    #[test]
    fn every_program_is_named_once() {
        for api in [Api::Opencl, Api::Cuda] {
            let programs = api.programs();
            let mut dirs: Vec<&str> = programs.iter().map(|p| p.dir).collect();
            dirs.sort_unstable();
            dirs.dedup();
            assert_eq!(dirs.len(), programs.len());
            for p in programs {
                Normalizer::new(p.timing_lines).unwrap();
                assert_eq!(p.build.is_some(), api == Api::Cuda, "{}", p.dir);
            }
        }
    }
}
