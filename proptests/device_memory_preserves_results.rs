//! A user's device whose buffers are ranges of one block (`Device::alloc_within`) and whose
//! kernels write updates over their inputs (`DeviceKernel::in_place`), built through the public
//! API only, gives the CPU reference's results bit for bit: on random programs (the block layout
//! never lets a value overwrite one still to be read) and on training steps (updates written
//! over the caller's device tensors, step after step); and on small chains, the device memory the
//! layout holds is the bytes stated. Runs on any machine: the device's memory is host memory.

mod common;

use std::sync::{Arc, Mutex};

use boundscope::executors::CpuReference;
use boundscope::optim::AdamW;
use boundscope::passes::Grad;
use boundscope::{
    Arena, Device, DeviceBuffer, DeviceKernel, DeviceTensor, Executor, Kernel, OpView, Plan, Registry, RunInput,
    RunInputMut, Tensor, TensorMut, TensorRef,
};
use common::program::{programs, transformer_programs, Program};
use proptest::prelude::*;

/// A range of a block of host memory, standing for device memory.
struct Range {
    block: Arc<Mutex<Vec<f32>>>,
    offset: usize,
    len: usize,
}

impl Range {
    fn read(&self) -> Vec<f32> {
        self.block.lock().unwrap()[self.offset..self.offset + self.len].to_vec()
    }
    fn write(&self, values: &[f32]) {
        self.block.lock().unwrap()[self.offset..self.offset + values.len()].copy_from_slice(values);
    }
}

impl DeviceBuffer for Range {
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn range(buffer: &dyn DeviceBuffer) -> &Range {
    buffer.as_any().downcast_ref::<Range>().expect("a range of this device")
}

/// The device: blocks filled with NaN, so that a value read before it is written shows.
struct Blocks;

impl Device for Blocks {
    fn name(&self) -> &str {
        "blocks"
    }
    fn alloc(&self, len: usize) -> boundscope::Result<Box<dyn DeviceBuffer>> {
        Ok(Box::new(Range { block: Arc::new(Mutex::new(vec![f32::NAN; len])), offset: 0, len }))
    }
    fn allocates_within(&self) -> bool {
        true
    }
    fn alloc_within(&self, words: usize, parts: &[(usize, usize)]) -> boundscope::Result<Vec<Box<dyn DeviceBuffer>>> {
        let block = Arc::new(Mutex::new(vec![f32::NAN; words]));
        let part = |&(offset, len): &(usize, usize)| {
            assert!(offset + len <= words, "a part past the block's end");
            Box::new(Range { block: block.clone(), offset, len }) as Box<dyn DeviceBuffer>
        };
        Ok(parts.iter().map(part).collect())
    }
    fn upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> boundscope::Result<()> {
        range(target).write(source);
        Ok(())
    }
    fn download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> boundscope::Result<()> {
        target.copy_from_slice(&range(source).read()[..target.len()]);
        Ok(())
    }
}

/// Runs every op the CPU reference claims on `Blocks`: its kernel on copies of the ranges
/// (f32 values). It reads all inputs before it writes, so it takes every in-place pair offered.
struct OnBlocks(Arc<dyn Device>);

struct Copied {
    kernel: Box<dyn Kernel>,
    inputs: Vec<Vec<usize>>,
    outputs: Vec<Vec<usize>>,
    in_place: Vec<(usize, usize)>,
}

impl DeviceKernel for Copied {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> boundscope::Result<()> {
        // An empty input is written over: its value is in the output named for it.
        let read = |k: usize| match self.in_place.iter().find(|&&(i, _)| i == k) {
            Some(&(_, o)) if inputs[k].is_empty() => range(&*outputs[o]).read(),
            _ => range(inputs[k]).read(),
        };
        let ins: Vec<Tensor> =
            (0..self.inputs.len()).map(|k| Tensor::new(&self.inputs[k], read(k))).collect::<Result<_, _>>()?;
        let views: Vec<TensorRef<'_>> = ins.iter().map(Tensor::view).collect();
        let mut outs: Vec<Tensor> = self.outputs.iter().map(|shape| Tensor::zeros(shape)).collect();
        let mut out_views: Vec<TensorMut<'_>> = outs.iter_mut().map(Tensor::view_mut).collect();
        self.kernel.run(&views, &mut out_views)?;
        for (buffer, t) in outputs.iter().zip(&outs) {
            range(&**buffer).write(&t.to_f32_vec());
        }
        Ok(())
    }
    fn in_place(&self, input: usize, output: usize) -> bool {
        self.in_place.contains(&(input, output))
    }
}

impl Executor for OnBlocks {
    fn name(&self) -> &str {
        "on_blocks"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        CpuReference::shared().claims(op)
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.0.clone())
    }
    fn compile_device(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn DeviceKernel>> {
        let inputs = (0..op.bound_symbol().inputs().count()).map(|i| op.input_shape(i).map(<[usize]>::to_vec));
        let outputs = (0..op.output_count()).map(|i| op.output_shape(i).map(<[usize]>::to_vec));
        Ok(Box::new(Copied {
            kernel: CpuReference::shared().compile(op)?,
            inputs: inputs.collect::<boundscope::Result<_>>()?,
            outputs: outputs.collect::<boundscope::Result<_>>()?,
            in_place: op.in_place_updates().to_vec(),
        }))
    }
}

fn on_blocks() -> Arc<dyn Executor> {
    Arc::new(OnBlocks(Arc::new(Blocks)))
}

/// `program` on the block device (inputs on the host, then on the device, twice each in one
/// workspace) against the CPU reference, bit for bit.
fn check(program: &Program, seed: u64) -> Result<(), TestCaseError> {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let trace = program.build(&arena, &registry).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let inputs = program.input_data(seed);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
    let plan = Plan::compile(&trace, &[on_blocks()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let device = plan.device().cloned();
    let on_device: Vec<DeviceTensor> = match &device {
        Some(device) => inputs.iter().map(|t| DeviceTensor::upload(device, t.view()).unwrap()).collect(),
        None => Vec::new(),
    };
    let mut ws = plan.workspace().unwrap();
    for round in 0..4 {
        let given: Vec<RunInput<'_>> = if round % 2 == 1 && device.is_some() {
            on_device.iter().map(RunInput::from).collect()
        } else {
            inputs.iter().map(|t| RunInput::from(t.view())).collect()
        };
        let got = plan.run_with(&mut ws, &given).map_err(|e| TestCaseError::fail(e.to_string()))?.to_tensors();
        for (o, (got, want)) in got.iter().zip(&expected).enumerate() {
            let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
            let same = g.len() == w.len() && g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "round {round}, output {o}: {g:?}\nwant {w:?}\n{plan}");
        }
    }
    prop_assert!(ws.device_bytes() <= plan.device_bytes());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn programs_in_one_block_match_the_reference(program in programs(true), seed in any::<u64>()) {
        check(&program, seed)?;
    }

    #[test]
    fn transformer_programs_in_one_block_match_the_reference(program in transformer_programs(), seed in any::<u64>()) {
        check(&program, seed)?;
    }
}

/// An MLP's AdamW training step, updates written over the caller's device tensors, step after
/// step, bit for bit as the CPU reference updating host tensors; with and without weight
/// decay (without it, each parameter's update reads the parameter last: written over it).
#[test]
fn training_steps_written_over_the_inputs_match_the_reference() {
    for decay in [0.0, 0.01] {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let x = b.input(&[6, 8]).unwrap();
        let (w1, b1, w2) = (b.input(&[5, 8]).unwrap(), b.input(&[5]).unwrap(), b.input(&[3, 5]).unwrap());
        let h = b.linear(x, w1, Some(b1)).unwrap();
        let h = b.tanh(h).unwrap();
        let y = b.linear(h, w2, None).unwrap();
        let sq = b.mul(y, y).unwrap();
        let rows = b.sum(sq).unwrap(); // [6, 1]
        let rows = b.reshape(rows, &[1, 6]).unwrap();
        let loss = b.sum(rows).unwrap(); // one element
        b.output(loss).unwrap();
        let adamw = AdamW::new().weight_decay(decay);
        let step = Grad::new(&[w1, b1, w2]).training_step(&b.finish().unwrap(), &arena, &adamw).unwrap().trace;
        let reference = Plan::compile(&step, &[CpuReference::shared()]).unwrap();
        let plan = Plan::compile(&step, &[on_blocks()]).unwrap();
        let device = plan.device().unwrap().clone();
        let mut host: Vec<Tensor> = step
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let shape = step.value_meta(v).unwrap().shape.to_vec();
                Tensor::from_fn(&shape, |i| if k < 4 { ((i * 7 + k * 3) % 11) as f32 / 11.0 - 0.5 } else { 0.0 })
            })
            .collect();
        let mut on_device: Vec<DeviceTensor> =
            host.iter().map(|t| DeviceTensor::upload(&device, t.view()).unwrap()).collect();
        let (mut host_ws, mut ws) = (reference.workspace().unwrap(), plan.workspace().unwrap());
        let memory = |t: &DeviceTensor| t.buffer() as *const dyn DeviceBuffer as *const u8;
        let held: Vec<*const u8> = on_device.iter().map(memory).collect();
        for t in 1..=5u64 {
            for (k, value) in (4..7).zip(adamw.step_scalars(t, 1e-2)) {
                host[k] = Tensor::from_fn(&[], |_| value);
                on_device[k].copy_from_host(host[k].view()).unwrap();
            }
            let mut refs: Vec<&mut Tensor> = host.iter_mut().collect();
            let want = reference.run_updating(&mut host_ws, &mut refs).unwrap().to_tensors();
            let mut given: Vec<RunInputMut<'_>> = on_device.iter_mut().map(RunInputMut::from).collect();
            let got = plan.run_updating_on_device(&mut ws, &mut given).unwrap();
            assert_eq!(got.to_host(0).unwrap(), want[0], "decay {decay}, step {t}: the loss");
            for (k, (device, host)) in on_device.iter().zip(&host).enumerate() {
                assert_eq!(device.to_host().unwrap(), *host, "decay {decay}, step {t}: input {k}");
            }
            // Without decay each parameter's update reads the parameter last: it is written over
            // the parameter's own memory (with decay, updates are exchanged with the inputs).
            if decay == 0.0 {
                for k in 1..4 {
                    assert_eq!(memory(&on_device[k]), held[k], "step {t}: parameter {k} kept its memory\n{plan}");
                }
            }
        }
    }
}

#[test]
fn a_training_step_on_a_block_device_updates_in_place_and_keeps_temporaries_in_the_block() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let (w, g) = (b.input(&[4, 32]).unwrap(), b.input(&[4, 32]).unwrap());
    let step = b.mul_scalar(g, 0.5).unwrap(); // a temporary, in the block
    let updated = b.sub(w, step).unwrap(); // written over w
    b.update(w, updated).unwrap();
    let norm = b.sum_dim(updated, 1, false).unwrap();
    b.output(norm).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[on_blocks()]).unwrap();
    let device = plan.device().unwrap().clone();
    let (w0, g0) = (Tensor::from_fn(&[4, 32], |i| i as f32), Tensor::from_fn(&[4, 32], |i| (i % 5) as f32));
    let mut w_on = DeviceTensor::upload(&device, w0.view()).unwrap();
    let mut g_on = DeviceTensor::upload(&device, g0.view()).unwrap();
    let mut ws = plan.workspace().unwrap();
    let mut expected = w0.clone();
    for _ in 0..3 {
        let mut refs = [RunInputMut::from(&mut w_on), RunInputMut::from(&mut g_on)];
        let norms = plan.run_updating_on_device(&mut ws, &mut refs).unwrap().to_host(1).unwrap();
        expected = Tensor::from_fn(&[4, 32], |i| expected.to_f32_vec()[i] - 0.5 * g0.to_f32_vec()[i]);
        assert_eq!(w_on.to_host().unwrap(), expected);
        let rows: Vec<f32> = (0..4).map(|r| expected.to_f32_vec()[r * 32..(r + 1) * 32].iter().sum()).collect();
        assert_eq!(norms.to_f32_vec(), rows);
    }
    // The block holds the temporary (128 words); the output's 4 words are its own; w and g are
    // read and written where they are.
    assert_eq!(ws.device_bytes(), (128 + 4) * std::mem::size_of::<f32>(), "{plan}");
}

#[test]
fn values_of_any_length_share_one_block_on_a_device_that_allows_it() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8, 64]).unwrap();
    // Temporaries of several lengths, each dead soon after it is made.
    let e = b.exp(x).unwrap(); // [8, 64]
    let s = b.sum_dim(e, 1, true).unwrap(); // [8, 1]
    let n = b.div(e, s).unwrap(); // [8, 64]
    let m = b.max_dim(n, 1, false).unwrap(); // [8]
    let t = b.tanh(m).unwrap();
    let u = b.mul(t, t).unwrap();
    b.output(u).unwrap();
    let trace = b.finish().unwrap();
    let input = Tensor::from_fn(&[8, 64], |i| (i % 17) as f32 * 0.1 - 0.8);
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&input]).unwrap();
    let plan = Plan::compile(&trace, &[on_blocks()]).unwrap();
    let mut ws = plan.workspace().unwrap();
    for _ in 0..3 {
        let got = plan.run_with(&mut ws, &[input.view()]).unwrap().get(0).unwrap().to_tensor();
        assert_eq!(got, expected[0], "{plan}");
    }
    // The upload and the output keep their own; the temporaries live in one block, at most the
    // two largest live at once ([8, 64] twice, 512 words each), the small ones in their gaps.
    let word = std::mem::size_of::<f32>();
    assert_eq!(ws.device_bytes(), plan.device_bytes());
    assert_eq!(plan.device_bytes(), (512 + 8 + 2 * 512 + 64) * word, "{plan}");
}
