//! Doubles of third-party CNI plugins (placeholder).
fn main() {}
