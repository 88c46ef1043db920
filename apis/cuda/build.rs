// Derives the opcode table from the declarative API description.
fn main() {
    let spec = "../../protocol/api/cuda.api";
    println!("cargo::rerun-if-changed={spec}");
    let api = hira_apigen::Api::load(spec).expect("the CUDA API description must parse");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("cuda_ops.rs");
    std::fs::write(out, api.opcode_table()).unwrap();
}
