// The library answers to the name programs and cudarc load: libcuda.so.1.
fn main() {
    println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
