//! Carrying out a [`crate::cni::plan`]: the steps of one ADD.
