//! Compiles the test of the recorded PyTorch snapshot only when that fixture is in the tree
//! (`fixtures/torch_snapshot.pickle` and its `.stats.json`, recorded on a GPU machine by
//! `fixtures/make_torch_snapshot.py`); the test embeds both files, so its binary runs anywhere.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(torch_fixture)");
    println!("cargo::rerun-if-changed=fixtures");
    let dir = std::path::Path::new("fixtures");
    if dir.join("torch_snapshot.pickle").is_file() && dir.join("torch_snapshot.stats.json").is_file() {
        println!("cargo::rustc-cfg=torch_fixture");
    }
}
