//! Variants of the generated kernels that are being measured: each is chosen by a developer
//! option (`cuda.*`, set through [`Options::set_developer`]) and is off by default until the
//! H200 shows it faster on the sweep (`examples/gpu_sweep.rs --variants`, which times every
//! variant beside the defaults, case by case, in one run) and on GPT-2. A plan run with one lists
//! it in its header. Both executors that generate kernels, `CudaFusion` and `CudaOps`, take
//! them (`with_variants`, or `from_options`); the front end configures them from its options.
//!
//! ```
//! use boundscope::executors::cuda::KernelVariants;
//! use boundscope::options::Options;
//!
//! let mut options = Options::new();
//! assert_eq!(KernelVariants::from_options(&options)?, KernelVariants::default());
//! // Developer options: the user API refuses them, and says how to opt in.
//! assert!(options.set("cuda.fast_exp2", true).is_err());
//! options.set_developer("cuda.fast_exp2", true)?;
//! let variants = KernelVariants::from_options(&options)?;
//! assert!(variants.fast_exp2 && !variants.int32_row_columns);
//! # Ok::<(), boundscope::Error>(())
//! ```

use crate::error::Result;
use crate::options::{Audience, OptionSpec, OptionType, OptionValue, Options};

/// Which variant of each generated kernel to emit (all off: the kernels measured in the README).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KernelVariants {
    /// `softmax`, `sigmoid` and `gelu` with 16-bit results take PTX's `ex2.approx.ftz.f32`, one
    /// instruction, where `exp2f` takes four (three of them scale results below 2^-126, and
    /// issue though predicated off). Nothing is lost to the flush: sums and `1 + e`
    /// denominators each hold a 1, f16's least value is 2^-24, and bf16 `softmax` takes its
    /// results as `ex2(y + 8) * 2^-8`, so that one that rounds to a bf16 value (down to 2^-133)
    /// never flushes. `ptxas` (sm_90): 16-bit `softmax` kernels have up to 28% fewer
    /// instructions (bf16 rows of 65,536 kept as read: 1,536 -> 1,224).
    pub fast_exp2: bool,
    /// Row kernels (`softmax`, `layer_norm`) count their columns in 32 bits for rows under
    /// 2^30 values: a bounds test is one comparison rather than two, and no 64-bit multiplies.
    /// `ptxas`: up to 30% fewer instructions over rows of odd lengths (16-bit `layer_norm` over
    /// rows of 1,001: 2,000 -> 1,544), about the same where 16 bytes divide the row; three f32
    /// `layer_norm` kernels over streamed rows grow (464 -> 640 over rows of 65,536).
    pub int32_row_columns: bool,
    /// Row kernels that keep their row on chip (read once, written once) read and write it with
    /// the streaming cache hints (`__ldcs`, `__stcs`: evicted first), as fused elementwise
    /// regions do (96-103% of a copy's speed with them over 2^28 values, measured), and fused
    /// regions ending in a last-axis `sum` or `max` read the inputs they read whole so: L2 is
    /// left to what is read again (`layer_norm`'s weight and bias, broadcast operands). Rows
    /// streamed in several passes keep plain loads, their later passes reading from L2.
    pub streaming_rows: bool,
}

/// The developer options of the CUDA executors: which [`KernelVariants`] they generate.
pub const CUDA_OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "cuda.fast_exp2",
        ty: OptionType::Bool,
        default: OptionValue::Bool(false),
        doc: "16-bit softmax, sigmoid and gelu take the one-instruction ex2.approx.ftz (KernelVariants::fast_exp2).",
        audience: Audience::Developer,
        env: None,
    },
    OptionSpec {
        name: "cuda.int32_row_columns",
        ty: OptionType::Bool,
        default: OptionValue::Bool(false),
        doc: "Row kernels count columns in 32 bits for rows under 2^30 values (KernelVariants::int32_row_columns).",
        audience: Audience::Developer,
        env: None,
    },
    OptionSpec {
        name: "cuda.streaming_rows",
        ty: OptionType::Bool,
        default: OptionValue::Bool(false),
        doc: "Row kernels and fused reductions read rows read once, and row kernels write results, with streaming cache hints (KernelVariants::streaming_rows).",
        audience: Audience::Developer,
        env: None,
    },
];

impl KernelVariants {
    /// Every variant on.
    pub const ALL: Self = Self { fast_exp2: true, int32_row_columns: true, streaming_rows: true };

    /// Each variant alone, with its name (its option's, past `cuda.`).
    pub const EACH: [(&'static str, Self); 3] = [
        ("fast_exp2", Self { fast_exp2: true, int32_row_columns: false, streaming_rows: false }),
        ("int32_row_columns", Self { fast_exp2: false, int32_row_columns: true, streaming_rows: false }),
        ("streaming_rows", Self { fast_exp2: false, int32_row_columns: false, streaming_rows: true }),
    ];

    /// The variants `options` choose (`cuda.*`).
    ///
    /// # Errors
    /// [`Error::UnknownOption`](crate::Error::UnknownOption) if `options` lack the CUDA
    /// executors' specs ([`CUDA_OPTIONS`]: [`Options::new`] has them).
    pub fn from_options(options: &Options) -> Result<Self> {
        Ok(Self {
            fast_exp2: options.bool("cuda.fast_exp2")?,
            int32_row_columns: options.bool("cuda.int32_row_columns")?,
            streaming_rows: options.bool("cuda.streaming_rows")?,
        })
    }

    /// Each option of [`CUDA_OPTIONS`] with the value that gives these variants (for
    /// [`Executor::configured_options`](crate::Executor::configured_options)).
    pub fn configured(&self) -> Vec<(&'static str, OptionValue)> {
        vec![
            ("cuda.fast_exp2", OptionValue::Bool(self.fast_exp2)),
            ("cuda.int32_row_columns", OptionValue::Bool(self.int32_row_columns)),
            ("cuda.streaming_rows", OptionValue::Bool(self.streaming_rows)),
        ]
    }
}

/// The variants either side has on.
///
/// ```
/// use boundscope::executors::cuda::KernelVariants;
/// let [(_, a), (_, b), (_, c)] = KernelVariants::EACH;
/// assert_eq!(a | b | c, KernelVariants::ALL);
/// ```
impl std::ops::BitOr for KernelVariants {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        Self {
            fast_exp2: self.fast_exp2 || other.fast_exp2,
            int32_row_columns: self.int32_row_columns || other.int32_row_columns,
            streaming_rows: self.streaming_rows || other.streaming_rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_round_trips_and_defaults_to_the_measured_kernels() {
        let options = Options::with_specs(CUDA_OPTIONS);
        assert_eq!(KernelVariants::from_options(&options).unwrap(), KernelVariants::default());
        let configured = KernelVariants::ALL.configured();
        assert_eq!(configured.len(), CUDA_OPTIONS.len(), "every spec is configured");
        let mut options = Options::with_specs(CUDA_OPTIONS);
        for (spec, (name, value)) in CUDA_OPTIONS.iter().zip(&configured) {
            assert_eq!(spec.name, *name);
            assert_eq!(spec.audience, Audience::Developer, "{name} is for developers");
            options.set_developer(name, value.clone()).unwrap();
        }
        assert_eq!(KernelVariants::from_options(&options).unwrap(), KernelVariants::ALL);
        assert!(matches!(
            KernelVariants::from_options(&Options::runtime_only()),
            Err(crate::Error::UnknownOption { .. })
        ));
        // `EACH` names each option once, with its one variant on.
        for ((name, variants), spec) in KernelVariants::EACH.iter().zip(CUDA_OPTIONS) {
            assert_eq!(format!("cuda.{name}"), spec.name);
            let on: Vec<_> = variants.configured().into_iter().filter(|(_, v)| *v == OptionValue::Bool(true)).collect();
            assert_eq!(on, [(spec.name, OptionValue::Bool(true))]);
        }
        assert_eq!(KernelVariants::EACH.len(), CUDA_OPTIONS.len());
    }
}
