// Generates the guest side of every remoted OpenCL function from the API description.
fn main() {
    let spec = "../protocol/api/opencl.api";
    println!("cargo::rerun-if-changed={spec}");
    let api = hira_apigen::Api::load(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let mut code = api.guest_code().unwrap_or_else(|e| panic!("{spec}: {e}"));
    code.push_str(&api.dispatch_fill());
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("opencl_guest.rs");
    std::fs::write(out, code).unwrap();
    // The shim exports the entry points the ICD loader also exports
    // (`clGetExtensionFunctionAddressForPlatform`, `clIcdGetPlatformIDsKHR`, ...): its
    // own dispatch table and the addresses it hands out must bind to its own
    // definitions, not be interposed by the loader's (which dispatch back here; a
    // tail call made that an endless loop), as vendor ICDs link.
    println!("cargo::rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
