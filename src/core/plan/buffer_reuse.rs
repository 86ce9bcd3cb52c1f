//! Device memory shared by values whose lifetimes do not overlap.
//!
//! The compiler gives every value computed on the device a buffer of its own. Most live for a
//! few steps: a training step's backward temporaries, a forward's intermediates that the
//! backward does not read. After compiling, [`share_device_buffers`] lays the buffers out in
//! less memory, in one of two ways:
//!
//! - **Within one block**, on a device that makes buffers inside one allocation
//!   ([`Device::alloc_within`](super::Device::alloc_within), as the CUDA device does): each
//!   value gets a range of one block, placed so that values live at the same time never
//!   overlap (largest first, each in the tightest gap that the values placed so far leave free
//!   during its lifetime: the "greedy by size" placement of TensorFlow Lite's arena planner). A
//!   step's temporaries reuse the memory of any dead value, whatever its length, so the block
//!   is about the most memory live at one step.
//! - **Whole buffers**, on other devices: walking the steps in order, each step's outputs take
//!   a free buffer of exactly their length (else a new one), and a buffer is freed after the
//!   step that reads it last.
//!
//! Either way every buffer keeps its exact length (every kernel's length checks hold as they
//! were), and a value's memory is reused only after the step that reads it last, never by that
//! step's own outputs. The steps of one run are queued on one stream in this order (host steps
//! wait for the device), so memory is rewritten only after the last kernel that reads its
//! previous value.
//!
//! Buffers the caller sees or swaps stay the value's own: the uploads of inputs (a run may
//! lend its own device tensor there), the outputs (read after the run, exchanged by in-place
//! updates), and uploads of host values (written by a transfer, not a kernel). A buffer that no
//! step uses any more (an update written over its input's upload, see `in_place`) holds nothing.

use std::collections::HashMap;

use super::compile::{Slot, Step, Work};

/// Offsets in a shared block are multiples of this many words (256 bytes, as CUDA's own
/// allocations are aligned), so that every buffer is aligned as a kernel expects.
const ALIGN_WORDS: usize = 64;

/// Where a plan's device buffers live.
pub(crate) struct DeviceLayout {
    /// Each buffer's length in words.
    pub lengths: Vec<usize>,
    /// The new name of each buffer the compiler made (sharing whole buffers renames them).
    pub renamed: Vec<u32>,
    /// Per buffer: its offset in words within the shared block, if it lives there.
    pub offsets: Vec<Option<usize>>,
    /// Words of the shared block (0: none).
    pub block_words: usize,
}

/// Lays out the device buffers of `steps` (of `lengths` words) so that values whose lifetimes
/// do not overlap share memory: within one block of `within_one_block` (else as whole
/// buffers, renaming `steps`' buffers). Buffers in `exclusive` keep their own memory.
pub(crate) fn share_device_buffers(
    steps: &mut [Step],
    lengths: &[usize],
    exclusive: &[u32],
    within_one_block: bool,
) -> DeviceLayout {
    let lives = Lifetimes::of(steps, lengths.len(), exclusive);
    if within_one_block {
        lives.place_in_block(lengths)
    } else {
        lives.share_whole_buffers(steps, lengths)
    }
}

/// When each device buffer is written and last read, and which keep their own memory.
struct Lifetimes {
    /// The step that writes each buffer (first), if one does.
    written: Vec<Option<usize>>,
    /// The last step that reads (or writes) each buffer.
    last_read: Vec<usize>,
    /// Buffers that keep memory of their own.
    kept: Vec<bool>,
    /// Buffers some step reads or writes.
    used: Vec<bool>,
}

impl Lifetimes {
    fn of(steps: &[Step], n: usize, exclusive: &[u32]) -> Self {
        let mut kept = vec![false; n];
        for &b in exclusive {
            kept[b as usize] = true;
        }
        let mut written = vec![None; n];
        let mut last_read = vec![0usize; n];
        let mut used = vec![false; n];
        for (s, step) in steps.iter().enumerate() {
            for slot in &step.inputs {
                if let Slot::Device(d) = *slot {
                    last_read[d as usize] = last_read[d as usize].max(s);
                    used[d as usize] = true;
                }
            }
            match step.work {
                Work::Device(_) => {
                    for &o in &step.outputs {
                        written[o as usize].get_or_insert(s);
                        last_read[o as usize] = last_read[o as usize].max(s);
                        used[o as usize] = true;
                    }
                }
                // Written by a transfer: kept.
                Work::Upload => {
                    kept[step.outputs[0] as usize] = true;
                    used[step.outputs[0] as usize] = true;
                }
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
        Self { written, last_read, kept, used }
    }

    /// Whether buffer `b` may share memory: written by a kernel, not kept.
    fn shares(&self, b: usize) -> bool {
        !self.kept[b] && self.written[b].is_some()
    }

    /// The length a buffer of `len` words needs: none if no step uses it.
    fn needs(&self, b: usize, len: usize) -> usize {
        if self.used[b] {
            len
        } else {
            0
        }
    }

    /// Every shared buffer at an offset of one block; the others keep their own memory.
    fn place_in_block(&self, lengths: &[usize]) -> DeviceLayout {
        let n = lengths.len();
        let mut order: Vec<usize> = (0..n).filter(|&b| self.shares(b) && lengths[b] > 0).collect();
        let size = |b: usize| lengths[b].div_ceil(ALIGN_WORDS) * ALIGN_WORDS;
        order.sort_by_key(|&b| (std::cmp::Reverse(size(b)), self.written[b]));
        // Placed so far: (first step, last step, offset, end), and the ranges a new buffer
        // must avoid (reused per buffer).
        let mut placed: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(order.len());
        let mut busy: Vec<(usize, usize)> = Vec::new();
        let mut offsets = vec![None; n];
        let mut block_words = 0;
        for b in order {
            let (first, last, words) = (self.written[b].unwrap_or(0), self.last_read[b], size(b));
            busy.clear();
            busy.extend(placed.iter().filter(|p| p.0 <= last && first <= p.1).map(|p| (p.2, p.3)));
            busy.sort_unstable();
            // The smallest gap that holds it, else the end of what is busy.
            let (mut best, mut cursor): (Option<(usize, usize)>, usize) = (None, 0);
            for &(start, end) in &busy {
                if start >= cursor + words && best.is_none_or(|(gap, _)| start - cursor < gap) {
                    best = Some((start - cursor, cursor));
                }
                cursor = cursor.max(end);
            }
            let offset = best.map_or(cursor, |(_, at)| at);
            placed.push((first, last, offset, offset + words));
            offsets[b] = Some(offset);
            block_words = block_words.max(offset + words);
        }
        let lengths = (0..n).map(|b| self.needs(b, lengths[b])).collect();
        DeviceLayout { lengths, renamed: (0..n as u32).collect(), offsets, block_words }
    }

    /// Shared buffers renamed onto fewer of the same lengths.
    fn share_whole_buffers(&self, steps: &mut [Step], lengths: &[usize]) -> DeviceLayout {
        let n = lengths.len();
        let mut freed_after: Vec<Vec<u32>> = vec![Vec::new(); steps.len()];
        for b in (0..n).filter(|&b| self.shares(b)) {
            freed_after[self.last_read[b]].push(b as u32);
        }
        let mut new_lengths = Vec::new();
        let mut renamed = vec![u32::MAX; n];
        let mut free: HashMap<usize, Vec<u32>> = HashMap::new();
        let fresh = |len: usize, new_lengths: &mut Vec<usize>| {
            new_lengths.push(len);
            (new_lengths.len() - 1) as u32
        };
        for (b, &len) in lengths.iter().enumerate() {
            if !self.shares(b) {
                renamed[b] = fresh(self.needs(b, len), &mut new_lengths);
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
        let offsets = vec![None; new_lengths.len()];
        DeviceLayout { lengths: new_lengths, renamed, offsets, block_words: 0 }
    }
}

#[cfg(test)]
mod tests {
    use smallvec::SmallVec;

    use super::*;
    use crate::core::plan::{DeviceBuffer, DeviceKernel};

    struct Nothing;

    impl DeviceKernel for Nothing {
        fn run(&self, _: &[&dyn DeviceBuffer], _: &mut [&mut dyn DeviceBuffer]) -> crate::Result<()> {
            Ok(())
        }
    }

    fn step(work: Work, inputs: &[u32], outputs: &[u32]) -> Step {
        Step::new(
            work,
            inputs.iter().map(|&d| Slot::Device(d)).collect(),
            SmallVec::from_slice(outputs),
            String::new(),
            0,
        )
    }

    fn kernel(inputs: &[u32], outputs: &[u32]) -> Step {
        step(Work::Device(Box::new(Nothing)), inputs, outputs)
    }

    /// Checks that block buffers live at the same time never overlap, and returns the layout.
    fn placed(steps: &mut [Step], lengths: &[usize], exclusive: &[u32]) -> DeviceLayout {
        let layout = share_device_buffers(steps, lengths, exclusive, true);
        let lives = Lifetimes::of(steps, lengths.len(), exclusive);
        let range = |b: usize| layout.offsets[b].map(|o| (o, o + lengths[b]));
        for a in 0..lengths.len() {
            for b in a + 1..lengths.len() {
                let (Some(ra), Some(rb)) = (range(a), range(b)) else { continue };
                let (la, lb) =
                    ((lives.written[a].unwrap(), lives.last_read[a]), (lives.written[b].unwrap(), lives.last_read[b]));
                let live_together = la.0 <= lb.1 && lb.0 <= la.1;
                let overlap = ra.0 < rb.1 && rb.0 < ra.1;
                assert!(!(live_together && overlap), "buffers {a} {la:?} at {ra:?} and {b} {lb:?} at {rb:?}");
                assert!(ra.1 <= layout.block_words && rb.1 <= layout.block_words);
            }
            if let Some(offset) = layout.offsets[a] {
                assert_eq!(offset % ALIGN_WORDS, 0);
            }
        }
        layout
    }

    #[test]
    fn values_of_any_length_reuse_dead_values_memory_in_the_block() {
        // upload -> 100 words -> 50 -> 100 -> 30 (an output): the first 100 is dead when the
        // second is written, so they share; the 50 lives beside both.
        let chain = || {
            let mut steps = vec![step(Work::Upload, &[], &[0])];
            steps.extend((0..4).map(|b| kernel(&[b], &[b + 1])));
            steps
        };
        let lengths = [10, 100, 50, 100, 30];
        let layout = placed(&mut chain(), &lengths, &[4]);
        assert_eq!(layout.offsets[1], layout.offsets[3]);
        assert_eq!(layout.offsets[0], None, "an upload keeps its own");
        assert_eq!(layout.offsets[4], None, "an output keeps its own");
        assert_eq!(layout.block_words, 128 + 64);
        assert_eq!(layout.renamed, vec![0, 1, 2, 3, 4]);
        // Whole buffers share only within one length: the two 100s.
        let whole = share_device_buffers(&mut chain(), &lengths, &[4], false);
        assert_eq!(whole.lengths.iter().sum::<usize>(), 10 + 100 + 50 + 30, "the two 100s share");
        // A smaller temporary later fits in the space of a dead larger one.
        let mut steps = vec![kernel(&[], &[0]), kernel(&[0], &[1]), kernel(&[1], &[2]), kernel(&[2], &[3])];
        let layout = placed(&mut steps, &[1000, 10, 300, 5], &[3]);
        assert_eq!(layout.block_words, 1024 + 64, "the 300 takes the dead 1000's place: {:?}", layout.offsets);
    }

    #[test]
    fn random_programs_never_place_live_values_together() {
        // A small linear congruential generator: programs of up to 40 steps, each reading one
        // to three earlier values and writing one or two of random lengths.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) as usize) % n.max(1)
        };
        for _ in 0..200 {
            let mut steps = vec![step(Work::Upload, &[], &[0])];
            let mut lengths = vec![1 + next(500)];
            for _ in 0..1 + next(40) {
                let inputs: Vec<u32> = (0..1 + next(3)).map(|_| next(lengths.len()) as u32).collect();
                let outputs: Vec<u32> = (0..1 + next(2))
                    .map(|_| {
                        lengths.push(1 + next(500));
                        (lengths.len() - 1) as u32
                    })
                    .collect();
                steps.push(kernel(&inputs, &outputs));
            }
            let outputs = [(lengths.len() - 1) as u32];
            let layout = placed(&mut steps, &lengths, &outputs);
            // Every buffer that may share is in the block, and the block is never larger than
            // those buffers laid end to end.
            let lives = Lifetimes::of(&steps, lengths.len(), &outputs);
            let in_block = |b: usize| lives.shares(b) && lengths[b] > 0;
            for b in 0..lengths.len() {
                assert_eq!(layout.offsets[b].is_some(), in_block(b), "buffer {b}");
            }
            let end_to_end: usize = (0..lengths.len())
                .filter(|&b| in_block(b))
                .map(|b| lengths[b].div_ceil(ALIGN_WORDS) * ALIGN_WORDS)
                .sum();
            assert!(layout.block_words <= end_to_end);
        }
    }
}
