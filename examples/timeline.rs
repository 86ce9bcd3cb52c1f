//! A timeline without Nsight: runs a small fused plan a few times with a `guards::Timeline`
//! around each run and on every op or region, and writes one Chrome trace event file into
//! `BOUNDSCOPE_TRACE_DIR` (or the working directory). Prints only the file's path; open it in
//! ui.perfetto.dev or chrome://tracing.
//!
//! `cargo run --release --example timeline`

use std::process::ExitCode;

use boundscope::frontend::Environment;
use boundscope::guards::Timeline;

#[path = "shared/timeline_plan.rs"]
mod timeline_plan;

fn main() -> ExitCode {
    match run() {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("timeline: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> boundscope::Result<std::path::PathBuf> {
    let dir = Environment::process().trace_dir()?;
    let timeline = Timeline::new();
    timeline_plan::run_plan(&timeline)?;
    timeline.write_chrome_trace(dir)
}
