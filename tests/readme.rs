//! The README's Rust example compiles and runs as a user of `idem` writes it. The README
//! holds one example, a whole program (`fn main` included), so it needs no context: each
//! ```rust block is written to a file as it is and must build and exit successfully
//! (trybuild's `pass`). A block that is not a whole program fails this test, as does a
//! README with no example at all; the rest of the documentation is the guide
//! (`src/guide/`), whose examples are doctests.
#![cfg(feature = "testing")]

use std::path::PathBuf;

fn rust_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```rust") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn readme_examples_compile_and_run() {
    let readme = include_str!("../README.md");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("readme");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = trybuild::TestCases::new();
    let blocks = rust_blocks(readme);
    for (i, block) in blocks.iter().enumerate() {
        assert!(
            block.contains("fn main"),
            "README block {i} is not a whole program: the README's examples are \
             self-contained (fragments belong in the guide, src/guide/):\n{block}"
        );
        let path = dir.join(format!("block_{i}.rs"));
        std::fs::write(&path, block).unwrap();
        cases.pass(&path);
    }
    assert_eq!(blocks.len(), 1, "the README's one example");
}
