//! The transformer ops (batched products, slices, concatenation, reductions over any axis,
//! `argmax`, embeddings, gathers, `log_softmax`, `cross_entropy`, causal attention) on random
//! shapes, axes and broadcasts, run by a plan on the CPU reference (and through the standard
//! passes), equal a naive evaluation in `f64` written here, independently of the kernels.

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::passes::Pipeline;
use boundscope::{Arena, DType, Error, Executor, Plan, Registry, Tensor, TensorMeta, TraceBuilder};
use proptest::prelude::*;
use std::sync::Arc;

/// Relative tolerance against the `f64` evaluation: products and softmaxes in `f32`.
const TOLERANCE: f64 = 2e-5;

fn values(shape: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    (0..n).map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 250.0) - 2.0).collect()
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The multi-index of flat index `i` in `shape`.
fn index(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        out[a] = i % shape[a].max(1);
        i /= shape[a].max(1);
    }
    out
}

fn close(got: &[f32], expected: &[f64], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), expected.len(), "{}: length", what);
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let ok = (f64::from(g) - e).abs() <= TOLERANCE * e.abs().max(1.0) || (g.is_infinite() && g as f64 == e);
        prop_assert!(ok, "{}: element {}: got {}, expected {}", what, i, g, e);
    }
    Ok(())
}

fn executors() -> [Vec<Arc<dyn Executor>>; 2] {
    [vec![CpuReference::shared()], vec![Arc::new(CpuFusion::new()), CpuReference::shared()]]
}

/// Runs the trace `build` makes on every executor list, plain and through the standard
/// passes, and returns the first output of each run.
fn run_all(
    inputs: &[(DType, Vec<usize>)],
    data: &[Tensor],
    build: impl Fn(&mut TraceBuilder<'_>, &[boundscope::ValueId]) -> boundscope::Result<boundscope::ValueId>,
) -> Result<Vec<Tensor>, TestCaseError> {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let vs: Vec<_> = inputs.iter().map(|(d, s)| b.input_with(&TensorMeta::new(*d, s)).unwrap()).collect();
    let y = build(&mut b, &vs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let passed = Pipeline::standard().run(&trace, &arena).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let refs: Vec<&Tensor> = data.iter().collect();
    let mut outs = Vec::new();
    for executors in executors() {
        for t in [&trace, &passed] {
            let plan = Plan::compile(t, &executors).map_err(|e| TestCaseError::fail(e.to_string()))?;
            outs.push(plan.run(&refs).map_err(|e| TestCaseError::fail(e.to_string()))?.remove(0));
        }
    }
    Ok(outs)
}

/// A batched product's shapes: batch dimensions that broadcast, and m, k, n.
fn product_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (proptest::collection::vec((1usize..4, 0usize..3), 0..3), 1usize..6, 0usize..7, 1usize..6).prop_map(
        |(batch, m, k, n)| {
            // Each batch dimension: both d, or one side 1 (mode 1, 2), or absent on one side.
            let mut a: Vec<usize> = batch.iter().map(|&(d, mode)| if mode == 1 { 1 } else { d }).collect();
            let mut b: Vec<usize> = batch.iter().map(|&(d, mode)| if mode == 2 { 1 } else { d }).collect();
            if batch.len() == 2 && batch[0].1 == 0 {
                b.remove(0); // rank differs: broadcast from the left
            }
            a.extend([m, k]);
            b.extend([k, n]);
            (a, b)
        },
    )
}

fn naive_matmul(a: &[f32], ash: &[usize], b: &[f32], bsh: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let (m, k, n) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
    let rank = ash.len().max(bsh.len());
    let pad = |s: &[usize]| {
        let mut p = vec![1; rank - s.len()];
        p.extend_from_slice(s);
        p
    };
    let (pa, pb) = (pad(ash), pad(bsh));
    let batch: Vec<usize> = (0..rank - 2).map(|i| pa[i].max(pb[i])).collect();
    let (sa, sb) = (strides(&pa), strides(&pb));
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    let mut out = Vec::new();
    for flat in 0..batch.iter().product::<usize>() {
        let bi = index(flat, &batch);
        let off =
            |p: &[usize], s: &[usize]| (0..rank - 2).map(|i| if p[i] == 1 { 0 } else { bi[i] * s[i] }).sum::<usize>();
        let (oa, ob) = (off(&pa, &sa), off(&pb, &sb));
        for i in 0..m {
            for j in 0..n {
                out.push((0..k).map(|p| f64::from(a[oa + i * k + p]) * f64::from(b[ob + p * n + j])).sum());
            }
        }
    }
    (out_shape, out)
}

/// `values` of `shape` with the last two axes swapped: the new shape and values.
fn transposed_last_two(shape: &[usize], values: &[f32]) -> (Vec<usize>, Vec<f32>) {
    let r = shape.len();
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    let mut swapped = shape.to_vec();
    swapped.swap(r - 2, r - 1);
    // out[batch, i (cols), j (rows)] = x[batch, j, i]
    let out = (0..values.len())
        .map(|n| {
            let (batch, rest) = (n / (rows * cols), n % (rows * cols));
            let (i, j) = (rest / rows, rest % rows);
            values[batch * rows * cols + j * cols + i]
        })
        .collect();
    (swapped, out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn batched_products_broadcast_as_torch_matmul((ash, bsh) in product_shapes(), seed in 0u64..100) {
        let data = [Tensor::new(&ash, values(&ash, seed)).unwrap(), Tensor::new(&bsh, values(&bsh, seed + 1)).unwrap()];
        let (shape, expected) = naive_matmul(&data[0].to_f32_vec(), &ash, &data[1].to_f32_vec(), &bsh);
        let inputs = [(DType::F32, ash.clone()), (DType::F32, bsh.clone())];
        for out in run_all(&inputs, &data, |b, v| b.matmul(v[0], v[1]))? {
            prop_assert_eq!(out.shape(), shape.as_slice());
            close(&out.to_f32_vec(), &expected, "matmul")?;
        }
        // The same product with `b` given transposed ([..., n, k]), then with `a` ([..., k, m]).
        let (bt_shape, bt) = transposed_last_two(&bsh, &data[1].to_f32_vec());
        let data_t = [data[0].clone(), Tensor::new(&bt_shape, bt).unwrap()];
        let inputs_t = [(DType::F32, ash.clone()), (DType::F32, bt_shape.clone())];
        for out in run_all(&inputs_t, &data_t, |b, v| b.matmul_transposed(v[0], v[1]))? {
            prop_assert_eq!(out.shape(), shape.as_slice());
            close(&out.to_f32_vec(), &expected, "matmul_transposed")?;
        }
        let (at_shape, at) = transposed_last_two(&ash, &data[0].to_f32_vec());
        let data_a = [Tensor::new(&at_shape, at).unwrap(), data[1].clone()];
        let inputs_a = [(DType::F32, at_shape.clone()), (DType::F32, bsh.clone())];
        for out in run_all(&inputs_a, &data_a, |b, v| b.transposed_matmul(v[0], v[1]))? {
            prop_assert_eq!(out.shape(), shape.as_slice());
            close(&out.to_f32_vec(), &expected, "transposed_matmul")?;
        }
    }

    #[test]
    fn slices_and_concatenation_move_every_dtype_exactly(
        shape in proptest::collection::vec(1usize..5, 1..5),
        axis_pick in 0usize..8,
        cut in 0usize..8,
        dtype in proptest::sample::select(DType::ALL.to_vec()),
        seed in 0u64..100,
    ) {
        let axis = axis_pick % shape.len();
        let cut = cut % (shape[axis] + 1);
        let x = Tensor::new(&shape, values(&shape, seed)).unwrap().to_dtype(dtype);
        // split at `cut`, concatenate back: the input, exactly.
        let inputs = [(dtype, shape.clone())];
        let sizes = [cut, shape[axis] - cut];
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| {
            let parts = b.split(v[0], axis, &sizes)?;
            b.concat(&parts, axis)
        })? {
            prop_assert_eq!(&out, &x);
        }
        // One slice against its definition.
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| b.slice(v[0], axis, cut, shape[axis]))? {
            let mut want_shape = shape.clone();
            want_shape[axis] = shape[axis] - cut;
            let all = x.to_f32_vec();
            let st = strides(&shape);
            let want: Vec<f64> = (0..want_shape.iter().product::<usize>()).map(|i| {
                let mut at = index(i, &want_shape);
                at[axis] += cut;
                f64::from(all[at.iter().zip(&st).map(|(a, s)| a * s).sum::<usize>()])
            }).collect();
            prop_assert_eq!(out.dtype(), dtype);
            close(&out.to_f32_vec(), &want, "slice")?;
        }
    }

    #[test]
    fn reductions_over_any_axis_and_argmax(
        shape in proptest::collection::vec(1usize..5, 1..5),
        axis_pick in 0usize..8,
        keepdim in any::<bool>(),
        seed in 0u64..100,
    ) {
        let axis = axis_pick % shape.len();
        let x = Tensor::new(&shape, values(&shape, seed)).unwrap();
        let all = x.to_f32_vec();
        let st = strides(&shape);
        let mut kept = shape.clone();
        kept[axis] = 1;
        let along = |i: usize| -> Vec<f32> {
            let at = index(i, &kept);
            (0..shape[axis]).map(|p| {
                let mut at = at.clone();
                at[axis] = p;
                all[at.iter().zip(&st).map(|(a, s)| a * s).sum::<usize>()]
            }).collect()
        };
        let count = kept.iter().product::<usize>();
        let sums: Vec<f64> = (0..count).map(|i| along(i).iter().map(|&v| f64::from(v)).sum()).collect();
        let maxima: Vec<f64> = (0..count).map(|i| f64::from(along(i).into_iter().fold(f32::NEG_INFINITY, f32::max))).collect();
        let firsts: Vec<i64> = (0..count).map(|i| {
            let row = along(i);
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter().position(|&v| v == m).unwrap() as i64
        }).collect();
        let mut out_shape = kept.clone();
        if !keepdim {
            out_shape.remove(axis);
        }
        let inputs = [(DType::F32, shape.clone())];
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| b.sum_dim(v[0], axis, keepdim))? {
            prop_assert_eq!(out.shape(), out_shape.as_slice());
            close(&out.to_f32_vec(), &sums, "sum_dim")?;
        }
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| b.mean_dim(v[0], axis, keepdim))? {
            let means: Vec<f64> = sums.iter().map(|s| s / shape[axis] as f64).collect();
            close(&out.to_f32_vec(), &means, "mean_dim")?;
        }
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| b.max_dim(v[0], axis, keepdim))? {
            close(&out.to_f32_vec(), &maxima, "max_dim")?;
        }
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| b.argmax(v[0], axis, keepdim))? {
            prop_assert_eq!(out.values::<i64>().unwrap(), firsts.as_slice());
        }
    }

    #[test]
    fn embeddings_losses_and_causal_attention(
        rows in 1usize..6,
        classes in 1usize..9,
        heads in 1usize..3,
        tokens in 1usize..6,
        head in 1usize..5,
        seed in 0u64..100,
        id_dtype in proptest::sample::select(vec![DType::I64, DType::I32]),
    ) {
        // embedding, then cross_entropy of the looked-up rows against ids.
        let weight = Tensor::new(&[classes, classes], values(&[classes, classes], seed)).unwrap();
        let ids: Vec<i64> = (0..rows).map(|r| ((r as u64 * 7 + seed) % classes as u64) as i64).collect();
        let ids_t = Tensor::from_vec(&[rows], ids.clone()).unwrap().to_dtype(id_dtype);
        let w = weight.to_f32_vec();
        let inputs = [(DType::F32, vec![classes, classes]), (id_dtype, vec![rows])];
        let data = [weight.clone(), ids_t.clone()];
        let mut loss = 0.0;
        for &id in &ids {
            let row: Vec<f64> = w[id as usize * classes..][..classes].iter().map(|&v| f64::from(v)).collect();
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
            loss += lse - row[id as usize];
        }
        for out in run_all(&inputs, &data, |b, v| {
            let x = b.embedding(v[0], v[1])?;
            b.cross_entropy(x, v[1])
        })? {
            prop_assert_eq!(out.shape(), &[] as &[usize]);
            close(&out.to_f32_vec(), &[loss / rows as f64], "cross_entropy")?;
        }
        for out in run_all(&inputs, &data, |b, v| b.embedding(v[0], v[1]))? {
            let want: Vec<f64> = ids.iter().flat_map(|&i| w[i as usize * classes..][..classes].to_vec()).map(f64::from).collect();
            close(&out.to_f32_vec(), &want, "embedding")?;
        }
        // Causal attention, [heads, tokens, head].
        let shape = vec![heads, tokens, head];
        let qkv: Vec<Tensor> = (0..3).map(|i| Tensor::new(&shape, values(&shape, seed + i)).unwrap()).collect();
        let (q, k, v) = (qkv[0].to_f32_vec(), qkv[1].to_f32_vec(), qkv[2].to_f32_vec());
        let scale = 1.0 / (head as f64).sqrt();
        let mut want = Vec::new();
        for h in 0..heads {
            for i in 0..tokens {
                let at = |t: &[f32], r: usize, c: usize| f64::from(t[(h * tokens + r) * head + c]);
                let s: Vec<f64> = (0..=i).map(|j| (0..head).map(|c| at(&q, i, c) * at(&k, j, c)).sum::<f64>() * scale).collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for c in 0..head {
                    want.push((0..=i).map(|j| (s[j] - m).exp() / z * at(&v, j, c)).sum::<f64>());
                }
            }
        }
        let inputs = [(DType::F32, shape.clone()), (DType::F32, shape.clone()), (DType::F32, shape.clone())];
        for out in run_all(&inputs, &qkv, |b, v| b.scaled_dot_product_attention(v[0], v[1], v[2], true, None))? {
            close(&out.to_f32_vec(), &want, "causal attention")?;
        }
    }
}

/// The value of `t` (of `shape`, broadcast to `out`) at output index `i`.
fn broadcast_at(t: &[f32], shape: &[usize], out: &[usize], i: usize) -> f32 {
    let at = index(i, out);
    let offset = out.len() - shape.len();
    let st = strides(shape);
    t[(0..shape.len()).map(|a| if shape[a] == 1 { 0 } else { at[a + offset] * st[a] }).sum::<usize>()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn comparisons_and_where_broadcast(
        shape in proptest::collection::vec(1usize..4, 1..4),
        ones in proptest::collection::vec(any::<bool>(), 4),
        drop in 0usize..2,
        dtype in proptest::sample::select(vec![DType::F32, DType::BF16, DType::I64, DType::I32]),
        seed in 0u64..50,
    ) {
        let mut other: Vec<usize> = shape.iter().zip(&ones).map(|(&d, &one)| if one { 1 } else { d }).collect();
        other.drain(..drop.min(other.len() - 1));
        let a = Tensor::new(&shape, values(&shape, seed).iter().map(|v| (v * 2.0).round()).collect()).unwrap().to_dtype(dtype);
        let b = Tensor::new(&other, values(&other, seed + 3).iter().map(|v| (v * 2.0).round()).collect()).unwrap().to_dtype(dtype);
        let (av, bv) = (a.to_f32_vec(), b.to_f32_vec());
        let numel: usize = shape.iter().product();
        let inputs = [(dtype, shape.clone()), (dtype, other.clone())];
        let data = [a, b];
        for (k, want) in [
            (0, (|x: f32, y: f32| x < y) as fn(f32, f32) -> bool),
            (1, |x, y| x <= y),
            (2, |x, y| x > y),
            (3, |x, y| x >= y),
            (4, |x, y| x == y),
            (5, |x, y| x != y),
        ] {
            let expected: Vec<i32> = (0..numel)
                .map(|i| i32::from(want(av[i], broadcast_at(&bv, &other, &shape, i))))
                .collect();
            for out in run_all(&inputs, &data, |b, v| match k {
                0 => b.lt(v[0], v[1]),
                1 => b.le(v[0], v[1]),
                2 => b.gt(v[0], v[1]),
                3 => b.ge(v[0], v[1]),
                4 => b.eq(v[0], v[1]),
                _ => b.ne(v[0], v[1]),
            })? {
                prop_assert_eq!(out.values::<i32>().unwrap(), expected.as_slice(), "comparison {}", k);
            }
        }
        // where(a > b, a, b) is maximum; masked with a scalar, the fill.
        let wanted: Vec<f64> = (0..numel).map(|i| f64::from(av[i].max(broadcast_at(&bv, &other, &shape, i)))).collect();
        for out in run_all(&inputs, &data, |b, v| {
            let m = b.gt(v[0], v[1])?;
            b.where_(m, v[0], v[1])
        })? {
            prop_assert_eq!(out.dtype(), dtype);
            close(&out.to_f32_vec(), &wanted, "where")?;
        }
        let filled: Vec<f64> = (0..numel).map(|i| if av[i] > 0.0 { f64::from(av[i]) } else { -7.0 }).collect();
        for out in run_all(&inputs[..1], &data[..1], |b, v| {
            let m = b.compare_scalar(boundscope::prims::GT, v[0], 0.0)?;
            b.where_scalar(m, v[0], -7.0)
        })? {
            close(&out.to_f32_vec(), &filled, "where_scalar")?;
        }
    }
}

#[test]
fn out_of_range_ids_and_bad_shapes_are_typed_errors() {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let w = b.input(&[4, 2]).unwrap();
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[3])).unwrap();
    let y = b.embedding(w, ids).unwrap();
    b.output(y).unwrap();
    // Bad shapes, axes and dtypes, at build time.
    let f = b.input(&[3]).unwrap();
    assert!(matches!(b.embedding(w, f), Err(Error::ShapeMismatch { .. })), "float ids");
    assert!(b.slice(w, 2, 0, 1).is_err() && b.slice(w, 0, 3, 5).is_err() && b.slice(w, 0, 2, 1).is_err());
    assert!(b.sum_dim(w, 2, false).is_err() && b.argmax(ids, 0, false).is_err());
    assert!(b.concat(&[w, ids], 0).is_err() && b.concat(&[], 0).is_err() && b.split(w, 0, &[1, 1]).is_err());
    let m = b.input(&[2, 3]).unwrap();
    assert!(b.matmul(w, m).is_ok() && b.matmul(m, w).is_err() && b.matmul(f, m).is_err(), "inner 3 vs 4, rank 1");
    assert!(b.cross_entropy(w, f).is_err() && b.cross_entropy(w, ids).is_err(), "float targets, 3 rows vs 4");
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let weight = Tensor::zeros(&[4, 2]);
    for (bad, position) in [(vec![0i64, 4, 1], 1), (vec![-1i64, 0, 0], 0)] {
        let ids = Tensor::from_vec(&[3], bad.clone()).unwrap();
        let f = Tensor::zeros(&[3]);
        let m = Tensor::zeros(&[2, 3]);
        let err = plan.run(&[&weight, &ids, &f, &m]).unwrap_err();
        match &err {
            Error::IndexOutOfRange { index, position: p, bound: 4, .. } => {
                assert_eq!((*index, *p), (bad[position], position), "{err}");
                // A negative id (PyTorch's `ignore_index` is -100) is said not to be skipped.
                assert_eq!(err.to_string().contains("ignore_index"), *index < 0, "{err}");
            }
            other => panic!("{other}"),
        }
    }
}

/// `cross_entropy` of 16-bit logits is `f32` (as under `torch.autocast`) and equals, bit for
/// bit, `cross_entropy` of the logits cast to `f32` first, on every executor list, plain and
/// through the standard passes: no cast of the logits is needed.
#[test]
fn cross_entropy_of_16_bit_logits_is_the_f32_loss_without_a_cast() {
    for dtype in [DType::BF16, DType::F16] {
        let (rows, classes) = (37, 50);
        let logits = Tensor::from_fn(&[rows, classes], |i| ((i * 7919 % 1000) as f32 / 100.0) - 5.0).to_dtype(dtype);
        let targets = Tensor::from_vec(&[rows], (0..rows as i64).map(|i| (i * 11) % 50).collect()).unwrap();
        let inputs = [(dtype, vec![rows, classes]), (DType::I64, vec![rows])];
        let data = [logits, targets];
        let direct = run_all(&inputs, &data, |b, v| b.cross_entropy(v[0], v[1])).unwrap();
        let cast_first = run_all(&inputs, &data, |b, v| {
            let wide = b.cast(v[0], DType::F32)?;
            b.cross_entropy(wide, v[1])
        })
        .unwrap();
        for (d, c) in direct.iter().zip(&cast_first) {
            assert_eq!(d.dtype(), DType::F32, "{dtype}");
            assert_eq!(d, c, "{dtype}: the loss of the logits as they are and cast to f32 first");
        }
    }
}

/// Sums over or beside an empty axis are empty or 0; maxima beside one are empty, and over one
/// an error (see `max_dim`).
#[test]
fn reductions_next_to_empty_axes_give_empty_or_neutral_results() {
    for (shape, axis, want_shape, want) in [
        (vec![3, 0], 0, vec![1, 0], vec![]),
        (vec![0, 4], 0, vec![1, 4], vec![0.0; 4]),
        (vec![2, 0, 3], 2, vec![2, 0, 1], vec![]),
    ] {
        let x = Tensor::zeros(&shape);
        let inputs = [(DType::F32, shape.clone())];
        for out in run_all(&inputs, std::slice::from_ref(&x), |b, v| b.sum_dim(v[0], axis, true)).unwrap() {
            assert_eq!((out.shape(), out.to_f32_vec()), (want_shape.as_slice(), want.clone()), "{shape:?} over {axis}");
        }
        // The maximum over an empty axis is an error, as `torch.amax`'s; beside one, empty.
        let maxima = run_all(&inputs, std::slice::from_ref(&x), |b, v| b.max_dim(v[0], axis, true));
        if shape[axis] == 0 {
            assert!(maxima.is_err(), "{shape:?} over {axis}");
            continue;
        }
        for out in maxima.unwrap() {
            assert_eq!(out.shape(), want_shape.as_slice());
        }
    }
}

/// `concat` of 1 to 17 bf16 parts of different lengths equals the parts one after
/// another, and copies each value at most `ceil(log2(parts))` times: a balanced tree of joins
/// (a chain of joins onto one growing value copied the first part once per part).
#[test]
fn concatenating_many_parts_copies_each_value_a_logarithmic_number_of_times() {
    for k in 1..=17usize {
        let lengths: Vec<usize> = (0..k).map(|i| 1 + i % 3).collect();
        let inputs: Vec<(DType, Vec<usize>)> = lengths.iter().map(|&l| (DType::BF16, vec![l, 2])).collect();
        let data: Vec<Tensor> = lengths
            .iter()
            .enumerate()
            .map(|(i, &l)| Tensor::new(&[l, 2], (0..2 * l).map(|e| (100 * i + e) as f32).collect()).unwrap())
            .map(|t| t.to_dtype(DType::BF16))
            .collect();
        let expected: Vec<f32> = data.iter().flat_map(|t| t.to_f32_vec()).collect();
        let total: usize = expected.len();
        for out in run_all(&inputs, &data, |b, v| b.concat(v, 0)).unwrap() {
            assert_eq!((out.shape(), out.dtype()), ([total / 2, 2].as_slice(), DType::BF16), "{k} parts");
            assert_eq!(out.to_f32_vec(), expected, "{k} parts");
        }
        // Values written by the joins, against what each level of a balanced tree writes.
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let vs: Vec<_> = inputs.iter().map(|(d, s)| b.input_with(&TensorMeta::new(*d, s)).unwrap()).collect();
        let joined = b.concat(&vs, 0).unwrap();
        b.output(joined).unwrap();
        let trace = b.finish().unwrap();
        let joins: Vec<_> = trace.bound_symbols().iter().filter(|s| trace.symbol_name(s) == "concat").collect();
        assert_eq!(joins.len(), k - 1, "one join per part after the first");
        let written: usize = joins.iter().map(|s| trace.value_meta(s.outputs()[0]).unwrap().numel()).sum();
        let levels = k.next_power_of_two().trailing_zeros() as usize;
        assert!(written <= levels * total, "{k} parts: {written} values written, more than {levels} x {total}");
    }
}

/// An id out of range in a step that runs a composite's decomposition names the composite the
/// ids were given to, as an executor that runs the composite whole does (CudaOps' own
/// `cross_entropy`): `cross_entropy`'s target on the CPU reference, where its decomposition's
/// `gather_last` reads it; a user's composite around `gather_last`; and, where composites nest
/// (a user's loss around `cross_entropy`), the innermost. A `gather_last` applied directly
/// names itself, and good ids run.
#[test]
fn an_id_out_of_range_names_the_composite_it_was_given_to() {
    use boundscope::{ArgInfo, Category, ParamKind, Symbol};
    let (rows, classes) = (4, 5);
    let mut registry = Registry::with_builtins();
    let pick = Symbol::new("pick", Category::Composite)
        .params(&[ParamKind::Tensor, ParamKind::Tensor])
        .shape_rule(|args| match args {
            [ArgInfo::Tensor { dtype, .. }, ArgInfo::Tensor { shape, .. }] => Ok(TensorMeta::new(*dtype, shape)),
            _ => Err("two tensors".into()),
        })
        .decomposition(|b, args| {
            let (x, ids) = two_tensors(args);
            b.gather_last(x, ids)
        });
    let loss = Symbol::new("my_loss", Category::Composite)
        .params(&[ParamKind::Tensor, ParamKind::Tensor])
        .shape_rule(|_| Ok(TensorMeta::new(DType::F32, &[])))
        .decomposition(|b, args| {
            let (x, targets) = two_tensors(args);
            b.cross_entropy(x, targets)
        });
    registry.register(pick).unwrap();
    registry.register(loss).unwrap();
    let logits = Tensor::from_fn(&[rows, classes], |i| (i % 7) as f32 * 0.25);
    let good = Tensor::from_vec(&[rows], vec![0i64, 4, 2, 1]).unwrap();
    let bad = Tensor::from_vec(&[rows], vec![0i64, 4, 5, 1]).unwrap();
    for (op, named) in [
        ("cross_entropy", "cross_entropy"),
        ("gather_last", "gather_last"),
        ("pick", "pick"),
        ("my_loss", "cross_entropy"),
    ] {
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[rows, classes]).unwrap();
        let t = b.input_with(&TensorMeta::new(DType::I64, &[rows])).unwrap();
        let y = b.call(op, &[x.into(), t.into()]).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        plan.run(&[&logits, &good]).unwrap_or_else(|e| panic!("{op}: {e}"));
        match plan.run(&[&logits, &bad]) {
            Err(Error::IndexOutOfRange { symbol, index: 5, position: 2, bound: 5 }) => {
                assert_eq!(symbol, named, "{op}")
            }
            other => panic!("{op}: {other:?}"),
        }
        let err = plan.run(&[&logits, &bad]).unwrap_err().to_string();
        assert!(err.starts_with(&format!("`{named}` was given id 5 at position 2")), "{op}: {err}");
    }
    // A composite an executor runs whole keeps the name its kernel gives, inside a user's
    // composite that is decomposed.
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[rows, classes]).unwrap();
    let t = b.input_with(&TensorMeta::new(DType::I64, &[rows])).unwrap();
    let y = b.call("my_loss", &[x.into(), t.into()]).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[Arc::new(WholeCrossEntropy), CpuReference::shared()]).unwrap();
    assert!(plan.steps_per_executor().contains(&("whole_cross_entropy", 1)), "{plan}");
    plan.run(&[&logits, &good]).unwrap();
    match plan.run(&[&logits, &bad]) {
        Err(Error::IndexOutOfRange { symbol, index: 5, .. }) => assert_eq!(symbol, "cross_entropy"),
        other => panic!("{other:?}"),
    }
}

/// Runs `cross_entropy` whole, checking its targets as an executor of the GPU does (the loss
/// itself is not computed: 0).
struct WholeCrossEntropy;

impl Executor for WholeCrossEntropy {
    fn name(&self) -> &str {
        "whole_cross_entropy"
    }
    fn claims(&self, op: &boundscope::OpView<'_>) -> bool {
        op.symbol().builtin_composite() == Some(boundscope::prims::CROSS_ENTROPY)
    }
    fn dtypes(&self) -> &[DType] {
        &[DType::F32, DType::I64]
    }
    fn compile(&self, op: &boundscope::OpView<'_>) -> boundscope::Result<Box<dyn boundscope::Kernel>> {
        let classes = op.input_shape(0)?[1];
        Ok(boundscope::kernel_fn(move |inputs, outputs| {
            for (position, &index) in inputs[1].values::<i64>()?.iter().enumerate() {
                if index < 0 || index as usize >= classes {
                    let symbol = "cross_entropy".into();
                    return Err(Error::IndexOutOfRange { symbol, index, position, bound: classes });
                }
            }
            outputs[0].values_mut::<f32>()?.fill(0.0);
            Ok(())
        }))
    }
}

/// The two tensors of a composite whose parameters are two tensors.
fn two_tensors(args: &[boundscope::Arg<'_>]) -> (boundscope::ValueId, boundscope::ValueId) {
    match args {
        [boundscope::Arg::Value(x), boundscope::Arg::Value(y)] => (*x, *y),
        _ => unreachable!("the parameters are two tensors"),
    }
}
