//! Model weights in and tensors out: safetensors files, the format Hugging Face checkpoints
//! ship in.
//!
//! [`Checkpoint::open`] maps a file into memory (it is not read), checks its header, and lends
//! each tensor as a [`TensorRef`] borrowed from the mapping: an upload
//! ([`crate::DeviceTensor::upload`]) copies it straight from the page cache to the device, with
//! no host copy in between. [`Checkpoint::expect`] checks a tensor's dtype and shape against
//! what the model needs, so a checkpoint of another model fails with an error naming the tensor
//! rather than later in a kernel. [`write()`] writes tensors to a file that PyTorch's
//! `safetensors.torch.load_file` reads.
//!
//! ```
//! use boundscope::checkpoint::{self, Checkpoint};
//! use boundscope::{DType, Tensor, TensorMeta};
//! let path = std::env::temp_dir().join(format!("boundscope-doc-{}.safetensors", std::process::id()));
//! let weight = Tensor::new(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! let ids = Tensor::from_vec(&[4], vec![7i64, 0, 2, 1]).unwrap();
//! checkpoint::write(&path, &[("fc.weight", weight.view()), ("ids", ids.view())]).unwrap();
//!
//! let file = Checkpoint::open(&path).unwrap();
//! let w = file.expect("fc.weight", &TensorMeta::f32(&[2, 3])).unwrap(); // borrowed from the map
//! assert_eq!(w.values::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
//! assert_eq!(file.meta("ids").unwrap().dtype, DType::I64);
//! // A tensor of another shape, or one the file lacks, is an error that names it.
//! let wrong = file.expect("fc.weight", &TensorMeta::f32(&[3, 2])).unwrap_err();
//! assert!(wrong.to_string().contains("`fc.weight`"), "{wrong}");
//! assert!(file.view("fc.bias").unwrap_err().to_string().contains("`fc.bias`"));
//! # drop(file);
//! # std::fs::remove_file(&path).unwrap();
//! ```

use std::borrow::Cow;
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};

use crate::core::ir::{DType, TensorMeta};
use crate::core::tensor::{Data, Element, Tensor, TensorRef};
use crate::error::{Error, Result};

/// A safetensors file mapped into memory: its tensors' names, dtypes and shapes, and their
/// values borrowed from the mapping.
///
/// The mapping is read-only; the file must not be changed by another program while the
/// checkpoint is open (as with every memory-mapped file).
pub struct Checkpoint {
    path: String,
    map: memmap2::Mmap,
    entries: Vec<Entry>,
}

struct Entry {
    name: String,
    dtype: std::result::Result<DType, Dtype>,
    shape: Vec<usize>,
    /// Where its bytes lie in the mapping.
    start: usize,
    end: usize,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint").field("path", &self.path).field("tensors", &self.entries.len()).finish()
    }
}

fn dtype_of(dtype: Dtype) -> std::result::Result<DType, Dtype> {
    match dtype {
        Dtype::F32 => Ok(DType::F32),
        Dtype::BF16 => Ok(DType::BF16),
        Dtype::F16 => Ok(DType::F16),
        Dtype::I64 => Ok(DType::I64),
        Dtype::I32 => Ok(DType::I32),
        other => Err(other),
    }
}

fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
    }
}

/// The headers `read_metadata` reads at most (safetensors' own limit): a longer one is left to
/// it to refuse, unparsed here.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A header entry, for its byte range only (`__metadata__` has none); other fields are skipped
/// without being kept.
#[derive(serde::Deserialize)]
struct ByteRange {
    #[serde(default)]
    data_offsets: Option<(u64, u64)>,
}

/// Why the header of the safetensors file `bytes` names a tensor that ends past the file (or
/// ends before it starts), if it does; `None` for any other header, which `read_metadata`
/// judges.
fn offsets_past_the_file(bytes: &[u8]) -> Option<String> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    if len > MAX_HEADER_BYTES {
        return None;
    }
    let header = bytes.get(8..8usize.checked_add(usize::try_from(len).ok()?)?)?;
    let header: std::collections::HashMap<String, ByteRange> = serde_json::from_slice(header).ok()?;
    header.iter().find_map(|(name, entry)| {
        let (start, end) = entry.data_offsets?;
        (end < start || end > bytes.len() as u64).then(|| {
            format!(
                "the header puts tensor `{name}` at bytes {start}..{end}, past the end of the file (a truncated or \
                 corrupt file?); write it again"
            )
        })
    })
}

fn header_problem(e: &SafeTensorError) -> String {
    match e {
        SafeTensorError::MetadataIncompleteBuffer => {
            "its body is shorter or longer than its header says (a truncated or partly written file?); \
             write it again"
                .to_string()
        }
        SafeTensorError::InvalidOffset(tensor) => format!(
            "the header's offsets of tensor `{tensor}` do not follow the previous tensor's (a corrupt header?); \
             write the file again"
        ),
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's byte range in the header does not match its dtype and shape (a corrupt header?); write the \
             file again"
                .to_string()
        }
        SafeTensorError::HeaderTooSmall | SafeTensorError::InvalidHeaderLength => {
            "it is too short to hold a safetensors header (an empty or truncated file?)".to_string()
        }
        other => format!("it is not a valid safetensors file ({other})"),
    }
}

impl Checkpoint {
    /// Maps the file at `path` and reads its header.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] if the file cannot be opened or mapped, or is not a complete
    /// safetensors file (a truncated body included).
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path_ref = path.as_ref();
        let path = path_ref.display().to_string();
        let fail = |detail: String| Error::Checkpoint { path: path.clone(), tensor: None, detail };
        let file = std::fs::File::open(path_ref).map_err(|e| fail(format!("cannot open it: {e}")))?;
        // SAFETY: the map is read-only and lives as long as the checkpoint; as documented on
        // `Checkpoint`, the file must not be modified while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| fail(format!("cannot map it: {e}")))?;
        // `read_metadata` checks that the offsets cover the body exactly; the body follows the
        // 8-byte length and the header. It adds the offsets' end to the header's length
        // unchecked (a panic in builds with overflow checks, where a crafted header makes it
        // wrap): offsets past the file are refused first.
        if let Some(detail) = offsets_past_the_file(&map) {
            return Err(fail(detail));
        }
        let (header_len, header) = SafeTensors::read_metadata(&map).map_err(|e| fail(header_problem(&e)))?;
        let body = 8 + header_len;
        let mut entries: Vec<Entry> = header
            .tensors()
            .into_iter()
            .map(|(name, info)| Entry {
                dtype: dtype_of(info.dtype),
                shape: info.shape.clone(),
                start: body + info.data_offsets.0,
                end: body + info.data_offsets.1,
                name,
            })
            .collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Checkpoint { path, map, entries })
    }

    /// The file's path, as given to [`Checkpoint::open`].
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The names of its tensors, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// Whether it holds a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.entry(name).is_ok()
    }

    fn error(&self, name: &str, detail: String) -> Error {
        Error::Checkpoint { path: self.path.clone(), tensor: Some(name.to_string()), detail }
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        match self.entries.binary_search_by(|e| e.name.as_str().cmp(name)) {
            Ok(i) => Ok(&self.entries[i]),
            Err(_) => {
                let near: Vec<&str> = self.names().filter(|n| n.ends_with(name) || name.ends_with(n)).take(3).collect();
                let hint = if near.is_empty() {
                    format!("the file holds {} tensors, none of this name", self.entries.len())
                } else {
                    format!("the file has no tensor of this name; it does hold {near:?}")
                };
                Err(self.error(name, hint))
            }
        }
    }

    fn entry_meta(&self, entry: &Entry) -> Result<TensorMeta> {
        match entry.dtype {
            Ok(dtype) => Ok(TensorMeta::new(dtype, &entry.shape)),
            Err(other) => Err(self.error(
                &entry.name,
                format!("its dtype {other:?} is not one boundscope computes on (f32, bf16, f16, i64, i32); convert it"),
            )),
        }
    }

    /// The dtype and shape of tensor `name`.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] naming the tensor if the file lacks it or its dtype is not one of
    /// [`DType`]'s.
    pub fn meta(&self, name: &str) -> Result<TensorMeta> {
        self.entry_meta(self.entry(name)?)
    }

    /// Tensor `name`, borrowed from the mapping (no copy).
    ///
    /// # Errors
    /// As [`Checkpoint::meta`], and if its bytes are not aligned for its dtype in the file
    /// (safetensors does not promise alignment when dtypes of several sizes are mixed): then
    /// [`Checkpoint::tensor`] reads a copy.
    pub fn view(&self, name: &str) -> Result<TensorRef<'_>> {
        let entry = self.entry(name)?;
        let meta = self.entry_meta(entry)?;
        let bytes = &self.map[entry.start..entry.end];
        let data = match meta.dtype {
            DType::F32 => typed::<f32>(bytes).map(Data::F32),
            DType::BF16 => typed::<bf16>(bytes).map(Data::BF16),
            DType::F16 => typed::<f16>(bytes).map(Data::F16),
            DType::I64 => typed::<i64>(bytes).map(Data::I64),
            DType::I32 => typed::<i32>(bytes).map(Data::I32),
        };
        let data = data.ok_or_else(|| {
            self.error(
                name,
                format!(
                    "its bytes are not aligned to {} in the file, so it cannot be borrowed; read a copy with \
                     `Checkpoint::tensor`",
                    meta.dtype.size_bytes()
                ),
            )
        })?;
        TensorRef::new(&entry.shape, data).map_err(|e| self.error(name, e.to_string()))
    }

    /// Tensor `name`, checked to have `meta`'s dtype and shape, borrowed from the mapping.
    ///
    /// # Errors
    /// As [`Checkpoint::view`], and [`Error::Checkpoint`] naming the tensor, what it is and
    /// what was expected if its dtype or shape differ.
    pub fn expect(&self, name: &str, meta: &TensorMeta) -> Result<TensorRef<'_>> {
        let found = self.meta(name)?;
        if found.dtype != meta.dtype || found.shape != meta.shape {
            return Err(self.error(
                name,
                format!(
                    "it is {:?} {:?}, but {:?} {:?} is expected (a checkpoint of another model or configuration?)",
                    found.dtype, found.shape, meta.dtype, meta.shape
                ),
            ));
        }
        self.view(name)
    }

    /// Tensor `name` copied into a host tensor (works whatever the alignment).
    ///
    /// # Errors
    /// As [`Checkpoint::meta`].
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let entry = self.entry(name)?;
        let meta = self.entry_meta(entry)?;
        let bytes = &self.map[entry.start..entry.end];
        let tensor = match meta.dtype {
            DType::F32 => Tensor::from_vec(&entry.shape, decode(entry, bytes, f32::from_le_bytes)?),
            DType::BF16 => {
                Tensor::from_vec(&entry.shape, decode(entry, bytes, |b| bf16::from_bits(u16::from_le_bytes(b)))?)
            }
            DType::F16 => {
                Tensor::from_vec(&entry.shape, decode(entry, bytes, |b| f16::from_bits(u16::from_le_bytes(b)))?)
            }
            DType::I64 => Tensor::from_vec(&entry.shape, decode(entry, bytes, i64::from_le_bytes)?),
            DType::I32 => Tensor::from_vec(&entry.shape, decode(entry, bytes, i32::from_le_bytes)?),
        };
        tensor.map_err(|e| self.error(name, e.to_string()))
    }
}

/// `bytes` as a slice of `T`, if they are aligned for it (little-endian machines only, as the
/// format is little-endian; boundscope's hosts are).
fn typed<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    #[cfg(target_endian = "big")]
    compile_error!("safetensors files are little-endian; checkpoint borrowing assumes a little-endian host");
    // SAFETY: `Element` is sealed to f32, bf16, f16, i64 and i32: plain data for which every
    // bit pattern is a value, so reinterpreting aligned bytes as them is sound.
    let (head, body, tail) = unsafe { bytes.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(body)
}

/// The values of `entry`, its `bytes` decoded `N` at a time.
///
/// # Errors
/// [`Error::OutOfMemory`] where the host cannot allocate them (a tensor of terabytes, as a
/// sparse file can declare), rather than an abort.
fn decode<T, const N: usize>(entry: &Entry, bytes: &[u8], from: impl Fn([u8; N]) -> T) -> Result<Vec<T>> {
    let mut values = Vec::new();
    values.try_reserve_exact(bytes.len() / N).map_err(|_| Error::OutOfMemory {
        what: format!("checkpoint tensor `{}`", entry.name),
        shape: entry.shape.clone(),
        bytes: bytes.len(),
    })?;
    values.extend(bytes.chunks_exact(N).map(|c| from(c.try_into().expect("chunks_exact yields N bytes"))));
    Ok(values)
}

/// One tensor for [`write()`]: its dtype, shape and little-endian bytes.
struct Encoded<'t> {
    dtype: Dtype,
    shape: &'t [usize],
    bytes: Vec<u8>,
}

impl View for &Encoded<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn encode(data: Data<'_>) -> Vec<u8> {
    match data {
        Data::F32(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Data::BF16(x) => x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
        Data::F16(x) => x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
        Data::I64(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Data::I32(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Writes `tensors` (name, values) to a safetensors file at `path`, replacing it.
///
/// # Errors
/// [`Error::Checkpoint`] if two tensors share a name or the file cannot be written.
pub fn write(path: impl AsRef<Path>, tensors: &[(&str, TensorRef<'_>)]) -> Result<()> {
    let path_ref = path.as_ref();
    let fail = |tensor: Option<&str>, detail: String| Error::Checkpoint {
        path: path_ref.display().to_string(),
        tensor: tensor.map(str::to_string),
        detail,
    };
    // A view built field by field may not fill its shape.
    for (name, t) in tensors {
        crate::core::tensor::holds(t.shape, t.data.len()).map_err(|e| {
            fail(Some(name), format!("{e}; give it values that fill its shape (`TensorRef::new` checks them)"))
        })?;
    }
    let mut names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(fail(Some(w[0]), "two tensors have this name; give each its own".into()));
    }
    let encoded: Vec<(&str, Encoded<'_>)> = tensors
        .iter()
        .map(|(name, t)| (*name, Encoded { dtype: file_dtype(t.dtype()), shape: t.shape, bytes: encode(t.data) }))
        .collect();
    let metadata = Some([("format".to_string(), "pt".to_string())].into_iter().collect());
    safetensors::serialize_to_file(encoded.iter().map(|(n, e)| (*n, e)), metadata, path_ref)
        .map_err(|e| fail(None, format!("cannot write it: {e}")))
}

#[cfg(test)]
mod tests;
