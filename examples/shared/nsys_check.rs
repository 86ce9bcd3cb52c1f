//! Hands `scripts/nsys-check` the ranges a program's runs pushed, as the plans' range maps say.

/// Writes `counts` (lines `domain<TAB>label<TAB>count`, from
/// [`RangeMap::counts_tsv`](boundscope::RangeMap::counts_tsv)) to the file that
/// `scripts/nsys-check` names in `NSYS_CHECK_RANGE_MAP`; does nothing when it is not set.
/// Exits with status 1 if the file cannot be written.
pub fn write_expected_ranges(counts: &str) {
    let Some(path) = std::env::var_os("NSYS_CHECK_RANGE_MAP") else { return };
    if let Err(e) = std::fs::write(&path, counts) {
        eprintln!("error: cannot write the expected ranges to {}: {e}", path.to_string_lossy());
        std::process::exit(1);
    }
}
