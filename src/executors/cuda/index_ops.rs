//! CUDA C for the transformer ops that pick values by position or reduce over any axis:
//! `slice`, `concat` and `pad` (moves, in every dtype, as bits), the `causal_mask`, `sum_axis` and
//! `max_axis` over any axis (`sum_dim` and `max_dim` bind the last axis to the `sum` and `max`
//! prims, which fuse), and `argmax` (`i64` results). One thread per output element, in a grid-stride loop;
//! a reduction's thread walks its axis, so neighbouring threads read neighbouring elements. A
//! move whose contiguous runs are whole 16-byte vectors copies a vector per thread.

use std::fmt::Write;

use super::codegen::{element_type, literal, narrow, widen, RegionSource, HALF_CONVERSIONS};
use crate::core::ir::prims;
use crate::core::plan::packing;
use crate::core::plan::OpView;
use crate::executors::cpu_reference::{builtin_prim, check_builtin};

/// Whether [`index_op_source`] generates `op`.
pub(crate) fn generates(op: &OpView<'_>) -> bool {
    match builtin_prim(op) {
        Some(
            prims::SLICE
            | prims::CONCAT
            | prims::PAD
            | prims::CAUSAL_MASK
            | prims::SUM_AXIS
            | prims::MAX_AXIS
            | prims::ARGMAX,
        ) => true,
        Some(id) if prims::COMPARISONS.contains(&id) => true,
        // `where` with tensors of the result's dtype (their bits are copied).
        Some(prims::WHERE) => {
            let out = op.output_dtypes().next();
            op.bound_symbol().inputs().skip(1).all(|v| Some(op.dtype_of(v)) == out)
        }
        _ => false,
    }
}

/// Element `i` of the output shape read from tensor argument `k` (of `input_shape`), broadcast.
fn broadcast_read(k: usize, shape: &[usize], input_shape: &[usize]) -> String {
    let strides = crate::executors::cpu_reference::kernels::broadcast_strides(input_shape, shape);
    format!("in{k}[{}]", super::codegen::strided_offset(shape, &strides))
}

/// `read` (an element of `dtype`) as a C value to compare: `long long` for integers, `float`
/// for floats (16-bit ones widened).
fn comparable(dtype: crate::DType, read: &str, as_float: bool) -> String {
    match (dtype.is_integer(), as_float) {
        (true, false) => format!("(long long){read}"),
        (true, true) => format!("(float){read}"),
        _ => widen(dtype, read),
    }
}

/// Generates the CUDA C of one of the ops [`generates`] accepts.
///
/// # Errors
/// A message when `op` is not one of them, or does not fit its built-in's shape rule (every
/// index the kernel computes stays inside the buffers of the shapes that rule relates).
pub fn index_op_source(op: &OpView<'_>, kernel: &str) -> Result<RegionSource, String> {
    let id = builtin_prim(op).ok_or(format!("`{}` is not a built-in prim", op.name()))?;
    check_builtin(id, op)?;
    let shape = |i: usize| op.input_shape(i).map_err(|e| e.to_string());
    let out_shape = op.output_shape(0).map_err(|e| e.to_string())?;
    let numel: usize = out_shape.iter().product();
    let in_dtype = op.dtype_of(op.bound_symbol().inputs().next().ok_or("an op without inputs")?);
    let out_dtype = op.dtype_of(op.bound_symbol().outputs()[0]);
    let axis_of = |i: usize| op.dims(i).map_err(|e| e.to_string()).map(|d| d.first().copied().unwrap_or(0));
    let (element, out_element) = (element_type(in_dtype), element_type(out_dtype));
    // Elements per thread: moves copy 16-byte vectors where every run they copy allows it.
    let mut vector = 1;
    // Each input's C element type, when not all are the first input's.
    let mut input_types: Vec<&'static str> = Vec::new();
    // The loop body, writing `out0[i]`; the inputs' element counts.
    let (body, inputs): (String, Vec<usize>) = match id {
        _ if prims::COMPARISONS.contains(&id) => {
            let a = shape(0)?;
            let tensors: Vec<_> = op.bound_symbol().inputs().collect();
            let dtypes: Vec<_> = tensors.iter().map(|&v| op.dtype_of(v)).collect();
            let as_float = dtypes.iter().any(|d| d.is_float()) || tensors.len() == 1;
            let left = comparable(dtypes[0], &broadcast_read(0, out_shape, a), as_float);
            let (right, lengths) = if tensors.len() == 2 {
                let b = shape(1)?;
                (
                    comparable(dtypes[1], &broadcast_read(1, out_shape, b), as_float),
                    vec![a.iter().product(), b.iter().product()],
                )
            } else {
                (literal(op.scalar(1).map_err(|e| e.to_string())?), vec![a.iter().product()])
            };
            input_types = dtypes.iter().map(|&d| element_type(d)).collect();
            let c = match id {
                prims::LT => "<",
                prims::LE => "<=",
                prims::GT => ">",
                prims::GE => ">=",
                prims::EQ => "==",
                _ => "!=",
            };
            (format!("out0[i] = ({left} {c} {right}) ? 1 : 0;"), lengths)
        }
        prims::WHERE => {
            let tensors: Vec<_> = op.bound_symbol().inputs().collect();
            let shapes: Vec<&[usize]> = (0..tensors.len()).map(shape).collect::<Result<_, _>>()?;
            input_types = tensors.iter().map(|&v| element_type(op.dtype_of(v))).collect();
            let otherwise = if tensors.len() == 3 {
                broadcast_read(2, out_shape, shapes[2])
            } else {
                let fill = op.scalar(2).map_err(|e| e.to_string())?;
                if out_dtype == crate::DType::I32 {
                    // Saturated, as the CPU's conversion (`Element::from_f32`) does.
                    format!("({out_element}){}", fill as i32)
                } else if out_dtype.is_integer() {
                    format!("({out_element}){}ll", fill as i64)
                } else {
                    format!("({out_element}){}", narrow(out_dtype, &literal(fill)))
                }
            };
            (
                format!(
                    "out0[i] = {cond} != 0 ? {a} : {otherwise};",
                    cond = broadcast_read(0, out_shape, shapes[0]),
                    a = broadcast_read(1, out_shape, shapes[1]),
                ),
                shapes.iter().map(|s| s.iter().product()).collect(),
            )
        }
        prims::SLICE => {
            // Rows of `len` contiguous elements, one per index of the axes before `axis`, each
            // `from` elements into an input row of `row`.
            let input = shape(0)?;
            let dims = op.dims(1).map_err(|e| e.to_string())?;
            let (axis, start, end) = (dims[0], dims[1], dims[2]);
            let inner: usize = input[axis + 1..].iter().product();
            let (len, row, from) = ((end - start) * inner, input[axis] * inner, start * inner);
            let v = vector_width(in_dtype, &[len, row, from]);
            vector = v;
            let (len, row, from) = ((len / v).max(1), row / v, from / v);
            (
                format!(
                    "const long long o = i / {len}ll;\n    out0[i] = in0[o * {row}ll + {from}ll + (i - o * {len}ll)];"
                ),
                vec![input.iter().product()],
            )
        }
        prims::PAD => {
            // Rows of `before + block + after` elements, one per index of the axes before
            // `axis`: the fill, a block of the input, the fill.
            let input = shape(0)?;
            let dims = op.dims(1).map_err(|e| e.to_string())?;
            let (axis, before, after) = (dims[0], dims[1], dims[2]);
            let inner: usize = input[axis + 1..].iter().product();
            let (block, before, after) = (input[axis] * inner, before * inner, after * inner);
            let fill = op.scalar(2).map_err(|e| e.to_string())?;
            // Vectors only where the fill is zero bits (a vector of zeros).
            let v = if fill == 0.0 && fill.is_sign_positive() {
                vector_width(in_dtype, &[block, before, after])
            } else {
                1
            };
            vector = v;
            let (block, before, after) = (block / v, before / v, after / v);
            let row = (before + block + after).max(1);
            let fill = if v > 1 {
                "make_uint4(0u, 0u, 0u, 0u)".to_string()
            } else if out_dtype == crate::DType::I32 {
                format!("({out_element}){}", fill as i32)
            } else if out_dtype.is_integer() {
                format!("({out_element}){}ll", fill as i64)
            } else {
                format!("({out_element})({})", narrow(out_dtype, &literal(fill)))
            };
            (
                format!(
                    "const long long o = i / {row}ll, r = i - o * {row}ll - {before}ll;\n    \
                     out0[i] = (r >= 0 && r < {block}ll) ? in0[o * {block}ll + r] : {fill};"
                ),
                vec![input.iter().product()],
            )
        }
        prims::CONCAT => {
            let (a, b) = (shape(0)?, shape(1)?);
            let axis = axis_of(2)?;
            let (a_block, b_block): (usize, usize) = (a[axis..].iter().product(), b[axis..].iter().product());
            let v = vector_width(in_dtype, &[a_block, b_block]);
            vector = v;
            let (a_block, b_block) = (a_block / v, b_block / v);
            let block = (a_block + b_block).max(1);
            // Vectors stream through (read and written once: evict first, as the fused
            // regions' `float4` streams), each read from the one input it comes from.
            let mv = if v > 1 { ("__stcs(out0 + i, __ldcs(", "));") } else { ("out0[i] = *(", ");") };
            (
                format!(
                    "const long long o = i / {block}ll, r = i - o * {block}ll;\n    \
                     {}r < {a_block}ll ? in0 + (o * {a_block}ll + r) : in1 + (o * {b_block}ll + (r - {a_block}ll)){}",
                    mv.0, mv.1
                ),
                vec![a.iter().product(), b.iter().product()],
            )
        }
        prims::CAUSAL_MASK => {
            let input = shape(0)?;
            let (rows, cols) = (input[input.len() - 2].max(1), input[input.len() - 1].max(1));
            let masked = narrow(out_dtype, &literal(f32::NEG_INFINITY));
            // 16-byte vectors where rows are whole vectors (of a float dtype): the lanes past
            // the diagonal get -inf's bits.
            let size = out_dtype.size_bytes();
            let v = if out_dtype.is_float() { vector_width(out_dtype, &[cols]) } else { 1 };
            vector = v;
            let body = if v > 1 {
                let bits = match out_dtype {
                    crate::DType::BF16 => 0xff80u32,
                    crate::DType::F16 => 0xfc00,
                    _ => 0xff80_0000,
                };
                let set_lane = if size == 2 {
                    format!("w[k / 2] = (w[k / 2] & ~(0xffffu << (16 * (k & 1)))) | ({bits:#x}u << (16 * (k & 1)));")
                } else {
                    format!("w[k] = {bits:#x}u;")
                };
                format!(
                    "const long long e = i * {v}ll, c = e % {cols}ll, r = (e / {cols}ll) % {rows}ll;\n    \
                     uint4 x = in0[i];\n    \
                     if (c + {last}ll > r) {{\n      \
                     unsigned int w[4] = {{x.x, x.y, x.z, x.w}};\n      \
                     #pragma unroll\n      \
                     for (int k = 0; k < {v}; ++k) if (c + k > r) {{ {set_lane} }}\n      \
                     x = make_uint4(w[0], w[1], w[2], w[3]);\n    \
                     }}\n    \
                     out0[i] = x;",
                    last = v - 1,
                )
            } else {
                format!(
                    "const long long c = i % {cols}ll, r = (i / {cols}ll) % {rows}ll;\n    \
                     out0[i] = c <= r ? in0[i] : ({out_element})({masked});"
                )
            };
            (body, vec![input.iter().product()])
        }
        prims::SUM_AXIS | prims::MAX_AXIS | prims::ARGMAX => {
            let input = shape(0)?;
            let axis = axis_of(1)?;
            let (n, inner): (usize, usize) = (input[axis], input[axis + 1..].iter().product::<usize>().max(1));
            let at = |p: &str| widen(in_dtype, &format!("in0[(o * {n}ll + {p}) * {inner}ll + q]"));
            let head = format!("const long long o = i / {inner}ll, q = i % {inner}ll;\n    ");
            let body = match id {
                prims::ARGMAX => format!(
                    "{head}long long best = 0; float value = {first};\n    \
                     for (long long p = 1; p < {n}ll; ++p) {{ const float v = {v}; \
                     if (value == value && (v > value || v != v)) {{ best = p; value = v; }} }}\n    \
                     out0[i] = best;",
                    first = at("0"),
                    v = at("p"),
                ),
                _ if n == 0 => {
                    let empty = if id == prims::SUM_AXIS { 0.0 } else { f32::NEG_INFINITY };
                    format!("out0[i] = {};", narrow(out_dtype, &literal(empty)))
                }
                _ => {
                    let step =
                        if id == prims::SUM_AXIS { "acc += v;" } else { "acc = (acc > v || acc != acc) ? acc : v;" };
                    format!(
                        "{head}float acc = {first};\n    \
                         for (long long p = 1; p < {n}ll; ++p) {{ const float v = {v}; {step} }}\n    \
                         out0[i] = {result};",
                        first = at("0"),
                        v = at("p"),
                        result = narrow(out_dtype, "acc"),
                    )
                }
            };
            (body, vec![input.iter().product()])
        }
        _ => return Err(format!("`{}` is not generated here", op.name())),
    };
    let mut source = String::new();
    let _ = writeln!(source, "// Generated by boundscope for `{}`.", op.name());
    if op.dtypes().iter().any(|&d| packing::is_packed(d)) {
        source.push_str(HALF_CONVERSIONS);
    }
    // A vectorized move reads and writes `uint4`s (16 bytes: 4 f32, 8 bf16, 2 i64).
    let (element, out_element) = if vector > 1 { ("uint4", "uint4") } else { (element, out_element) };
    let parameters: Vec<String> = (0..inputs.len())
        .map(|k| format!("const {}* __restrict__ in{k}", input_types.get(k).copied().unwrap_or(element)))
        .collect();
    let _ = writeln!(
        source,
        "extern \"C\" __global__ void {kernel}({}, {out_element}* __restrict__ out0, long long n) {{",
        parameters.join(", ")
    );
    let _ = writeln!(source, "  const long long stride = (long long)blockDim.x * gridDim.x;");
    let _ = writeln!(
        source,
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{"
    );
    let _ = writeln!(source, "    {body}");
    let _ = writeln!(source, "  }}\n}}");
    Ok(RegionSource {
        kernel: kernel.to_string(),
        source,
        inputs: inputs.len(),
        outputs: 1,
        numel: numel / vector,
        vectorized: vector > 1,
        threads: numel / vector,
        input_lengths: op
            .bound_symbol()
            .inputs()
            .zip(&inputs)
            .map(|(v, &n)| packing::words(if input_types.is_empty() { in_dtype } else { op.dtype_of(v) }, n))
            .collect(),
        output_lengths: vec![packing::words(out_dtype, numel)],
        in_place: Vec::new(),
        cluster: 1,
    })
}

/// Elements of `dtype` per 16-byte vector, if every count in `runs` (lengths and offsets of
/// the contiguous runs a move copies, in elements) is a multiple of it and one is non-zero; else
/// 1. Device buffers start 256-byte aligned, so such runs are 16-byte aligned too.
fn vector_width(dtype: crate::DType, runs: &[usize]) -> usize {
    let v = 16 / dtype.size_bytes();
    if runs.iter().all(|r| r % v == 0) && runs.iter().any(|&r| r > 0) {
        v
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::core::plan::OpView;
    use crate::TensorMeta;

    /// The source of the one op `build` binds.
    fn source(build: impl FnOnce(&mut TraceBuilder<'_>)) -> RegionSource {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        build(&mut b);
        let trace = b.finish().unwrap();
        let op = OpView::of(&trace, trace.bound_symbols().len() - 1).unwrap();
        index_op_source(&op, "k").unwrap()
    }

    #[test]
    fn moves_copy_16_byte_vectors_where_their_runs_allow() {
        let s = source(|b| {
            let x = b.input_with(&TensorMeta::new(crate::DType::F32, &[2, 3, 12])).unwrap();
            let y = b.slice(x, 2, 4, 8).unwrap();
            b.output(y).unwrap();
        });
        assert!(s.vectorized && s.numel == 2 * 3 && s.source.contains("uint4"), "{}", s.source);
        assert!(s.source.contains("in0[o * 3ll + 1ll + (i - o * 1ll)]"), "{}", s.source);
        assert_eq!((s.input_lengths.clone(), s.output_lengths.clone()), (vec![72], vec![24]));
        // Runs of 3 f32 are not whole vectors: one element per thread.
        let s = source(|b| {
            let x = b.input_with(&TensorMeta::new(crate::DType::F32, &[2, 6])).unwrap();
            let y = b.slice(x, 1, 1, 4).unwrap();
            b.output(y).unwrap();
        });
        assert!(!s.vectorized && s.numel == 6 && !s.source.contains("uint4"), "{}", s.source);
        let s = source(|b| {
            let x = b.input_with(&TensorMeta::new(crate::DType::BF16, &[2, 8])).unwrap();
            let y = b.input_with(&TensorMeta::new(crate::DType::BF16, &[2, 16])).unwrap();
            let z = b.concat(&[x, y], 1).unwrap();
            b.output(z).unwrap();
        });
        assert!(s.vectorized && s.numel == 2 * 3, "{}", s.source);
        // Streamed: read and written once.
        assert!(s.source.contains("__stcs(out0 + i, __ldcs(r < 1ll ? in0 + (o * 1ll + r)"), "{}", s.source);
        crate::executors::cuda::compiles_with_nvrtc(&s.source);
    }
}
