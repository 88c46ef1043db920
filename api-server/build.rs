// Generates the API server's dispatch of every remoted function of each API.
fn main() {
    for (spec, out) in [
        ("../protocol/api/opencl.api", "opencl_server.rs"),
        ("../protocol/api/cuda.api", "cuda_server.rs"),
    ] {
        println!("cargo::rerun-if-changed={spec}");
        let api = hira_apigen::Api::load(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let code = api.server_code().unwrap_or_else(|e| panic!("{spec}: {e}"));
        let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join(out);
        std::fs::write(out, code).unwrap();
    }
}
