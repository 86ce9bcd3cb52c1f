use super::*;
use half::{bf16, f16};

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("boundscope-checkpoint-{}-{name}.safetensors", std::process::id()))
}

fn detail_of(e: Error) -> (Option<String>, String) {
    match e {
        Error::Checkpoint { tensor, detail, .. } => (tensor, detail),
        other => panic!("expected Error::Checkpoint, got {other:?}"),
    }
}

#[test]
fn every_dtype_round_trips_and_is_borrowed_from_the_map() {
    let path = temp("round-trip");
    let a = Tensor::new(&[2, 2], vec![1.5, -2.0, 3.25, 0.0]).unwrap();
    let b = Tensor::from_vec(&[3], vec![bf16::from_f32(1.0), bf16::from_f32(-0.5), bf16::from_f32(7.0)]).unwrap();
    let c = Tensor::from_vec(&[1], vec![f16::from_f32(0.25)]).unwrap();
    let d = Tensor::from_vec(&[2, 1], vec![i64::MAX, -3]).unwrap();
    let e = Tensor::from_vec(&[0], Vec::<i32>::new()).unwrap();
    let written = [("a", &a), ("b", &b), ("c", &c), ("d", &d), ("e", &e)];
    let views: Vec<(&str, TensorRef<'_>)> = written.iter().map(|(n, t)| (*n, t.view())).collect();
    write(&path, &views).unwrap();
    let file = Checkpoint::open(&path).unwrap();
    assert_eq!(file.names().collect::<Vec<_>>(), ["a", "b", "c", "d", "e"]);
    for (name, tensor) in written {
        assert_eq!(file.meta(name).unwrap(), TensorMeta::new(tensor.dtype(), tensor.shape()));
        assert_eq!(file.tensor(name).unwrap(), *tensor, "{name}");
        // Borrowed views when aligned: this file's tensors are written largest dtype first by
        // safetensors, so every one is.
        assert_eq!(file.view(name).unwrap().to_tensor(), *tensor, "{name}");
    }
    let borrowed = file.view("a").unwrap().values::<f32>().unwrap().as_ptr() as usize;
    let map = file.map.as_ptr() as usize;
    assert!((map..map + file.map.len()).contains(&borrowed), "the view must point into the mapping");
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn missing_tensors_wrong_shapes_and_dtypes_name_the_tensor() {
    let path = temp("wrong");
    let w = Tensor::zeros(&[4, 8]);
    write(&path, &[("h.0.attn.c_attn.weight", w.view())]).unwrap();
    let file = Checkpoint::open(&path).unwrap();
    let (tensor, detail) = detail_of(file.expect("h.0.attn.c_attn.weight", &TensorMeta::f32(&[8, 4])).unwrap_err());
    assert_eq!(tensor.as_deref(), Some("h.0.attn.c_attn.weight"));
    assert!(detail.contains("[4, 8]") && detail.contains("[8, 4]"), "{detail}");
    let (_, detail) =
        detail_of(file.expect("h.0.attn.c_attn.weight", &TensorMeta::new(DType::BF16, &[4, 8])).unwrap_err());
    assert!(detail.contains("BF16"), "{detail}");
    // A prefixed name that is missing points at the one the file holds.
    let (tensor, detail) = detail_of(file.view("transformer.h.0.attn.c_attn.weight").unwrap_err());
    assert_eq!(tensor.as_deref(), Some("transformer.h.0.attn.c_attn.weight"));
    assert!(detail.contains("\"h.0.attn.c_attn.weight\""), "{detail}");
    assert!(!file.contains("wte.weight"));
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn truncated_empty_and_foreign_files_are_typed_errors() {
    let path = temp("truncated");
    write(&path, &[("x", Tensor::zeros(&[64]).view())]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for cut in [bytes.len() - 1, bytes.len() - 100, 12, 3, 0] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let (tensor, detail) = detail_of(Checkpoint::open(&path).unwrap_err());
        assert_eq!(tensor, None);
        assert!(detail.contains("truncated") || detail.contains("not a valid"), "cut at {cut}: {detail}");
    }
    std::fs::write(&path, b"definitely not a safetensors file").unwrap();
    assert!(Checkpoint::open(&path).is_err());
    std::fs::remove_file(&path).unwrap();
    let (_, detail) = detail_of(Checkpoint::open(&path).unwrap_err());
    assert!(detail.contains("cannot open"), "{detail}");
}

#[test]
fn dtypes_we_do_not_compute_on_and_misaligned_tensors_are_reported() {
    let path = temp("foreign");
    // An f64 tensor and an odd-length u8 one ahead of an f32 one, written by safetensors itself.
    let f64_bytes: Vec<u8> = [1.0f64, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let u8_bytes = vec![1u8, 2, 3];
    let f32_bytes: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = [
        ("a.f64", safetensors::tensor::TensorView::new(Dtype::F64, vec![2], &f64_bytes).unwrap()),
        ("b.u8", safetensors::tensor::TensorView::new(Dtype::U8, vec![3], &u8_bytes).unwrap()),
        ("c.f32", safetensors::tensor::TensorView::new(Dtype::F32, vec![2], &f32_bytes).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let file = Checkpoint::open(&path).unwrap();
    let (tensor, detail) = detail_of(file.meta("a.f64").unwrap_err());
    assert_eq!(tensor.as_deref(), Some("a.f64"));
    assert!(detail.contains("F64"), "{detail}");
    // safetensors orders by alignment then name; whatever the layout, `tensor` always reads it
    // and `view` either borrows the same values or says to use `tensor`.
    assert_eq!(file.tensor("c.f32").unwrap().values::<f32>().unwrap(), &[1.0, 2.0]);
    match file.view("c.f32") {
        Ok(v) => assert_eq!(v.values::<f32>().unwrap(), &[1.0, 2.0]),
        Err(e) => assert!(detail_of(e).1.contains("Checkpoint::tensor")),
    }
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn misaligned_bytes_are_not_borrowed() {
    assert!(typed::<f32>(&[0u8; 7]).is_none());
    let words = [0u32; 4];
    // SAFETY: reading initialised u32s as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, 16) };
    assert_eq!(typed::<f32>(bytes).map(<[f32]>::len), Some(4));
    assert!(typed::<f32>(&bytes[1..13]).is_none());
}

#[test]
fn duplicate_names_are_refused() {
    let x = Tensor::zeros(&[1]);
    let (tensor, _) = detail_of(write(temp("dup"), &[("x", x.view()), ("x", x.view())]).unwrap_err());
    assert_eq!(tensor.as_deref(), Some("x"));
}
