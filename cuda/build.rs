// Generates the guest side of every remoted CUDA driver function from the API
// description, a CUDA_ERROR_NOT_SUPPORTED function for every other entry point of the
// driver API (driver-api.txt, from cuda.h), and names the library as programs load
// the driver: libcuda.so.1.
fn main() {
    let spec = "../protocol/api/cuda.api";
    let list = "driver-api.txt";
    println!("cargo::rerun-if-changed={spec}");
    println!("cargo::rerun-if-changed={list}");
    let api = hira_apigen::Api::load(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let mut code = api.guest_code().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let names = std::fs::read_to_string(list).unwrap_or_else(|e| panic!("{list}: {e}"));
    code.push_str(
        &hira_apigen::cuda::unsupported_stubs(
            &api.funcs,
            &names,
            &["cuGetProcAddress", "cuGetExportTable"],
        )
        .unwrap_or_else(|e| panic!("{spec}: {e}")),
    );
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("cuda_guest.rs");
    std::fs::write(out, code).unwrap();
    println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    // Entry points handed out by cuGetProcAddress must be this library's own.
    println!("cargo::rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
