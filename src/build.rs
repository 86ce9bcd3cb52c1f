//! Compiles the C side of NVTX's payload extension (`src/core/guards/nvtx_payload/shim.c`),
//! which is header-only and so cannot come from `nvtx-sys`.

fn main() {
    let dir = "src/core/guards/nvtx_payload";
    println!("cargo:rerun-if-changed={dir}");
    cc::Build::new()
        .include(format!("{dir}/include"))
        .file(format!("{dir}/shim.c"))
        .opt_level(2)
        .warnings(true)
        .compile("boundscope_nvtx_payload");
}
