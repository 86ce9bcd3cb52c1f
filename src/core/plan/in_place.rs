//! Updates written over the inputs they update.
//!
//! A training step's optimizer reads each parameter (and its state) and computes its new value,
//! which replaces the input after the run ([`TraceBuilder::update`](crate::TraceBuilder::update)).
//! Computed into a buffer of its own, each such value would exist twice at the end of every
//! step: the input, and the update that replaces it. After compiling,
//! [`write_updates_over_inputs`] finds the updates that a device kernel computes from the
//! input's upload in the last step that reads it, and that the kernel agrees to write in place
//! ([`DeviceKernel::in_place`](super::DeviceKernel::in_place)): the update then lives in the
//! upload's buffer, which [`Plan::run_updating_on_device`](super::Plan::run_updating_on_device)
//! fills by lending the caller's own tensor for the run (no copy, no second buffer), and which
//! other runs fill with the input's value (an upload, or a copy on the device) as before.

use super::compile::{Slot, Step, Work};

/// For each `(upload, update)` pair of device buffers (the upload of an updated input, and the
/// buffer its update is computed into), runs the update's step in place where it can: the step
/// writes the update over the upload, and every step reading the update reads the upload's
/// buffer instead. Returns the pairs it merged, as `(update, upload)`: the update's old buffer
/// is no longer used.
pub(crate) fn write_updates_over_inputs(
    steps: &mut [Step],
    pairs: &[(u32, u32)],
    lengths: &[usize],
) -> Vec<(u32, u32)> {
    let mut merged = Vec::new();
    for &(upload, update) in pairs {
        let Some((s, k, j)) = in_place_site(steps, upload, update, lengths) else {
            continue;
        };
        steps[s].in_place.push((k as u32, j as u32));
        for step in steps.iter_mut() {
            for slot in step.inputs.iter_mut() {
                if *slot == Slot::Device(update) {
                    *slot = Slot::Device(upload);
                }
            }
            if matches!(step.work, Work::Device(_)) {
                for o in step.outputs.iter_mut().filter(|o| **o == update) {
                    *o = upload;
                }
            }
        }
        merged.push((update, upload));
    }
    merged
}

/// The step that may write `update` over `upload`, with the positions of the two in it: the
/// one device step writing `update`, reading `upload` once, the last step to read `upload`
/// (which only the input's transfer writes), whose kernel agrees.
fn in_place_site(steps: &[Step], upload: u32, update: u32, lengths: &[usize]) -> Option<(usize, usize, usize)> {
    if lengths.get(upload as usize)? != lengths.get(update as usize)? {
        return None;
    }
    let writes =
        |step: &Step, d: u32| !matches!(step.work, Work::Download | Work::Host(_)) && step.outputs.contains(&d);
    let mut writers = steps.iter().enumerate().filter(|(_, step)| writes(step, update));
    let (Some((s, step)), None) = (writers.next(), writers.next()) else {
        return None;
    };
    let Work::Device(kernel) = &step.work else {
        return None;
    };
    let upload_writers: Vec<bool> =
        steps.iter().filter(|step| writes(step, upload)).map(|step| matches!(step.work, Work::Upload)).collect();
    if upload_writers != [true] {
        return None;
    }
    let last_read = steps.iter().rposition(|step| step.inputs.contains(&Slot::Device(upload)))?;
    let mut reads = step.inputs.iter().enumerate().filter(|(_, slot)| **slot == Slot::Device(upload));
    let (Some((k, _)), None) = (reads.next(), reads.next()) else {
        return None;
    };
    let j = step.outputs.iter().position(|&o| o == update)?;
    (last_read == s && kernel.in_place(k, j)).then_some((s, k, j))
}
