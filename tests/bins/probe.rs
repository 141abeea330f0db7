//! A CNI plugin that records the environment it runs in (placeholder).
fn main() {}
