// Derives the opcode table from the declarative API description.
fn main() {
    let spec = "../../protocol/api/opencl.api";
    println!("cargo::rerun-if-changed={spec}");
    let api = hira_apigen::Api::load(spec).expect("the OpenCL API description must parse");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("opencl_ops.rs");
    std::fs::write(out, api.opcode_table()).unwrap();
}
