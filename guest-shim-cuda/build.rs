// Generates the guest side of every remoted CUDA driver function from the API
// description, and names the library as programs load the driver: libcuda.so.1.
fn main() {
    let spec = "../protocol/api/cuda.api";
    println!("cargo::rerun-if-changed={spec}");
    let api = hira_apigen::Api::load(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let code = api.guest_code().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("cuda_guest.rs");
    std::fs::write(out, code).unwrap();
    println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Entry points handed out by cuGetProcAddress must be this library's own.
    println!("cargo::rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
