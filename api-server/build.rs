// Generates the API server's dispatch of every remoted OpenCL function.
fn main() {
    let spec = "../protocol/api/opencl.api";
    println!("cargo::rerun-if-changed={spec}");
    let api = hira_apigen::Api::load(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let code = api.server_code().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("opencl_server.rs");
    std::fs::write(out, code).unwrap();
}
