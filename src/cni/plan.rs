//! A container's ADD as a plan: everything the engine carries out for it.
