fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=ring.proto");
    tonic_prost_build::configure().compile_protos(&["ring.proto"], &["."])?;
    Ok(())
}
