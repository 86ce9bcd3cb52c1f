//! Every option boundscope knows, as a table: how a user learns that a knob exists, what its
//! default is, and when to deviate.
//!
//! ```text
//! cargo run --example options
//! ```

use boundscope::options::list;

fn main() {
    let specs = list();
    let rows: Vec<[String; 6]> = specs
        .iter()
        .map(|s| {
            [
                s.name.to_string(),
                s.ty.to_string(),
                s.default.to_string(),
                s.audience.to_string(),
                s.env.unwrap_or("-").to_string(),
                s.doc.to_string(),
            ]
        })
        .collect();
    let header = ["name", "type", "default", "audience", "environment", "doc"];
    let widths: Vec<usize> =
        (0..5).map(|c| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0)).collect();
    let line = |cells: [&str; 6]| {
        let mut out = String::new();
        for (c, cell) in cells.iter().enumerate() {
            if c < 5 {
                out.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            } else {
                out.push_str(cell);
            }
        }
        println!("{}", out.trim_end());
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    println!(
        "\nUser options: set with Options::set / set_str, or their environment variable. Developer options: only\n\
         through Options::set_developer, and every plan built with one lists it in its header.\n\
         Profiling: BOUNDSCOPE_NVTX=1|0 overrides the detection of an attached profiler (runtime.profiling=auto)."
    );
}
