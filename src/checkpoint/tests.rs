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

/// A header whose tensors end past the file is refused before the safetensors reader adds their
/// end to the header's length: eight chained tensors of 2^61 - 1 bytes made that sum wrap (a
/// panic where overflow checks are on, as in `cargo test`).
#[test]
fn offsets_past_the_file_are_refused() {
    let path = temp("past-the-file");
    let size = (1u64 << 61) - 1;
    let tensors: Vec<String> = (0..8u64)
        .map(|i| {
            format!(r#""t{i}":{{"dtype":"U8","shape":[{size}],"data_offsets":[{},{}]}}"#, i * size, (i + 1) * size)
        })
        .collect();
    let header = format!("{{{}}}", tensors.join(","));
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let (tensor, detail) = detail_of(Checkpoint::open(&path).unwrap_err());
    assert_eq!(tensor, None);
    assert!(detail.contains("past the end of the file"), "{detail}");
    std::fs::remove_file(&path).unwrap();
}

/// A view built field by field that does not fill its shape is refused by `write`, naming it.
#[test]
fn write_refuses_a_view_that_does_not_fill_its_shape() {
    let path = temp("short-view");
    let values = [1.0f32; 5];
    let short = TensorRef { shape: &[2, 3], data: Data::F32(&values) };
    let (tensor, detail) = detail_of(write(&path, &[("x", Tensor::zeros(&[2]).view()), ("short", short)]).unwrap_err());
    assert_eq!(tensor.as_deref(), Some("short"));
    assert!(detail.contains("needs 6 elements, but 5 were given"), "{detail}");
    assert!(!path.exists(), "nothing was written");
}

/// A tensor the host cannot hold (2 TiB, in a sparse file) is `Error::OutOfMemory`, not an
/// abort. Needs the kernel's heuristic overcommit (the default), which refuses an allocation
/// far past the machine's memory; otherwise the test says why it is skipped.
#[test]
fn a_tensor_too_large_for_the_host_is_out_of_memory() {
    let policy = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if policy.trim() != "0" {
        eprintln!(
            "SKIPPED a_tensor_too_large_for_the_host_is_out_of_memory: vm.overcommit_memory is {policy:?}, not 0"
        );
        return;
    }
    let path = temp("sparse");
    let bytes = 1u64 << 41;
    let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{bytes}]}}}}"#, bytes / 4);
    let mut head = (header.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(header.as_bytes());
    let file = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut &file, &head).unwrap();
    if let Err(e) = file.set_len(head.len() as u64 + bytes) {
        eprintln!("SKIPPED a_tensor_too_large_for_the_host_is_out_of_memory: no sparse file of 2 TiB here ({e})");
        std::fs::remove_file(&path).unwrap();
        return;
    }
    let checkpoint = Checkpoint::open(&path).unwrap();
    let err = checkpoint.tensor("w").unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    drop(checkpoint);
    std::fs::remove_file(&path).unwrap();
}
