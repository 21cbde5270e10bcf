//! The vipd binary links no glibc symbol that only recent glibc has where an older one does
//! the same: `mallinfo2` (glibc 2.33) would stop vipd building on the hosts of RHEL 8 or
//! Debian 11, whose glibc lacks it (`mallinfo` gives the heap's free bytes there too).

#[test]
fn the_binary_imports_no_mallinfo2() {
    let vipd = std::fs::read(env!("CARGO_BIN_EXE_vipd")).expect("the vipd binary");
    let name = b"\0mallinfo2\0";
    assert!(
        !vipd.windows(name.len()).any(|w| w == name),
        "vipd references mallinfo2 (glibc 2.33 or later)"
    );
}
