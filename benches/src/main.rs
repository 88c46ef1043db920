//! `hira-bench`: measures what remoting through Hira costs, against native OpenCL in
//! the same run.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::{Parser, Subcommand};
use hira_benches::{cuda, env, fairness, measure, overhead, report, results, rodinia, suite};

/// Hira's benchmark harness: every figure is a ratio against native runs made in the
/// same invocation, alternating native and Hira so that machine noise hits both.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runs the workload suite and prints its table (also written as JSON, Markdown
    /// and SVG).
    Suite {
        /// The small configuration the test suite uses.
        #[arg(long)]
        short: bool,
        /// Unmeasured runs of each workload each way before measuring.
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Measured runs of each workload each way.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Directory for results.json, results.md and results.svg.
        #[arg(long, default_value = "target/hira-bench/suite")]
        out: PathBuf,
        /// Extra environment for the runs through Hira, such as `HIRA_SYNC=1`
        /// (asynchronous forwarding off) or `HIRA_RINGS=0` (frames relayed by the
        /// daemon); repeatable.
        #[arg(long = "hira-env", value_name = "KEY=VALUE", value_parser = parse_env)]
        hira_env: Vec<(String, String)>,
    },
    /// Benchmarks your own OpenCL program: `hira-bench run -- ./my_program args`.
    Run {
        /// Unmeasured runs each way before measuring.
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Measured runs each way.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Directory for results.json, results.md and results.svg.
        #[arg(long, default_value = "target/hira-bench/run")]
        out: PathBuf,
        /// Runs through Hira with the sessions placed on a GPU host across a network
        /// (network namespaces, mutual TLS; root) at this many µs of added one-way
        /// delay, as `hira-bench remote` does.
        #[arg(long)]
        placed: Option<u64>,
        /// The program and its arguments.
        #[arg(required = true, last = true)]
        program: Vec<String>,
    },
    /// Moves each suite workload to a new API server at random points while it runs
    /// through Hira; checks its output against native and reports each move's pause
    /// and snapshot size.
    Migrate {
        /// The small configuration the test suite uses.
        #[arg(long)]
        short: bool,
        /// Runs of each workload with moves.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Moves asked for per run, at random times.
        #[arg(long, default_value_t = 3)]
        points: usize,
        /// Seed of the random points.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Move between two daemons (suspend here, resume there) instead of between
        /// API servers of one daemon.
        #[arg(long)]
        between_daemons: bool,
        /// Where to write the Markdown report.
        #[arg(long, default_value = "target/hira-bench/migrate.md")]
        out: PathBuf,
    },
    /// The workload suite with its sessions on a GPU host across a network (network
    /// namespaces, mutual TLS) at added one-way delays, beside native runs and runs on
    /// this host; calls and round trips per workload. Needs root.
    Remote {
        /// The small configuration the test suite uses.
        #[arg(long)]
        short: bool,
        /// Measured runs of each workload each way.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Added one-way delays in µs, comma-separated.
        #[arg(long, default_value = "0,50,500", value_delimiter = ',')]
        delays: Vec<u64>,
        /// Share of the GPU host's packets dropped (0 to 1).
        #[arg(long, default_value_t = 0.0)]
        loss: f64,
        /// Directory for results.md.
        #[arg(long, default_value = "target/hira-bench/remote")]
        out: PathBuf,
    },
    /// A bounded soak: well-behaved guests looping real programs on four VMs, hostile
    /// guests of every class in the second half; reports correctness, call latency
    /// and the daemon's threads, descriptors and memory.
    Soak {
        /// Length of the whole run in seconds (half quiet, half hostile).
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// Well-behaved guests running at once.
        #[arg(long, default_value_t = 64)]
        guests: usize,
        /// Where to write the Markdown report.
        #[arg(long, default_value = "target/hira-bench/soak.md")]
        out: PathBuf,
    },
    /// Rodinia's OpenCL or CUDA programs from your checkout: each is built with its
    /// own Makefile (CUDA: by nvcc 13 with its static runtime), run natively and
    /// through Hira on the same inputs, and compared (exit status, output with
    /// timings masked, every file it writes).
    Rodinia {
        /// Root of a Rodinia 3.1 checkout (opencl/ or cuda/, common/, data/); default
        /// $HIRA_RODINIA.
        #[arg(long, env = "HIRA_RODINIA")]
        src: PathBuf,
        /// Which half of the suite.
        #[arg(long, value_enum, default_value = "opencl")]
        api: rodinia::Api,
        /// CUDA: the driver, `system` or a directory holding a libcuda.so.1
        /// (default: the CPU test executor of this build).
        #[arg(long)]
        driver: Option<String>,
        /// CUDA: the toolkit nvcc is in (default: $HIRA_NVCC's, else target/nvcc13's).
        #[arg(long)]
        cuda_toolkit: Option<PathBuf>,
        /// CUDA: NVIDIA's cuda-samples checkout, whose Common/ cfd includes.
        #[arg(long, env = "HIRA_CUDA_SAMPLES")]
        cuda_samples: Option<PathBuf>,
        /// Only these programs (directory names under opencl/ or cuda/, comma-separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Seconds one run may take before it is killed and reported as a timeout.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Runs through Hira with the sessions placed on a GPU host across a network
        /// (network namespaces, mutual TLS; root) at this many µs of added one-way
        /// delay, as `hira-bench remote` does.
        #[arg(long)]
        placed: Option<u64>,
        /// Moves each program's session this many times while it runs through Hira,
        /// at random times within its native run time, to a new API server (as
        /// `hira-bench migrate` moves the suite's workloads); the moves and their
        /// pauses are reported beside the comparison.
        #[arg(long, conflicts_with = "placed")]
        moves: Option<usize>,
        /// With `--moves`: between two daemons instead of between API servers.
        #[arg(long, requires = "moves")]
        between_daemons: bool,
        /// Seed of the random move times.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Directory for the private build, the runs and results.{json,md}.
        #[arg(long, default_value = "target/hira-bench/rodinia")]
        out: PathBuf,
    },
    /// NVIDIA's cuda-samples from your checkout (a selection of 55 that need no
    /// graphics, CUDA library or second GPU): each built by nvcc 13 with its static
    /// runtime, run natively and through Hira on the same driver, and compared as
    /// Rodinia's programs are; a sample counts only where it passed its own check.
    CudaSamples {
        /// Root of a cuda-samples checkout (Samples/, Common/); default
        /// $HIRA_CUDA_SAMPLES.
        #[arg(long, env = "HIRA_CUDA_SAMPLES")]
        src: PathBuf,
        /// The driver, `system` or a directory holding a libcuda.so.1 (default: the
        /// CPU test executor of this build).
        #[arg(long)]
        driver: Option<String>,
        /// The toolkit nvcc is in (default: $HIRA_NVCC's, else target/nvcc13's).
        #[arg(long)]
        cuda_toolkit: Option<PathBuf>,
        /// Only these samples (directory names, with or without their category).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Seconds one run may take before it is killed and reported as a timeout.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Directory for the private build, the runs and results.{json,md}.
        #[arg(long, default_value = "target/hira-bench/cuda-samples")]
        out: PathBuf,
    },
    /// The CUDA test programs (tests/cuda) natively and through Hira on the same
    /// driver: the machine's (`--driver system`), else the CPU test executor, whose
    /// ratios measure remoting against PTX interpretation, not a GPU.
    Cuda {
        /// `system` for the machine's CUDA driver, else a directory holding a
        /// libcuda.so.1 (default: the CPU test executor of this build).
        #[arg(long)]
        driver: Option<String>,
        /// Unmeasured runs each way before measuring.
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Measured runs each way.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Directory for results.json, results.md and results.svg.
        #[arg(long, default_value = "target/hira-bench/cuda")]
        out: PathBuf,
    },
    /// Gathers the stamped `results.md` of benchmark runs (their output directories)
    /// into one page, each under its directory's name with the machine, date,
    /// commit and command that produced it: how `docs/results.md` is made.
    Results {
        /// The page to write (default: print it).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Output directories of runs (`--out` of suite, cuda, fairness, rodinia, ...).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// Call round trip, asynchronous call cost and a launch-and-wait loop.
    Overhead {
        /// Measured repeats, native and remote alternating.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Stencil iterations (kernel launches, each followed by clFinish).
        #[arg(long, default_value_t = 1000)]
        iterations: u32,
        /// Synchronous calls timed per round-trip run.
        #[arg(long, default_value_t = 20000)]
        calls: u32,
        /// Where to write the JSON results.
        #[arg(long, default_value = "target/hira-bench/overhead.json")]
        json: PathBuf,
    },
    /// How the sharing policies divide device time among VMs running 1 ms and 100 ms
    /// kernels: unfairness per 500 ms and 1 s window, work against FIFO, and a chart
    /// of a live share change.
    Fairness {
        /// Seconds each run lasts.
        #[arg(long, default_value_t = 8.0)]
        seconds: f64,
        /// Rounds of each scenario (FIFO and the policies alternate in each round;
        /// the table gives medians).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Directory for results.json, results.md and shares.svg.
        #[arg(long, default_value = "target/hira-bench/fairness")]
        out: PathBuf,
    },
}

/// Parses `KEY=VALUE`.
fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?} has an empty key"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn write_reports(out: &std::path::Path, ms: &[measure::Measurement]) -> Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("results.json"), report::json(ms))?;
    results::write(out, &report::markdown(ms))?;
    std::fs::write(out.join("results.svg"), report::svg(ms))?;
    print!("{}", report::markdown(ms));
    eprintln!("wrote {}/results.{{json,md,svg}}", out.display());
    Ok(())
}

fn main() -> Result<()> {
    match Args::parse().command {
        Cmd::Suite {
            short,
            warmup,
            repeats,
            out,
            hira_env,
        } => {
            ensure!(repeats > 0, "--repeats must be at least 1");
            let bin = env::build_components()?;
            let dir = tempfile::tempdir()?;
            let exes = suite::compile_all(dir.path())?;
            let mut bench = env::BenchEnv::start(&bin)?;
            bench.hira_env = hira_env;
            let ms = suite::run(&bench, &exes, short, warmup, repeats)?;
            write_reports(&out, &ms)?;
            ensure!(
                ms.iter().all(measure::Measurement::verified),
                "some workloads did not verify"
            );
            Ok(())
        }
        Cmd::Run {
            warmup,
            repeats,
            out,
            placed,
            program,
        } => {
            ensure!(repeats > 0, "--repeats must be at least 1");
            let bin = env::build_components()?;
            let (local, hosts);
            let bench = match placed {
                None => {
                    local = env::BenchEnv::start(&bin)?;
                    &local
                }
                Some(delay) => {
                    hosts = hira_benches::remote::Placed::new(&bin, delay)?;
                    &hosts.env
                }
            };
            let exe = PathBuf::from(&program[0]);
            let name = exe
                .file_name()
                .map_or_else(|| program[0].clone(), |n| n.to_string_lossy().into_owned());
            let mut progress = |s: &str| eprint!("\r\x1b[2K{s}");
            let m = measure::measure(
                bench,
                &name,
                &exe,
                &program[1..],
                warmup,
                repeats,
                &mut progress,
            )?;
            eprint!("\r\x1b[2K");
            write_reports(&out, std::slice::from_ref(&m))
        }
        Cmd::Cuda {
            driver,
            warmup,
            repeats,
            out,
        } => {
            ensure!(repeats > 0, "--repeats must be at least 1");
            let bin = env::build_components()?;
            let dir = tempfile::tempdir()?;
            let ms = cuda::run(&bin, dir.path(), driver.as_deref(), warmup, repeats)?;
            write_reports(&out, &ms)?;
            ensure!(
                ms.iter().all(measure::Measurement::verified),
                "some programs did not verify"
            );
            Ok(())
        }
        Cmd::Overhead {
            repeats,
            iterations,
            calls,
            json,
        } => overhead::overhead(repeats, iterations, calls, &json),
        Cmd::Results { out, dirs } => {
            let page = results::gather(&dirs)?;
            match out {
                Some(f) => {
                    std::fs::write(&f, page)?;
                    eprintln!("wrote {}", f.display());
                }
                None => print!("{page}"),
            }
            Ok(())
        }
        Cmd::Fairness {
            seconds,
            repeat,
            out,
        } => {
            let bin = env::build_components()?;
            let runs = fairness::run(&bin, &out, seconds.max(3.0), repeat)?;
            let md = fairness::markdown(&runs);
            println!("{md}");
            results::write(&out, &md)?;
            std::fs::write(
                out.join("results.json"),
                serde_json::to_string_pretty(&fairness::json(&runs))?,
            )?;
            std::fs::write(out.join("shares.svg"), fairness::svg(&runs))?;
            eprintln!("wrote {}/results.{{json,md}} and shares.svg", out.display());
            Ok(())
        }
        Cmd::Rodinia {
            src,
            api,
            driver,
            cuda_toolkit,
            cuda_samples,
            only,
            timeout,
            placed,
            moves,
            between_daemons,
            seed,
            out,
        } => programs(
            &src,
            api,
            driver,
            cuda_toolkit,
            cuda_samples.map(|s| s.join("Common")),
            &only,
            timeout,
            placed,
            moves.map(|m| (m, between_daemons, seed)),
            &out,
        ),
        Cmd::CudaSamples {
            src,
            driver,
            cuda_toolkit,
            only,
            timeout,
            out,
        } => programs(
            &src,
            rodinia::Api::Samples,
            driver,
            cuda_toolkit,
            Some(src.join("Common")),
            &only,
            timeout,
            None,
            None,
            &out,
        ),
        Cmd::Remote {
            short,
            repeats,
            delays,
            loss,
            out,
        } => {
            ensure!(repeats > 0, "--repeats must be at least 1");
            ensure!(
                (0.0..1.0).contains(&loss),
                "--loss must be from 0 to below 1"
            );
            let r = hira_benches::remote::run(short, repeats, &delays, loss)?;
            let md = hira_benches::remote::report(&r, repeats);
            print!("{md}");
            hira_benches::results::write(&out, &md)?;
            eprintln!("wrote {}", out.join("results.md").display());
            ensure!(
                r.workloads
                    .iter()
                    .all(|(_, row)| row.iter().all(measure::Measurement::verified)),
                "some workloads did not verify"
            );
            Ok(())
        }
        Cmd::Migrate {
            short,
            rounds,
            points,
            seed,
            between_daemons,
            out,
        } => {
            let bin = env::build_components()?;
            let dir = tempfile::tempdir()?;
            let exes = suite::compile_all(dir.path())?;
            let bench = env::BenchEnv::start(&bin)?;
            let second = if between_daemons {
                Some(env::BenchEnv::start(&bin)?)
            } else {
                None
            };
            let other = second.as_ref().and_then(|b| b.control.as_deref());
            let results =
                hira_benches::migrate::run(&bench, other, &exes, short, rounds, points, seed)?;
            let md = hira_benches::migrate::report(&results, points, seed);
            print!("{md}");
            if let Some(dir) = out.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&out, &md)?;
            eprintln!("wrote {}", out.display());
            let bad: Vec<&str> = results
                .iter()
                .filter(|w| !w.outputs_match)
                .map(|w| w.name.as_str())
                .collect();
            ensure!(
                bad.is_empty(),
                "outputs differ from native: {}",
                bad.join(", ")
            );
            Ok(())
        }
        Cmd::Soak {
            seconds,
            guests,
            out,
        } => hira_benches::soak::soak(seconds, guests, &out),
    }
}

/// Builds, runs and compares Rodinia's programs or the cuda-samples selection, and
/// writes results.{json,md} into `out`; fails unless every one built and matched.
#[allow(clippy::too_many_arguments)]
fn programs(
    src: &std::path::Path,
    api: rodinia::Api,
    driver: Option<String>,
    cuda_toolkit: Option<PathBuf>,
    samples_inc: Option<PathBuf>,
    only: &[String],
    timeout: u64,
    placed: Option<u64>,
    moves: Option<(usize, bool, u64)>,
    out: &std::path::Path,
) -> Result<()> {
    let bin = env::build_components()?;
    std::fs::create_dir_all(out)?;
    let out = out.canonicalize()?;
    let (libraries, cuda) = match api {
        rodinia::Api::Opencl => (None, None),
        rodinia::Api::Cuda | rodinia::Api::Samples => {
            let (driver_dir, shim) = cuda::libraries(&bin, &out, driver.as_deref())?;
            let top = match cuda_toolkit {
                Some(t) => t,
                None => cuda::nvcc()
                    .parent()
                    .and_then(|b| b.parent())
                    .context("nvcc has no toolkit directory")?
                    .to_path_buf(),
            };
            let tools = rodinia::CudaTools {
                top: top
                    .canonicalize()
                    .with_context(|| format!("{}", top.display()))?,
                samples_inc,
            };
            (Some((driver_dir, shim)), Some(tools))
        }
    };
    // Runs through Hira on this host, or on a GPU host across the network, whose
    // hosts live as long as the runs.
    let local;
    let mut hosts = None;
    let bench: &env::BenchEnv = match placed {
        None => {
            local = match &libraries {
                None => env::BenchEnv::start(&bin)?,
                Some((driver, shim)) => env::BenchEnv::start_cuda(&bin, driver, shim)?,
            };
            &local
        }
        Some(delay) => {
            if let Some((driver, _)) = &libraries {
                // SAFETY: set before any thread of this process reads the
                // environment; the daemons inherit it.
                unsafe { std::env::set_var("LD_LIBRARY_PATH", driver) };
            }
            let mut p = hira_benches::remote::Placed::new(&bin, delay)?;
            p.env.cuda = libraries.clone();
            &hosts.insert(p).env
        }
    };
    // A second daemon for moves between daemons, alive as long as the runs.
    let second = match (moves, &libraries) {
        (Some((_, true, _)), None) => Some(env::BenchEnv::start(&bin)?),
        (Some((_, true, _)), Some((driver, shim))) => {
            Some(env::BenchEnv::start_cuda(&bin, driver, shim)?)
        }
        _ => None,
    };
    let moving = match moves {
        Some((points, _, seed)) => Some(rodinia::Moving {
            control: bench
                .control
                .clone()
                .context("the bench daemon has no control socket")?,
            other: second.as_ref().and_then(|b| b.control.clone()),
            points,
            rng: std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(seed)),
        }),
        None => None,
    };
    let rows = rodinia::run(
        &src.canonicalize()?,
        &out.join("work"),
        bench,
        api,
        cuda,
        only,
        std::time::Duration::from_secs(timeout),
        moving.as_ref(),
    )?;
    let mut md = rodinia::markdown(&rows);
    if let Some((points, between, seed)) = moves {
        let _ = std::fmt::Write::write_fmt(
            &mut md,
            format_args!(
                "\nEach program's session was moved {points} times while it ran through Hira, at random times within its native run time (seed {seed}), {}.\n\n{}",
                if between {
                    "between two daemons"
                } else {
                    "to a new API server each time"
                },
                rodinia::moves_markdown(&rows)
            ),
        );
    }
    results::write(&out, &md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&rodinia::json(&rows))?,
    )?;
    print!("{md}");
    eprintln!("wrote {}/results.{{json,md}}", out.display());
    let bad: Vec<&str> = rows
        .iter()
        .filter(|r| !r.identical())
        .map(|r| r.name)
        .collect();
    ensure!(
        bad.is_empty(),
        "not built or not identical: {}",
        bad.join(", ")
    );
    Ok(())
}
