//! Device buffers shared by values whose lifetimes do not overlap.
//!
//! The compiler gives every value computed on the device a buffer of its own. Most live for a
//! few steps: a training step's backward temporaries, a forward's intermediates that the
//! backward does not read. After compiling, [`share_device_buffers`] maps the buffers onto
//! fewer: walking the steps in order, each step's outputs take a free buffer of exactly their
//! length (else a new one), and a buffer is freed after the step that reads it last. Exact
//! lengths keep every kernel's length checks as they were; "after the step" keeps a step's
//! outputs apart from its inputs. The steps of one run are queued on one stream in this order
//! (host steps wait for the device), so a buffer is rewritten only after the last kernel that
//! reads its previous value.
//!
//! Buffers the caller sees or swaps stay the value's own: the uploads of inputs (a run may
//! lend its own device tensor there), the outputs (read after the run, exchanged by in-place
//! updates), and uploads of host values (written by a transfer, not a kernel).

use std::collections::HashMap;

use super::compile::{Slot, Step, Work};

/// Renames the device buffers of `steps` so that values whose lifetimes do not overlap share
/// one; buffers in `exclusive` keep one of their own. Returns the new buffers' lengths and the
/// new name of each old buffer.
pub(crate) fn share_device_buffers(steps: &mut [Step], lengths: &[usize], exclusive: &[u32]) -> (Vec<usize>, Vec<u32>) {
    let n = lengths.len();
    let mut kept = vec![false; n];
    for &b in exclusive {
        kept[b as usize] = true;
    }
    // The step that writes each buffer and the last that reads it.
    let mut written = vec![None; n];
    let mut last_read = vec![0usize; n];
    for (s, step) in steps.iter().enumerate() {
        for slot in &step.inputs {
            if let Slot::Device(d) = *slot {
                last_read[d as usize] = last_read[d as usize].max(s);
            }
        }
        match step.work {
            Work::Device(_) => {
                for &o in &step.outputs {
                    written[o as usize].get_or_insert(s);
                    last_read[o as usize] = last_read[o as usize].max(s);
                }
            }
            // Written by a transfer: kept.
            Work::Upload => kept[step.outputs[0] as usize] = true,
            Work::Host(_) | Work::Download => {}
        }
    }
    // A buffer written twice, or read before it is written, is left alone.
    for (s, step) in steps.iter().enumerate() {
        if matches!(step.work, Work::Device(_)) {
            for &o in &step.outputs {
                if written[o as usize] != Some(s) {
                    kept[o as usize] = true;
                }
            }
        }
        for slot in &step.inputs {
            if let Slot::Device(d) = *slot {
                if written[d as usize].is_none_or(|w| w > s) {
                    kept[d as usize] = true;
                }
            }
        }
    }
    let mut freed_after: Vec<Vec<u32>> = vec![Vec::new(); steps.len()];
    for b in 0..n {
        if !kept[b] && written[b].is_some() {
            freed_after[last_read[b]].push(b as u32);
        }
    }
    let mut new_lengths = Vec::new();
    let mut renamed = vec![u32::MAX; n];
    let mut free: HashMap<usize, Vec<u32>> = HashMap::new();
    let fresh = |len: usize, new_lengths: &mut Vec<usize>| {
        new_lengths.push(len);
        (new_lengths.len() - 1) as u32
    };
    for (b, &len) in lengths.iter().enumerate() {
        if kept[b] || written[b].is_none() {
            renamed[b] = fresh(len, &mut new_lengths);
        }
    }
    for (s, step) in steps.iter().enumerate() {
        if matches!(step.work, Work::Device(_)) {
            for &o in &step.outputs {
                let o = o as usize;
                if renamed[o] == u32::MAX {
                    renamed[o] = match free.get_mut(&lengths[o]).and_then(Vec::pop) {
                        Some(shared) => shared,
                        None => fresh(lengths[o], &mut new_lengths),
                    };
                }
            }
        }
        for &b in &freed_after[s] {
            free.entry(lengths[b as usize]).or_default().push(renamed[b as usize]);
        }
    }
    for step in steps.iter_mut() {
        for slot in step.inputs.iter_mut() {
            if let Slot::Device(d) = slot {
                *d = renamed[*d as usize];
            }
        }
        if matches!(step.work, Work::Device(_) | Work::Upload) {
            for o in step.outputs.iter_mut() {
                *o = renamed[*o as usize];
            }
        }
    }
    (new_lengths, renamed)
}
