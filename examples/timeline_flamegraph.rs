//! The timeline as a picture: runs the plan of `examples/timeline.rs` with a `guards::Timeline`,
//! folds what it recorded into stacks (`guards::folded_stacks`: self time per stack, summed over
//! the runs) and renders them as an SVG flame graph with the `inferno` crate, written to
//! `boundscope-timeline.svg` in `BOUNDSCOPE_TRACE_DIR` (or the working directory). Prints only
//! the file's path. `scripts/timeline-svg` runs it and copies the picture to
//! `examples/timeline_flamegraph.svg`, which the README shows.
//!
//! `cargo run --release --example timeline_flamegraph`

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use boundscope::frontend::Environment;
use boundscope::guards::{folded_stacks, Timeline};
use inferno::flamegraph::{self, Options};

#[path = "shared/timeline_plan.rs"]
mod timeline_plan;

/// The file's name in the trace directory.
const FILE_NAME: &str = "boundscope-timeline.svg";

fn main() -> ExitCode {
    match run() {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("timeline_flamegraph: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<PathBuf, Box<dyn Error>> {
    let dir = Environment::process().trace_dir()?;
    let timeline = Timeline::new();
    let runs = timeline_plan::run_plan(&timeline)?;
    let folded = folded_stacks(&timeline.to_chrome_trace());
    if folded.is_empty() {
        return Err("the timeline recorded no scopes".into());
    }

    let mut options = Options::default();
    options.title = format!("boundscope timeline: {runs} runs of examples/timeline.rs");
    options.subtitle = Some("width = host time spent in each scope itself (self time), summed over the runs".into());
    options.name_type = "Scope:".into();
    options.count_name = "µs".into();
    options.image_width = Some(1200);
    // Colours from a hash of each name, not random: a new picture differs only where times do.
    options.hash = true;
    // `folded_stacks` orders its lines by frames already (inferno would sort them as text).
    options.no_sort = true;
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, folded.lines(), &mut svg)?;

    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let path = dir.join(FILE_NAME);
    std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}
