// Turns every description in protocol/api into the registry's table: adding an API
// adds its description there, and nothing here.
fn main() {
    let dir = "../../protocol/api";
    println!("cargo::rerun-if-changed={dir}");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("protocol/api must exist")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "api"))
        .collect();
    paths.sort();
    let mut ids = std::collections::BTreeSet::new();
    let mut s = String::from(
        "// Generated from protocol/api/*.api.\n\n/// Every API description, one per file.\npub static DESCRIPTIONS: &[hira_protocol::api::Description] = &[\n",
    );
    for p in &paths {
        let path = p.to_str().unwrap();
        println!("cargo::rerun-if-changed={path}");
        let api = hira_apigen::Api::load(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            ids.insert(api.header.id),
            "{path}: API number {} is taken by another description",
            api.header.id
        );
        s.push_str(&api.description());
        s.push_str(",\n");
    }
    s.push_str("];\n");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("descriptions.rs");
    std::fs::write(out, s).unwrap();
}
