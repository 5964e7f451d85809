//! The `gpumem-trace` command line, as a library function so that it can be run in-process.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::analysis::human_bytes;
use crate::plot::{self, ColorBy, PlotOptions};
use crate::recommend;
use crate::replay::{self, ReplayOptions};
use crate::{format, import, Error, Result, Timeline, Trace};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "gpumem-trace",
    version,
    about = "Import, replay, summarise and plot gpumem allocation traces"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Source {
    /// CuPy's DebugPrintHook output (JSON lines).
    Cupy,
    /// A pickled `torch.cuda.memory._snapshot()` with its recorded history.
    Pytorch,
}

#[derive(Subcommand)]
enum Command {
    /// Converts a CuPy DebugPrintHook file or a PyTorch memory snapshot into a trace.
    Import {
        /// What FILE is.
        #[arg(long = "from", value_enum)]
        from: Source,
        /// The file to read.
        file: PathBuf,
        /// The trace to write (`-` for standard output).
        #[arg(short, long)]
        output: PathBuf,
        /// CuPy files: fail on a line that is not an event, instead of skipping it.
        #[arg(long)]
        strict: bool,
    },
    /// Replays the trace's allocations and frees through gpumem's pool, once per growth policy,
    /// and prints what each held.
    Replay {
        /// The trace (`-` for standard input).
        file: PathBuf,
        /// Only this policy (default: every policy).
        #[arg(long)]
        policy: Option<String>,
        /// Grow blocks in place, as expandable segments do (each growth a raw allocation).
        #[arg(long)]
        expandable: bool,
        /// Expandable segments with stitching, as GPUMEM_STITCH=1 does: a growth first takes the
        /// pages under free chunks (each lift a raw free, each mapping of lifted pages again a
        /// raw allocation).
        #[arg(long)]
        stitch: bool,
        /// Lend free memory across the trace's streams, as GPUMEM_SHARE_ACROSS_STREAMS=1 does.
        #[arg(long)]
        share_across_streams: bool,
        /// Plan from the loop: tell the pool of each iteration at the trace's step lines, as the
        /// program's gpumem_step calls did.
        #[arg(long)]
        plan: bool,
        /// Plan from the loop with no step lines: the pool finds the iterations from the
        /// allocations (gpumem_plan_automatically, Pool::plan_automatically).
        #[arg(long, conflicts_with = "plan")]
        plan_automatically: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replays the trace through every growth policy, with fixed blocks, with expandable
    /// segments and with stitching (and sharing across streams for a trace of several), and
    /// names the set-up that holds the least without buying it with raw calls, with what each
    /// costs.
    Recommend {
        /// The trace (`-` for standard input).
        file: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Prints peaks, counts, the largest allocations, per-stream figures and the top call sites.
    Stats {
        /// The trace (`-` for standard input).
        file: PathBuf,
        /// How many of the largest allocations, and of the call sites asking for the most bytes,
        /// to list.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print JSON instead of a report.
        #[arg(long)]
        json: bool,
    },
    /// Draws memory over time, each live allocation a band: an HTML page (self-contained,
    /// zoomable, details on hover) or, for `-o FILE.svg`, a static SVG.
    Plot {
        /// The trace (`-` for standard input).
        file: PathBuf,
        /// The page to write: `.html` or `.svg`.
        #[arg(short, long)]
        output: PathBuf,
        /// What colours the bands.
        #[arg(long, value_enum, default_value_t = ColorBy::Stream)]
        color_by: ColorBy,
        /// At most this many allocations get a band of their own (the largest); the rest share
        /// one grey band.
        #[arg(long, default_value_t = 2000)]
        max_bands: usize,
        /// The title (default: the file name).
        #[arg(long)]
        title: Option<String>,
    },
}

/// A progress bar on standard error for work of `len` units (hidden when stderr is not a
/// terminal, as indicatif does by default).
fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}

/// The plan's figures of each replay (`replay --plan`, with the number of iterations marked, or
/// `--plan-automatically`): from the end of the first iteration served from the plan to the end
/// of the trace.
fn write_plans(out: &mut dyn Write, results: &[replay::ReplayResult], marked: Option<usize>) -> Result<()> {
    let (how, at) = match marked {
        Some(n) => (format!("{n} iterations marked"), "iteration"),
        None => ("iterations found from the allocations".to_owned(), "event"),
    };
    writeln!(out, "\nplanned from the loop ({how}); once the plan served one iteration:")?;
    writeln!(
        out,
        "{:<28} {:>16} {:>16} {:>16} {:>8} {:>16} {:>10} {:>10} {:>10} {:>8}",
        "policy",
        format!("in force ({at})"),
        "peak held",
        "peak in use",
        "ratio",
        "held at the end",
        "raw calls",
        "served",
        "departed",
        "period"
    )?;
    for r in results {
        let Some(p) = &r.plan else { continue };
        let in_force = p.in_force_at.map_or_else(|| "never".to_owned(), |k| format!("at {k}"));
        let period = if marked.is_some() { "-".to_owned() } else { p.period.to_string() };
        writeln!(
            out,
            "{:<28} {:>16} {:>16} {:>16} {:>8.3} {:>16} {:>10} {:>10} {:>10} {:>8}",
            r.policy,
            in_force,
            human_bytes(p.peak_held),
            human_bytes(p.peak_in_use),
            p.ratio,
            human_bytes(p.held_at_end),
            p.raw_calls,
            p.served,
            p.departed,
            period
        )?;
    }
    Ok(())
}

fn read_trace(path: &Path) -> Result<Trace> {
    refuse_pickle(path)?;
    let bar = ProgressBar::new_spinner().with_message(format!("reading {}", path.display()));
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let t = format::read_file(path);
    bar.finish_and_clear();
    t
}

/// A pickle (a PyTorch memory snapshot, most likely) given where a trace is read: said as such,
/// with the command that converts it, rather than as the text reader's "not valid UTF-8".
fn refuse_pickle(path: &Path) -> Result<()> {
    if path.as_os_str() == "-" {
        return Ok(());
    }
    let mut head = [0u8; 2];
    let read = File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .map_err(|e| Error::File { path: path.to_owned(), source: e })?;
    // Pickle protocols 2 to 5 open with the PROTO opcode (0x80) and the protocol's number.
    if read == 2 && head[0] == 0x80 && (2..=5).contains(&head[1]) {
        return Err(Error::InvalidArgument(format!(
            "{}: this is a Python pickle (a PyTorch memory snapshot?), not a gpumem trace; convert it first: \
             gpumem-trace import --from pytorch {} -o run.trace",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

/// What `plot` writes, from the output's extension: `.html` (or `-`, standard output) or `.svg`.
fn plot_format(output: &Path) -> Result<PlotFormat> {
    if output.as_os_str() == "-" {
        return Ok(PlotFormat::Html);
    }
    match output.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("html" | "htm") => Ok(PlotFormat::Html),
        Some("svg") => Ok(PlotFormat::Svg),
        _ => Err(Error::InvalidArgument(format!(
            "-o {}: plot writes an interactive page (.html) or a static image (.svg); name the output so",
            output.display()
        ))),
    }
}

/// The two kinds of page `plot` writes.
enum PlotFormat {
    Html,
    Svg,
}

/// A file to write, or `out` for `-`.
fn create<'a>(path: &Path, out: &'a mut dyn Write) -> Result<Box<dyn Write + 'a>> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(out));
    }
    let f = File::create(path).map_err(|e| Error::File { path: path.to_owned(), source: e })?;
    Ok(Box::new(BufWriter::new(f)))
}

/// Parses `args` (the program name first) and runs the command, writing its report to `out`
/// (progress bars and notes go to standard error).
///
/// # Errors
///
/// [`Error::InvalidArgument`] with clap's message for bad arguments (including `--help` and
/// `--version`, whose text is the message); otherwise the command's error.
pub fn run<I, T>(args: I, out: &mut dyn Write) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args).map_err(|e| Error::Usage(e.render().to_string(), e.use_stderr()))?;
    run_cli(cli, out)
}

/// Runs a parsed command line.
fn run_cli(cli: Cli, out: &mut dyn Write) -> Result<()> {
    match cli.command {
        Command::Import { from, file, output, strict } => {
            let f = File::open(&file).map_err(|e| Error::File { path: file.clone(), source: e })?;
            let bar = ProgressBar::new_spinner().with_message(format!("importing {}", file.display()));
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            let (mut trace, report) = match from {
                Source::Cupy => import::cupy(BufReader::new(f), strict)?,
                Source::Pytorch => import::pytorch(BufReader::new(f))?,
            };
            bar.finish_and_clear();
            if let Some(h) = trace.header.as_mut() {
                h.note = Some(format!("imported from {}", file.display()));
            }
            trace.write(create(&output, out)?)?;
            eprintln!(
                "{} events written; {} lines or entries skipped ({} not UTF-8); {} allocations and {} segments from before the recording put at the start",
                report.events, report.skipped, report.not_utf8, report.earlier_allocations, report.earlier_segments
            );
            if let Some(line) = report.first_malformed_line {
                eprintln!(
                    "warning: {} lines name a hook but are not JSON (the first: line {line}); their events are missing",
                    report.malformed_events
                );
            }
        }
        Command::Replay {
            file,
            policy,
            expandable,
            stitch,
            share_across_streams,
            plan,
            plan_automatically,
            json,
        } => {
            let policies = match policy {
                Some(name) => vec![replay::parse_policy(&name)?],
                None => gpumem::GrowthPolicy::ALL.to_vec(),
            };
            let trace = read_trace(&file)?;
            let timeline = Timeline::new(&trace);
            let steps = replay::steps(&timeline);
            let marks = replay::marks(&timeline);
            if plan && marks.len() < 2 {
                return Err(Error::InvalidArgument(format!(
                    "{}: {} step lines; a plan needs the program's iterations marked (gpumem_step, or \
                     Pool::step, called after each while recording)",
                    file.display(),
                    marks.len()
                )));
            }
            let mut results = Vec::new();
            for p in policies {
                if expandable || stitch || share_across_streams || plan || plan_automatically {
                    // The pool's own rules on a counting allocator: fast, no progress to show.
                    results.push(replay::replay_marked(
                        &steps,
                        &marks,
                        p,
                        ReplayOptions { expandable, stitch, share_across_streams, plan, plan_automatically },
                    )?);
                    continue;
                }
                let bar = progress(steps.len() as u64, p.name());
                let r = replay::replay_on::<gpumem::host::Host, _>(
                    &steps,
                    p,
                    0,
                    replay::UntouchedHostMemory,
                    &mut |done| bar.set_position(done as u64),
                )?;
                bar.finish_and_clear();
                results.push(r);
            }
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&results).expect("results serialise"))?;
            } else {
                writeln!(out, "{} events replayed on the host backend", steps.len())?;
                if timeline.lost_frees > 0 {
                    writeln!(
                        out,
                        "{} lost from the trace (an address lent again without a free line), replayed just before",
                        plural(timeline.lost_frees, "free")
                    )?;
                }
                writeln!(out)?;
                writeln!(
                    out,
                    "{:<28} {:>16} {:>16} {:>8} {:>10} {:>10} {:>20}",
                    "policy",
                    "peak held",
                    "peak in use",
                    "ratio",
                    "raw allocs",
                    "raw frees",
                    "lent across streams"
                )?;
                for r in &results {
                    writeln!(
                        out,
                        "{:<28} {:>16} {:>16} {:>8.3} {:>10} {:>10} {:>20}",
                        r.policy,
                        human_bytes(r.peak_held),
                        human_bytes(r.peak_in_use),
                        r.ratio,
                        r.raw_allocs,
                        r.raw_frees,
                        r.lent_across_streams
                    )?;
                }
                if plan {
                    write_plans(out, &results, Some(marks.len()))?;
                } else if plan_automatically {
                    write_plans(out, &results, None)?;
                }
            }
        }
        Command::Recommend { file, json } => {
            let timeline = Timeline::new(&read_trace(&file)?);
            let steps = replay::steps(&timeline);
            let r = recommend::recommend_marked(&steps, &replay::marks(&timeline))?;
            if json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&r).expect("the recommendation serialises")
                )?;
            } else {
                writeln!(out, "{} steps replayed on the host backend\n", steps.len())?;
                write!(out, "{}", r.render())?;
            }
        }
        Command::Stats { file, top, json } => {
            let stats = Timeline::new(&read_trace(&file)?).stats(top)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&stats).expect("stats serialise"))?;
            } else {
                write!(out, "{}", stats.render())?;
            }
        }
        Command::Plot { file, output, color_by, max_bands, title } => {
            let format = plot_format(&output)?;
            let trace = read_trace(&file)?;
            let title = title.unwrap_or_else(|| {
                file.file_name().map_or_else(|| "gpumem trace".into(), |n| n.to_string_lossy().into_owned())
            });
            let layout = plot::layout(&Timeline::new(&trace), &PlotOptions { max_bands, color_by, title })?;
            let text = match format {
                PlotFormat::Html => plot::html(&layout),
                PlotFormat::Svg => plot::svg(&layout),
            };
            let mut w = create(&output, out)?;
            w.write_all(text.as_bytes())?;
            w.flush()?;
            eprintln!(
                "{}: {} bands ({} allocations merged into one)",
                output.display(),
                layout.bands.len(),
                layout.allocations_merged
            );
        }
    }
    out.flush()?;
    Ok(())
}

/// `1 free`, `2 frees`.
fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
