//! docs/operators.md carries the option table generated from the clap/option definitions
//! (`vipd::cmd::manifest::docs`); this test fails when it drifts. `UPDATE_GOLDEN=1` rewrites it.

use vipd::cmd::manifest::docs;

#[test]
fn operator_docs_option_table_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operators.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let want = docs::splice_options(&text).expect("option markers in docs/operators.md");
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    assert!(
        text == want,
        "docs/operators.md option table is stale: UPDATE_GOLDEN=1 cargo test --test manifest_docs"
    );
    for o in vipd::config::env_names() {
        assert!(text.contains(&format!("`{}`", o.env)), "{} missing", o.env);
    }
}
